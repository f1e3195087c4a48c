// A job: its timeline (submitted, bound, notices, acks, stops, requeues, exits) on one axis,
// its attempts, the tail of its logs and the scheduler's explanation.

import { get, getRaw } from "./api.js";
import { empty, fmtDuration, fmtNum, fmtTime, h, s, stateBadge, table } from "./dom.js";

const TAIL_BYTES = 16384;
const KIND_CLASS = {
  submitted: "ev-submit", bind: "ev-bind", notice: "ev-notice", "notice-withdrawn": "ev-notice",
  "checkpoint-ack": "ev-ack", stop: "ev-stop", requeue: "ev-requeue", requeued: "ev-requeue",
  exited: "ev-exit", cancel: "ev-stop", reject: "ev-stop", oom: "ev-stop",
};

function timeline(job, events, attempts) {
  const W = 900, H = 34 + 18 * Math.max(1, attempts.length), pad = 10;
  const t0 = job.submitted_at;
  const t1 = Math.max(job.ended_at ?? Date.now() / 1000, ...events.map((e) => e.t), t0 + 1);
  const x = (t) => pad + ((t - t0) / (t1 - t0)) * (W - 2 * pad);
  const svg = s("svg", { class: "timeline", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "job timeline" });
  svg.append(s("line", { x1: pad, x2: W - pad, y1: 14, y2: 14, class: "axis" }));
  attempts.forEach((a, i) => {
    const y = 26 + i * 18;
    const end = a.ended_at ?? t1;
    svg.append(s("rect", { x: x(a.started_at), y, width: Math.max(2, x(end) - x(a.started_at)),
      height: 12, class: `attempt attempt-${a.state}` },
    s("title", { text: `attempt ${a.attempt}: ${a.state} ${fmtDuration(end - a.started_at)}` })));
    svg.append(s("text", { x: x(a.started_at) + 4, y: y + 10, class: "attempt-label",
      text: `attempt ${a.attempt}` }));
  });
  for (const e of events) {
    svg.append(s("circle", { cx: x(e.t), cy: 14, r: 5, class: `ev ${KIND_CLASS[e.kind] ?? "ev-other"}`,
      "data-kind": e.kind },
    s("title", { text: `${fmtTime(e.t)} ${e.kind} ${e.reason ?? ""} ${e.message ?? ""}` })));
  }
  return h("div", { class: "timeline-wrap" }, svg,
    h("div", { class: "axis-labels" }, h("span", { text: fmtTime(t0) }), h("span", { text: fmtTime(t1) })));
}

function eventTable(events) {
  if (!events.length) return empty("no decisions yet");
  return table(["time", "event", "reason", "message"], events.map((e) => h("tr", { "data-kind": e.kind },
    h("td", { text: fmtTime(e.t) }),
    h("td", null, h("span", { class: `dot ${KIND_CLASS[e.kind] ?? "ev-other"}` }), e.kind),
    h("td", { text: e.reason ?? "" }),
    h("td", { class: "reason", text: e.message ?? "" }))));
}

function attemptTable(attempts) {
  if (!attempts.length) return empty("not started yet");
  return table(["attempt", "state", "pool", "devices", "started", "ran", "exit", "stop"],
    attempts.map((a) => h("tr", null,
      h("td", { class: "num", text: a.attempt }),
      h("td", null, stateBadge(a.state)),
      h("td", { text: a.lent_from ? `${a.pool} (lent by ${a.lent_from})` : a.pool }),
      h("td", { class: "devices", text: a.assignments.map((x, i) => `node ${x.node}: ${(a.devices[i] ?? []).join(",")}`).join(" · ") }),
      h("td", { text: fmtTime(a.started_at) }),
      h("td", { text: fmtDuration((a.ended_at ?? Date.now() / 1000) - a.started_at) }),
      h("td", { text: a.exit_codes ? a.exit_codes.map((c) => c ?? "?").join(",") : "" }),
      h("td", { text: a.stop_reason ?? "" }))));
}

function explainBox(ex) {
  const parts = [];
  if (ex.pending) parts.push(h("p", { class: "why" }, h("b", { text: `waiting (${ex.pending.reason}): ` }), ex.pending.message));
  if (ex.notice) parts.push(h("p", { class: "why" }, h("b", { text: "notice: " }),
    `${ex.notice.reason}, deadline ${fmtTime(ex.notice.deadline)}`));
  if (!ex.pending && ex.message) parts.push(h("p", { class: "why", text: ex.message }));
  if (ex.fair_share?.length) {
    parts.push(table(["rank", "queue", "tenant", "GPUs held", "share", "why"],
      ex.fair_share.map((t) => h("tr", { class: t.queue === ex.queue ? "mine" : "" },
        h("td", { class: "num", text: t.rank }), h("td", { text: t.queue }), h("td", { text: t.tenant }),
        h("td", { class: "num", text: fmtNum(t.holding_gpus) }), h("td", { class: "num", text: fmtNum(t.share, 3) }),
        h("td", { class: "reason", text: t.explanation })))));
  }
  return parts.length ? h("div", null, parts) : empty("nothing to explain");
}

async function tail(id, stream) {
  const path = `/v1/jobs/${encodeURIComponent(id)}/logs`;
  const head = await getRaw(path, { stream, offset: 2 ** 40 });
  const size = Number(head.headers.get("X-Log-Size") || 0);
  if (!size) return "";
  const resp = await getRaw(path, { stream, offset: Math.max(0, size - TAIL_BYTES) });
  const text = await resp.text();
  return size > TAIL_BYTES ? "…" + text.slice(text.indexOf("\n") + 1) : text;
}

export function jobPage(root, { args }) {
  const id = args[0];
  let stream = "out";
  const head = h("div");
  const tl = h("div");
  const why = h("div");
  const atts = h("div");
  const evs = h("div");
  const log = h("pre", { class: "log", "data-stream": stream });
  const streamBtns = ["out", "err"].map((x) => h("button", { type: "button", class: x === stream ? "chip on" : "chip",
    text: x === "out" ? "stdout" : "stderr", onclick: () => { stream = x; streamBtns.forEach((b, i) => b.className = ["out", "err"][i] === x ? "chip on" : "chip"); } }));
  root.append(head, h("h3", { text: "Timeline" }), tl, h("h3", { text: "Explain" }), why,
    h("h3", { text: "Attempts" }), atts, h("h3", { text: "Log tail " }, ...streamBtns), log,
    h("h3", { text: "Decisions" }), evs);
  return {
    async refresh() {
      const enc = encodeURIComponent(id);
      const [job, events, ex, text] = await Promise.all([
        get(`/v1/jobs/${enc}`), get("/v1/events", { job: id, limit: 1000 }),
        get(`/v1/jobs/${enc}/explain`), tail(id, stream)]);
      head.replaceChildren(h("h2", null, `${job.id}${job.name ? " · " + job.name : ""} `, stateBadge(job.state)),
        h("p", { class: "muted", text: `${job.tenant} · queue ${job.queue} · partition ${job.partition} · ${job.class} · ${job.gpus} · attempt ${job.attempt}` }),
        h("p", { class: "muted cmd", text: (job.spec?.command ?? []).join(" ") }));
      tl.replaceChildren(timeline(job, events.events, job.attempts));
      why.replaceChildren(explainBox(ex));
      atts.replaceChildren(attemptTable(job.attempts));
      evs.replaceChildren(eventTable(events.events));
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent = text || "(no output yet)";
      if (atBottom) log.scrollTop = log.scrollHeight;
    },
  };
}
