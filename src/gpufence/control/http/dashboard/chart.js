// Small SVG time charts that share one x axis (the joint view): lines with gaps where nothing
// was sampled (null), optional step lines and dots, horizontal reference lines (an SLO) and
// vertical marks (preemptions, reclaims, notices ...) drawn through every chart alike.

import { fmtNum, fmtTime, h, s } from "./dom.js";

export const WIDTH = 1000;
const LEFT = 56, RIGHT = 12, TOP = 8, BOTTOM = 20;

export const MARK_COLOURS = {
  preemption: "#c23b57", reclaim: "#a24bd1", notice: "#d9822b", "notice-withdrawn": "#b9a27a",
  stop: "#666", requeue: "#1f9fb3", "node-down": "#000", "node-up": "#2e9e5b",
};

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function pathOf(points, stepped) {
  let d = "";
  let pen = false;
  let prevY = null;
  for (const [x, y] of points) {
    if (y === null) { pen = false; continue; }
    if (!pen) d += `M${x.toFixed(1)},${y.toFixed(1)}`;
    else if (stepped) d += `H${x.toFixed(1)}V${y.toFixed(1)}`;
    else d += `L${x.toFixed(1)},${y.toFixed(1)}`;
    pen = true;
    prevY = y;
  }
  return prevY === null ? "" : d;
}

export function lineChart(opt) {
  const height = opt.height ?? 120;
  const { since, until } = opt;
  const plotW = WIDTH - LEFT - RIGHT, plotH = height - TOP - BOTTOM;
  const x = (t) => LEFT + ((t - since) / Math.max(1e-9, until - since)) * plotW;
  let top = opt.yMax ?? 0;
  if (opt.yMax === undefined) {
    for (const l of opt.lines) for (const v of l.values) if (v !== null && v > top) top = v;
    for (const r of opt.hlines ?? []) if (r.y > top) top = r.y;
    top = niceMax(top * 1.1);
    if (opt.integer) top = Math.max(2, Math.ceil(top / 2) * 2);  // whole ticks: 0, top/2, top
  }
  const y = (v) => TOP + plotH - (Math.min(v, top) / top) * plotH;
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${WIDTH} ${height}`, "data-chart": opt.id,
    role: "img", "aria-label": opt.title });
  // grid and axes
  for (const f of [0, 0.5, 1]) {
    const yy = TOP + plotH - f * plotH;
    svg.append(s("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: yy, y2: yy, class: "grid-line" }));
    svg.append(s("text", { x: LEFT - 6, y: yy + 4, class: "tick y", text: fmtNum(f * top, top < 10 && !opt.integer ? 1 : 0) }));
  }
  for (let i = 0; i <= 5; i++) {
    const t = since + ((until - since) * i) / 5;
    const anchor = i === 0 ? "start" : i === 5 ? "end" : "middle";
    svg.append(s("text", { x: x(t), y: height - 5, class: "tick x", "text-anchor": anchor, text: fmtTime(t) }));
  }
  for (const r of opt.hlines ?? []) {
    svg.append(s("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: y(r.y), y2: y(r.y), class: "hline",
      stroke: r.colour, "data-hline": r.label }, s("title", { text: r.label })));
  }
  const tt = opt.t;  // bucket starts; a point is drawn at its bucket's middle
  const half = (opt.step ?? 0) / 2;
  for (const l of opt.lines) {
    const pts = tt.map((t, i) => {
      const v = l.values[i];
      return [x(t + half), v === null || v === undefined || t + half < since ? null : y(v)];
    });
    const d = pathOf(pts, l.stepped);
    if (d) {
      svg.append(s("path", { d, class: `series${l.dash ? " dashed" : ""}`, stroke: l.colour,
        "data-series": l.label }, s("title", { text: l.label })));
    }
    if (l.dots) {
      pts.forEach(([px, py], i) => {
        if (py !== null) svg.append(s("circle", { cx: px, cy: py, r: 3, fill: l.colour, class: "dot-pt" },
          s("title", { text: `${l.label}: ${fmtNum(l.values[i])} at ${fmtTime(tt[i])}` })));
      });
    }
  }
  for (const m of opt.marks ?? []) {
    if (m.t < since || m.t > until) continue;
    svg.append(s("line", { x1: x(m.t), x2: x(m.t), y1: TOP, y2: TOP + plotH, class: `mark mark-${m.kind}`,
      stroke: MARK_COLOURS[m.kind] ?? "#888", "data-kind": m.kind, "data-job": m.job_id ?? "" },
    s("title", { text: `${fmtTime(m.t)} ${m.kind}${m.job_id ? " " + m.job_id : ""}: ${m.message || m.reason}` })));
  }
  svg.append(s("rect", { x: LEFT, y: TOP, width: plotW, height: plotH, class: "frame" }));
  const legend = h("div", { class: "chart-legend" }, opt.lines.filter((l) => !l.hideLegend).map((l) => {
    const sw = h("span", { class: `swatch line${l.dash ? " dashed" : ""}` });
    sw.style.background = l.colour;
    return h("span", { class: "legend-item" }, sw, l.label);
  }), (opt.hlines ?? []).map((r) => h("span", { class: "legend-item" }, h("span", { class: "swatch line dashed" }), r.label)));
  return h("div", { class: "chart-box" },
    h("div", { class: "chart-title" }, h("b", { text: opt.title }), opt.unit ? h("span", { class: "muted", text: ` (${opt.unit})` }) : null),
    svg, legend);
}
