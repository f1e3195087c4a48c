// The queue: jobs with their reason sentences (paginated: PAGE_SIZE a page, however long the
// queue), filters, and each partition's fair-share table (who is served next).

import { get } from "./api.js";
import { empty, fmtAgo, fmtNum, h, jobLink, stateBadge, table } from "./dom.js";

const PAGE_SIZE = 100;
const STATES = {
  pending: ["pending"],
  active: ["starting", "running", "stopping"],
  ended: ["done", "failed", "cancelled", "reclaimed", "rejected"],
};
const filters = { state: "pending", partition: "", queue: "", tenant: "", class: "", offset: 0 };

function select(name, label, options) {
  const el = h("select", { name, "data-filter": name },
    options.map(([v, text]) => h("option", { value: v, text })));
  el.value = filters[name];
  return h("label", { class: "filter" }, h("span", { text: label }), el);
}

function jobRows(jobs, now, who) {
  return jobs.map((j) => h("tr", { "data-job": j.id, "data-tenant": j.tenant },
    h("td", null, jobLink(j.id)),
    h("td", { text: j.name ?? "" }),
    who.admin ? h("td", { text: j.tenant }) : null,
    h("td", { text: j.queue }),
    h("td", { text: j.partition }),
    h("td", { text: j.class }),
    h("td", { text: j.gpus }),
    h("td", null, stateBadge(j.state)),
    h("td", { class: "num", text: fmtAgo(j.submitted_at, now) }),
    h("td", { class: "reason", text: j.pending ? j.pending.message : (j.message || j.reason || "") })));
}

function fairShare(tables, partition) {
  const names = Object.keys(tables).filter((p) => !partition || p === partition)
    .filter((p) => tables[p].length);
  if (!names.length) return empty("no queues");
  return h("div", { class: "fairshare" }, names.map((p) => h("div", { class: "fs-part" },
    h("h3", { text: `${p}` }),
    table(["rank", "queue", "tenant", "weight", "GPUs held", "usage (GPU·h)", "share", "why"],
      tables[p].slice().sort((a, b) => a.rank - b.rank).map((t) => h("tr", { "data-queue": t.queue },
        h("td", { class: "num", text: t.rank }),
        h("td", { text: t.queue }),
        h("td", { text: t.tenant }),
        h("td", { class: "num", text: fmtNum(t.weight) }),
        h("td", { class: "num", text: fmtNum(t.holding_gpus) }),
        h("td", { class: "num", text: fmtNum(t.decayed_usage_gpu_h, 2) }),
        h("td", { class: "num", text: fmtNum(t.share, 3) }),
        h("td", { class: "reason", text: t.explanation })))))));
}

export function queuePage(root, { who }) {
  const tenants = who.tenants ?? [];
  const bar = h("form", { class: "filters" },
    select("state", "state", [["pending", "pending"], ["active", "running"], ["ended", "ended"]]),
    select("partition", "partition", [["", "all"], ...who.partitions.map((p) => [p, p])]),
    select("queue", "queue", [["", "all"], ...who.queues.map((q) => [q, q])]),
    who.admin ? select("tenant", "tenant", [["", "all"], ...tenants.map((t) => [t, t])]) : null,
    select("class", "class", [["", "all"], ...["training", "serving", "interactive", "batch"].map((c) => [c, c])]));
  const pager = h("div", { class: "pager" });
  const list = h("div", { class: "joblist" });
  const fs = h("div");
  root.append(h("h2", { text: "Queue" }), bar, pager, list,
    h("h2", { text: "Fair share: who is served next" }), fs);
  let refreshNow = null;
  bar.addEventListener("change", (ev) => {
    const name = ev.target.dataset.filter;
    if (!name) return;
    filters[name] = ev.target.value;
    filters.offset = 0;
    refreshNow?.();
  });
  bar.addEventListener("submit", (ev) => ev.preventDefault());
  const move = (delta) => { filters.offset = Math.max(0, filters.offset + delta); refreshNow?.(); };

  async function refresh() {
    const q = {
      state: STATES[filters.state], partition: filters.partition, queue: filters.queue,
      tenant: filters.tenant, class: filters.class, offset: filters.offset, limit: PAGE_SIZE,
    };
    // the fair-share tables are drawn when they come: the job list does not wait for them
    get("/v1/dashboard/fairshare").then((x) => {
      fs.replaceChildren(fairShare(x.partitions, filters.partition));
    }, (e) => console.warn("gpufence dashboard:", e.message));
    const page = await get("/v1/dashboard/queue", q);
    if (page.total && filters.offset >= page.total) {
      filters.offset = Math.floor((page.total - 1) / PAGE_SIZE) * PAGE_SIZE;
    }
    const now = Date.now() / 1000;
    const first = page.total ? page.offset + 1 : 0;
    const lastN = page.offset + page.jobs.length;
    pager.replaceChildren(
      h("span", { class: "count", "data-total": page.total,
        text: `${first}–${lastN} of ${page.total.toLocaleString()} ${filters.state} jobs` }),
      h("button", { type: "button", disabled: page.offset === 0, onclick: () => move(-PAGE_SIZE), text: "‹ previous" }),
      h("button", { type: "button", disabled: lastN >= page.total, onclick: () => move(PAGE_SIZE), text: "next ›" }));
    const headers = ["job", "name", who.admin ? "tenant" : null, "queue", "partition", "class",
      "GPUs", "state", "waiting", "why"].filter((x) => x !== null);
    list.replaceChildren(page.jobs.length
      ? table(headers, jobRows(page.jobs, now, who), { class: "grid jobs" })
      : empty(`no ${filters.state} jobs`));
    return undefined;  // not the fair-share promise: the list alone is the paint
  }
  return {
    async refresh() {
      refreshNow = () => refresh().catch((e) => console.warn("gpufence dashboard:", e.message));
      await refresh();  // resolves once the list is drawn; the fair share follows on its own
    },
  };
}
