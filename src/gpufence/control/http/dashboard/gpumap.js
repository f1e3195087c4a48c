// The GPU map: nodes x GPUs, MIG slices and fractional shares, coloured by partition, tenant or
// class, the job(s) on each GPU and its latest utilisation (from /v1/dashboard/gpus).

import { get } from "./api.js";
import { colourOf, empty, fmtPct, h, jobLink } from "./dom.js";

const COLOUR_BY = ["partition", "tenant", "class"];
let colourBy = "partition";

export function migSlots(profile) {
  // "3g.40gb" -> 3 of a GPU's 7 compute slices
  const m = /^(\d+)g\./.exec(profile ?? "");
  return m ? Number(m[1]) : 1;
}

function keyOf(gpu, data) {
  if (colourBy === "partition") return gpu.partition;
  const job = gpu.jobs.map((j) => data.jobs[j]).find(Boolean);
  if (!job) return null;
  return colourBy === "tenant" ? job.tenant : job.class;
}

function jobLabel(id, data) {
  const info = data.jobs[id];
  return jobLink(id, info?.name ? `${id} ${info.name}` : id);
}

function utilBar(u) {
  if (!u || u.utilization === null || u.utilization === undefined) return null;
  const pct = Math.max(0, Math.min(1, u.utilization));
  return h("div", { class: "util", title: `utilisation ${fmtPct(pct)}` },
    h("div", { class: "util-fill", style: { width: `${pct * 100}%` } }),
    h("span", { class: "util-text", text: fmtPct(pct) }));
}

function migCell(gpu, data) {
  return h("div", { class: "mig" }, gpu.mig.map((slot) => {
    const owner = slot.job ? data.jobs[slot.job] : null;
    const used = slot.job !== null || slot.other_tenant;
    const el = h("div", {
      class: `slice${used ? " used" : ""}${slot.other_tenant ? " other" : ""}`,
      "data-profile": slot.profile,
      title: `${slot.profile} @${slot.start}${slot.job ? " · " + slot.job : ""}`,
    }, h("span", { class: "profile", text: slot.profile.split(".")[0] }),  // "3g"; all in title
    slot.job ? jobLink(slot.job) : slot.other_tenant ? h("span", { text: "other" }) : null);
    el.style.flexGrow = String(migSlots(slot.profile));
    if (owner && colourBy !== "partition") {
      el.style.background = colourOf(colourBy, colourBy === "tenant" ? owner.tenant : owner.class);
    }
    return el;
  }));
}

function gpuCell(node, gpu, data) {
  const key = keyOf(gpu, data);
  const u = data.util[`${node.name}/${gpu.index}`];
  const shared = gpu.milli_used > 0 && gpu.milli_used < 1000 && !gpu.mig;
  // a job from another fence on this GPU: lent capacity, or taken in an incident
  const away = [...new Set(gpu.jobs.map((j) => data.jobs[j]?.partition)
    .filter((p) => p && p !== gpu.partition))];
  const cell = h("div", {
    class: `gpu state-${gpu.state}`,
    "data-node": node.name,
    "data-gpu": gpu.index,
    "data-partition": gpu.partition,
    "data-jobs": gpu.jobs.join(" "),
    title: `${node.name} GPU ${gpu.index} · ${gpu.type} · partition ${gpu.partition} · ${gpu.state}`,
  },
  h("div", { class: "gpu-head" },
    h("span", { class: "gpu-idx", text: `GPU ${gpu.index}` }),
    shared ? h("span", { class: "share", text: `${(gpu.milli_used / 10).toFixed(0)} %` }) : null,
    away.length ? h("span", { class: "away", title: `held by a job of partition ${away.join(", ")} (lent, or taken in an incident)`, text: `⇠ ${away.join(", ")}` }) : null),
  gpu.mig ? migCell(gpu, data) : h("div", { class: "gpu-jobs" },
    gpu.jobs.map((j) => jobLabel(j, data)),
    gpu.other_tenants_jobs ? h("span", { class: "other", text: `${gpu.other_tenants_jobs} other tenant` }) : null,
    // idle, but kept for a waiting gang: not capacity anyone may take
    gpu.state === "held" ? h("span", { class: "held", text: `held for ${gpu.held_for ?? "another tenant"}'s gang` }) : null),
  shared ? h("div", { class: "frac" }, h("div", { class: "frac-fill", style: { width: `${gpu.milli_used / 10}%` } })) : null,
  utilBar(u));
  cell.style.borderColor = colourOf("partition", gpu.partition);
  if (key !== null && colourBy !== "partition") {
    cell.style.background = colourOf(colourBy, key) + "33";
  } else if (gpu.state === "used") {
    cell.style.background = colourOf("partition", gpu.partition) + "26";
  }
  return cell;
}

// A map that keeps its cells: a refresh rebuilds only the GPUs whose data changed, and a first
// drawing of a large cluster draws the first FIRST_NODES nodes (a screenful) at once and the
// rest in CHUNK-node steps after it, so a 1,000-GPU map paints as fast as a small one.
const FIRST_NODES = 24;
const CHUNK = 40;

function legendOf(data) {
  const keys = new Set();
  for (const n of data.nodes) for (const g of n.gpus) { const k = keyOf(g, data); if (k) keys.add(k); }
  return h("div", { class: "legend" },
    h("span", { class: "legend-title", text: "colour by" }),
    COLOUR_BY.map((c) => h("button", {
      type: "button", class: c === colourBy ? "chip on" : "chip", "data-colour": c, text: c,
      onclick: () => { colourBy = c; document.dispatchEvent(new CustomEvent("gpufence:redraw")); },
    })),
    [...keys].sort().map((k) => {
      const sw = h("span", { class: "swatch" });
      sw.style.background = colourOf(colourBy, k);
      return h("span", { class: "legend-item" }, sw, k);
    }));
}

function nodeHead(n) {
  return h("div", { class: "node-head" }, h("b", { text: n.name }),
    h("span", { class: "muted", text: `${n.gpu_type}${n.rack ? " · " + n.rack : ""}${n.up ? "" : " · DOWN"}` }));
}

export function createGpuMap() {
  const summary = h("p", { class: "muted" });
  const legend = h("div");
  const nodes = h("div", { class: "nodes" });
  const el = h("div", { class: "gpumap" }, summary, legend, nodes);
  const cells = new Map();  // "node/index" -> [signature, element]
  const boxes = new Map();  // node name -> [signature, element, gpus container]
  let pending = null;

  function drawNode(n, data) {
    const headSig = `${n.name}|${n.up}|${n.gpu_type}|${n.rack}`;
    let box = boxes.get(n.name);
    if (!box || box[0] !== headSig) {
      const gpus = h("div", { class: "gpus" });
      const node = h("div", { class: `node${n.up ? "" : " down"}`, "data-node": n.name }, nodeHead(n), gpus);
      box = [headSig, node, gpus];
      if (boxes.has(n.name)) boxes.get(n.name)[1].replaceWith(node);
      boxes.set(n.name, box);
      for (const g of n.gpus) cells.delete(`${n.name}/${g.index}`);
    }
    const list = [];
    for (const g of n.gpus) {
      const key = `${n.name}/${g.index}`;
      const jobs = g.jobs.map((j) => data.jobs[j] ?? null);
      const sig = JSON.stringify([colourBy, g, jobs, data.util[key] ?? null]);
      let cell = cells.get(key);
      if (!cell || cell[0] !== sig) {
        cell = [sig, gpuCell(n, g, data)];
        cells.set(key, cell);
      }
      list.push(cell[1]);
    }
    const gpus = box[2];
    if (gpus.children.length !== list.length || list.some((c, i) => gpus.children[i] !== c)) {
      gpus.replaceChildren(...list);
    }
    return box[1];
  }

  function update(data) {
    if (pending !== null) { clearTimeout(pending); pending = null; }
    const used = data.nodes.reduce((a, n) => a + n.gpus.filter((g) => g.state === "used").length, 0);
    const total = data.nodes.reduce((a, n) => a + n.gpus.length, 0);
    const note = data.other_tenants_gpus ? ` · ${data.other_tenants_gpus} held by other tenants` : "";
    summary.textContent = `${data.nodes.length} nodes · ${total} GPUs · ${used} in use${note}`;
    legend.replaceChildren(legendOf(data));
    if (!data.nodes.length) { nodes.replaceChildren(empty("no nodes")); return; }
    const names = new Set(data.nodes.map((n) => n.name));
    for (const name of [...boxes.keys()]) if (!names.has(name)) { boxes.get(name)[1].remove(); boxes.delete(name); }
    const step = (from, count) => {
      const upto = Math.min(data.nodes.length, from + count);
      const els = [];
      for (let i = from; i < upto; i++) els.push(drawNode(data.nodes[i], data));
      els.forEach((node, k) => {
        const at = nodes.children[from + k];
        if (at !== node) nodes.insertBefore(node, at ?? null);
      });
      if (upto < data.nodes.length) pending = setTimeout(() => step(upto, CHUNK), 0);
      else {
        pending = null;
        while (nodes.children.length > data.nodes.length) nodes.lastChild.remove();
      }
    };
    step(0, FIRST_NODES);
  }
  return { el, update, dispose() { if (pending !== null) clearTimeout(pending); } };
}

export function gpuPage(root) {
  const map = createGpuMap();
  root.append(h("h2", { text: "GPU map" }), map.el);
  let last = null;
  const redraw = () => { if (last) map.update(last); };
  document.addEventListener("gpufence:redraw", redraw);
  return {
    async refresh() {
      last = await get("/v1/dashboard/gpus");
      redraw();
    },
    dispose() { map.dispose(); document.removeEventListener("gpufence:redraw", redraw); },
  };
}
