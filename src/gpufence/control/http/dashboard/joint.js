// The joint view: serving request rate, replicas and p99 vs SLO, queue delay per class, link and
// GPU utilisation on one time axis, with preemptions, reclaims, notices and requeues as marks
// through every chart (GET /v1/series): the live twin of the simulator's report.

import { get } from "./api.js";
import { MARK_COLOURS, lineChart } from "./chart.js";
import { colourOf, empty, fmtNum, fmtPct, fmtTime, h, jobLink, table } from "./dom.js";

const RANGES = [["5 min", 300], ["15 min", 900], ["1 h", 3600]];
let range = 300;

function reduce(lists, fn) {
  if (!lists.length) return [];
  return lists[0].map((_, i) => {
    const vs = lists.map((l) => l[i]).filter((v) => v !== null && v !== undefined);
    return vs.length ? fn(vs) : null;
  });
}
const max = (vs) => Math.max(...vs);
const mean = (vs) => vs.reduce((a, b) => a + b, 0) / vs.length;

function markSummary(marks) {
  const counts = {};
  for (const m of marks) counts[m.kind] = (counts[m.kind] ?? 0) + 1;
  return h("div", { class: "chart-legend marks-legend" }, Object.entries(counts).map(([k, n]) => {
    const sw = h("span", { class: "swatch mark-swatch" });
    sw.style.background = MARK_COLOURS[k] ?? "#888";
    return h("span", { class: "legend-item", "data-mark-count": k }, sw, `${k} × ${n}`);
  }));
}

function markTable(marks) {
  if (!marks.length) return empty("no preemptions, reclaims or notices in this range");
  return table(["time", "mark", "job", "reason", "message"], marks.slice(-50).reverse().map((m) =>
    h("tr", { "data-kind": m.kind },
      h("td", { text: fmtTime(m.t) }), h("td", { text: m.kind }),
      h("td", null, m.job_id ? jobLink(m.job_id) : "—"),
      h("td", { text: m.reason }), h("td", { class: "reason", text: m.message }))));
}

export function jointCharts(d) {
  // the axis starts where the series do (a plane started 2 min ago has no 15 min of history)
  const since = d.oldest !== null ? Math.min(Math.max(d.since, d.oldest), d.until - d.step_s) : d.since;
  const base = { t: d.t, since, until: d.until, step: d.step_s, marks: d.marks };
  const serv = d.serving;
  const charts = [];
  const deployColour = (x) => colourOf("deployment", `${x.tenant}/${x.deployment}`);
  charts.push(lineChart({ ...base, id: "request-rate", title: "Serving request rate", unit: "req/s",
    lines: serv.map((x) => ({ label: x.deployment, values: x.request_rate, colour: deployColour(x) })) }));
  charts.push(lineChart({ ...base, id: "replicas", title: "Serving replicas", integer: true, unit: "holding GPUs — / wanted - -",
    lines: serv.flatMap((x) => [
      { label: `${x.deployment} holding`, values: x.replicas, colour: deployColour(x), stepped: true },
      { label: `${x.deployment} wanted`, values: x.replicas_wanted, colour: deployColour(x), stepped: true, dash: true },
    ]) }));
  const slos = serv.filter((x) => x.slo_p99_ms !== null);
  charts.push(lineChart({ ...base, id: "p99", title: "Serving p99 vs SLO", unit: "ms",
    lines: serv.map((x) => ({ label: `${x.deployment} p99${x.slo_attainment !== null ? ` (SLO met ${fmtPct(x.slo_attainment)})` : ""}`,
      values: x.p99_ms, colour: deployColour(x) })),
    hlines: slos.map((x) => ({ y: x.slo_p99_ms, colour: "#c23b57", label: `${x.deployment} SLO ${fmtNum(x.slo_p99_ms)} ms` })) }));
  charts.push(lineChart({ ...base, id: "queue-delay", title: "Queue delay per class", unit: "s: oldest waiting —, longest wait of those started ●",
    lines: d.queue_delay.flatMap((q) => [
      { label: `${q.class} oldest waiting`, values: q.oldest_waiting_s, colour: colourOf("class", q.class) },
      { label: `${q.class} started`, values: q.max_wait_s, colour: colourOf("class", q.class), dots: true, hideLegend: true },
    ]) }));
  const linkLines = ["nvlink", "pcie", "nic"].map((cls) => {
    const ls = d.links.filter((l) => l.link_class === cls && l.capacity_bytes_per_s);
    return ls.length ? { label: `${cls} (busiest of ${ls.length})`, values: reduce(ls.map((l) => l.utilization), max).map((v) => (v === null ? null : v * 100)),
      colour: colourOf("link", cls) } : null;
  }).filter(Boolean);
  const gpuUtil = reduce(d.gpus.map((g) => g.utilization), mean).map((v) => (v === null ? null : v * 100));
  if (d.gpus.length) linkLines.push({ label: `GPU utilisation (mean of ${d.gpus.length})`, values: gpuUtil, colour: "#444", dash: true });
  charts.push(lineChart({ ...base, id: "links", title: "Interconnect and GPU utilisation", unit: "%", yMax: 100, lines: linkLines }));
  return charts;
}

export function jointPage(root) {
  const picker = h("div", { class: "filters" }, h("span", { class: "muted", text: "range" }),
    RANGES.map(([label, secs]) => h("button", { type: "button", class: secs === range ? "chip on" : "chip",
      "data-range": secs, text: label, onclick: (ev) => {
        range = secs;
        for (const b of picker.querySelectorAll("button")) b.className = Number(b.dataset.range) === range ? "chip on" : "chip";
        ev.target.blur();
      } })));
  const info = h("p", { class: "muted" });
  const charts = h("div", { class: "charts" });
  const marks = h("div");
  root.append(h("h2", { text: "Joint view" }), picker, info, charts, h("h3", { text: "Marks" }), marks);
  return {
    async refresh() {
      const now = Date.now() / 1000;
      const d = await get("/v1/series", { since: now - range });
      const other = d.other_tenants ? ` · other tenants: ${d.other_tenants.serving_deployments} deployments, ${d.other_tenants.marks} marks not shown` : "";
      const from = d.oldest !== null ? Math.max(d.since, d.oldest) : d.since;
      info.textContent = `${fmtTime(from)} – ${fmtTime(d.until)} · step ${fmtNum(d.step_s)} s · ${d.serving.length} serving deployment${d.serving.length === 1 ? "" : "s"}${other}${d.marks_truncated ? " · marks truncated" : ""}`;
      charts.replaceChildren(...jointCharts(d), markSummary(d.marks));
      marks.replaceChildren(markTable(d.marks));
    },
  };
}
