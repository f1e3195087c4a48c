// The dashboard's shell: sign-in, the hash router (#/, #/gpus, #/queue, #/joint, #/jobs/ID)
// and the live loop: the shown page refreshes every POLL_MS while the tab is visible.

import { AuthError, cachedWho, clearToken, signIn, token, get } from "./api.js";
import { h } from "./dom.js";
import { overviewPage } from "./fences.js";
import { gpuPage } from "./gpumap.js";
import { queuePage } from "./queue.js";
import { jobPage } from "./job.js";
import { jointPage } from "./joint.js";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);

const ROUTES = [
  [/^#?\/?$/, "overview", () => overviewPage],
  [/^#\/gpus$/, "gpus", () => gpuPage],
  [/^#\/queue$/, "queue", () => queuePage],
  [/^#\/joint$/, "joint", () => jointPage],
  [/^#\/jobs\/([^/]+)$/, "job", () => jobPage],
];

const app = { who: null, page: null, timer: null, seq: 0, painted: false };

function showLogin(message) {
  stop();
  $("nav").hidden = true;
  $("who").hidden = true;
  $("signout").hidden = true;
  $("live").hidden = true;
  $("page").replaceChildren();
  $("login").hidden = false;
  $("login-error").textContent = message ?? "";
  $("token").focus();
  document.body.dataset.state = "signed-out";
}

function showShell(who) {
  app.who = who;
  $("login").hidden = true;
  $("nav").hidden = false;
  $("signout").hidden = false;
  const w = $("who");
  w.hidden = false;
  w.textContent = who.admin ? "admin (all tenants)" : `tenant ${who.tenant}`;
  document.body.dataset.state = "signed-in";
  route();
}

function stop() {
  if (app.timer !== null) clearTimeout(app.timer);
  app.timer = null;
  if (app.page?.dispose) app.page.dispose();
  app.page = null;
}

function route() {
  stop();
  const hash = location.hash || "#/";
  let match = null;
  let name = "overview";
  let make = null;
  for (const [re, n, page] of ROUTES) {
    match = hash.match(re);
    if (match) { name = n; make = page(); break; }
  }
  if (!make) { location.hash = "#/"; return; }
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === name);
  }
  const root = h("section", { class: `page page-${name}` });
  $("page").replaceChildren(root);
  document.body.dataset.page = name;
  delete document.body.dataset.painted;
  const seq = ++app.seq;
  app.page = make(root, { who: app.who, args: match.slice(1).map(decodeURIComponent) });
  tick(seq, true);
}

async function tick(seq, first) {
  const page = app.page;
  if (seq !== app.seq || !page) return;
  let drawn = false;
  if (!document.hidden && !page.busy) {
    page.busy = true;  // one refresh of a page at a time (a slow answer is not stacked)
    try {
      await page.refresh();
      drawn = true;
      if (seq === app.seq) {
        setLive(true);
        if (first) painted();
      }
    } catch (err) {
      if (err instanceof AuthError) { clearToken(); showLogin("signed out: " + err.message); return; }
      if ((err.status === 403 || err.status === 404) && seq === app.seq) {
        // another tenant's job, or none such: say so instead of a blank page, and stop asking
        $("page").replaceChildren(h("p", { class: "error", id: "page-error", text: err.message }));
        document.body.dataset.painted = document.body.dataset.page;
        return;
      }
      if (seq === app.seq) setLive(false, err.message);
      // the server's refusals are the page's business (shown as "stale"); anything else is a bug
      if (err.status) console.warn("gpufence dashboard:", err.message);
      else console.error("gpufence dashboard:", err);
    } finally {
      page.busy = false;
    }
  }
  if (seq === app.seq) app.timer = setTimeout(() => tick(seq, first && !drawn), POLL_MS);
}

function painted() {
  // the first page drawn with data: what bench/dashboard_paint.py measures
  if (!app.painted) {
    app.painted = true;
    performance.mark("gpufence-first-paint");
  }
  document.body.dataset.painted = document.body.dataset.page;
}

function setLive(ok, why) {
  const el = $("live");
  el.hidden = false;
  el.className = ok ? "live ok" : "live stale";
  el.textContent = ok ? `live · ${new Date().toLocaleTimeString([], { hour12: false })}` : "stale";
  el.title = ok ? `refreshes every ${POLL_MS / 1000} s` : why;
}

async function start() {
  $("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const value = $("token").value.trim();
    $("token").value = "";
    try {
      showShell(await signIn(value));
    } catch (err) {
      showLogin(err.message);
    }
  });
  $("signout").addEventListener("click", () => { clearToken(); showLogin(); });
  window.addEventListener("hashchange", () => { if (app.who) route(); });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && app.page && app.timer !== null) {
      clearTimeout(app.timer);
      tick(app.seq, false);
    }
  });
  if (!token()) { showLogin(); return; }
  const cached = cachedWho();
  if (cached) { showShell(cached); return; }
  try {
    const who = await get("/v1/dashboard/whoami");
    sessionStorage.setItem("gpufence.who", JSON.stringify(who));
    showShell(who);
  } catch (err) {
    clearToken();
    showLogin(err instanceof AuthError ? "signed out: " + err.message : err.message);
  }
}

start();
