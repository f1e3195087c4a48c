// DOM helpers: every value reaches the page as text (textContent), never as HTML, so a job
// name or a command cannot inject markup; the Content-Security-Policy forbids inline script.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  if (!attrs) return;
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function fmtTime(t) {
  if (t === null || t === undefined) return "—";
  const d = new Date(t * 1000);
  return d.toLocaleTimeString([], { hour12: false });
}

export function fmtAgo(t, now) {
  if (t === null || t === undefined) return "—";
  return fmtDuration((now ?? Date.now() / 1000) - t);
}

export function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "—";
  if (s < 0) s = 0;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function fmtNum(x, digits = 1) {
  if (x === null || x === undefined || !isFinite(x)) return "—";
  return Number.isInteger(x) ? String(x) : x.toFixed(digits);
}

export function fmtPct(x) {
  if (x === null || x === undefined || !isFinite(x)) return "—";
  return `${Math.round(x * 100)} %`;
}

// a stable colour per name (partition, tenant, class): the palette in order of first sight
const PALETTE = ["#2f6fdf", "#d9822b", "#2e9e5b", "#a24bd1", "#c23b57", "#1f9fb3",
  "#8c6d1f", "#5b6abf", "#d45fa2", "#5c8a2e"];
const seen = new Map();

export function colourOf(kind, name) {
  const key = `${kind}:${name}`;
  if (!seen.has(key)) {
    const n = [...seen.keys()].filter((k) => k.startsWith(`${kind}:`)).length;
    seen.set(key, PALETTE[n % PALETTE.length]);
  }
  return seen.get(key);
}

export function stateBadge(state) {
  return h("span", { class: `badge state-${state}`, text: state });
}

export function jobLink(id, label) {
  return h("a", { href: `#/jobs/${encodeURIComponent(id)}`, class: "job", "data-job": id },
    label ?? id);
}

export function table(headers, rows, attrs) {
  return h("table", attrs ?? { class: "grid" },
    h("thead", null, h("tr", null, headers.map((x) => h("th", null, x)))),
    h("tbody", null, rows));
}

export function empty(text) {
  return h("p", { class: "empty", text });
}
