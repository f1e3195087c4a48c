// The overview: each fence's capacity, used, lent, borrowed, queue depth and largest placeable
// gang (/v1/partitions), then the GPU map.

import { get } from "./api.js";
import { colourOf, empty, fmtNum, h, table } from "./dom.js";
import { createGpuMap } from "./gpumap.js";

function bar(p) {
  const cap = p.capacity_gpus || 1;
  const seg = (cls, n, title) => {
    const el = h("div", { class: `seg ${cls}`, title });
    el.style.width = `${Math.max(0, Math.min(100, (n / cap) * 100))}%`;
    return el;
  };
  const own = Math.max(0, p.used_gpus - p.borrowed_gpus);
  return h("div", { class: "capbar" },
    seg("used", own, `${fmtNum(own)} GPUs used by its own jobs`),
    seg("lent", p.lent_gpus, `${p.lent_gpus} GPUs lent to other partitions`));
}

function fenceRows(parts) {
  return parts.map((p) => {
    const sw = h("span", { class: "swatch" });
    sw.style.background = colourOf("partition", p.name);
    return h("tr", { "data-partition": p.name },
      h("td", null, sw, h("b", { text: p.name })),
      h("td", { text: p.admits.join(", ") }),
      h("td", { text: p.sharing }),
      h("td", { class: "num", text: p.capacity_gpus }),
      h("td", { class: "num", text: fmtNum(p.used_gpus) }),
      h("td", { class: "num", text: p.lent_gpus }),
      h("td", { class: "num", text: p.borrowed_gpus }),
      h("td", { class: "num queue-depth" }, h("a", { href: "#/queue", text: p.pending })),
      h("td", { class: "num", text: p.running }),
      h("td", { class: "num", text: p.largest_gang }),
      h("td", { class: "barcell" }, bar(p)));
  });
}

export function fencesTable(parts) {
  if (!parts.length) return empty("no partitions");
  return table(["fence", "admits", "sharing", "capacity", "used", "lent", "borrowed",
    "queued", "running", "largest gang", ""], fenceRows(parts), { class: "grid fences" });
}

function totals(parts) {
  const sum = (k) => parts.reduce((a, p) => a + (p[k] || 0), 0);
  const card = (label, value) => h("div", { class: "card" },
    h("div", { class: "card-value", text: value }), h("div", { class: "card-label", text: label }));
  return h("div", { class: "cards" },
    card("GPUs", sum("capacity_gpus")),
    card("in use", fmtNum(sum("used_gpus"))),
    card("lent", sum("lent_gpus")),
    card("queued jobs", sum("pending")),
    card("running jobs", sum("running")));
}

export function overviewPage(root) {
  const head = h("div");
  const fences = h("div");
  const map = createGpuMap();
  root.append(h("h2", { text: "Fences" }), head, fences, h("h2", { text: "GPU map" }), map.el);
  let gpus = null;
  const redraw = () => { if (gpus) map.update(gpus); };
  document.addEventListener("gpufence:redraw", redraw);
  return {
    async refresh() {
      const [parts, g] = await Promise.all([get("/v1/partitions"), get("/v1/dashboard/gpus")]);
      head.replaceChildren(totals(parts.partitions));
      fences.replaceChildren(fencesTable(parts.partitions));
      gpus = g;
      redraw();
    },
    dispose() { map.dispose(); document.removeEventListener("gpufence:redraw", redraw); },
  };
}
