// Fleet dashboard entry point: sign-in, header, hash router, change feed fan-out.
import { api, token, openStream, setUnauthorizedHandler, ApiError } from "./api.js";
import { clear, h, setText } from "./dom.js";
import { overviewPage } from "./overview.js";
import { devicesPage } from "./devices.js";
import { devicePage } from "./device.js";
import { deploymentsPage, deploymentPage } from "./deployments.js";
import { eventsPage } from "./events.js";
import { samplesPage } from "./samples.js";
import { configIndexPage, configLayerPage } from "./config.js";
import { pendingPage } from "./pending.js";

const $ = (sel) => document.querySelector(sel);
const view = $("#view");
const signinForm = $("[data-testid=signin]");
const header = $("header.top");

const ctx = { me: null }; // shared with pages: ctx.me = {token_id, name, role}
let stopStream = null;
// What bench/dashboard.py reads: when the current page finished its first render, and how long each
// change-feed update took to apply (ms, the newest APPLY_KEPT), by event name.
const APPLY_KEPT = 500;
const timings = { readyAt: null, readyPage: null, apply: [] };
window.edgeinferTimings = timings;

let current = null; // {page, ready, queue, seq}
let routeSeq = 0;
let changeCount = 0;
let everConnected = false;

// ---- sign-in / sign-out ----------------------------------------------------

function showSignin(message = "") {
  stopChanges();
  ctx.me = null;
  unmountCurrent();
  clear(view);
  header.hidden = true;
  signinForm.hidden = false;
  setText($("[data-testid=signin-error]"), message);
  $("[data-testid=token-input]").focus();
}

function signOut(message = "") {
  token.clear();
  showSignin(message);
}

setUnauthorizedHandler((msg) => signOut(msg || "Token rejected (401)."));

signinForm.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const input = $("[data-testid=token-input]");
  const t = input.value.trim();
  if (!t) return;
  token.set(t);
  const ok = await start();
  if (ok) input.value = "";
});

$("[data-testid=signout]").addEventListener("click", () => signOut());

/** Validate the stored token with /api/whoami and show the app. */
async function start() {
  const btn = $("[data-testid=signin-submit]");
  btn.disabled = true;
  try {
    ctx.me = await api("whoami");
  } catch (e) {
    // 401 already went through signOut(); anything else: keep the token, show the reason.
    if (!(e instanceof ApiError && e.status === 401)) showSignin(`Cannot reach the manager: ${e.message}`);
    return false;
  } finally {
    btn.disabled = false;
  }
  signinForm.hidden = true;
  header.hidden = false;
  setText($("[data-testid=whoami]"), `${ctx.me.name} (${ctx.me.role})`);
  document.body.dataset.role = ctx.me.role;
  startChanges();
  route();
  return true;
}

// ---- change feed -----------------------------------------------------------

function setChangesState(state) {
  document.body.dataset.changes = state;
  setText($(".changes-text"), state);
}

function startChanges() {
  stopChanges();
  everConnected = false;
  stopStream = openStream(onStreamEvent, (state) => {
    const wasDown = document.body.dataset.changes !== "connected";
    setChangesState(state);
    if (state === "connected") {
      // Events sent while we were disconnected are lost: refresh the current page's data,
      // in place where the page can (keeps scroll, filter and sort), else by showing it again.
      if (everConnected && wasDown) refresh();
      everConnected = true;
    }
  });
}

function stopChanges() {
  if (stopStream) stopStream();
  stopStream = null;
  setChangesState("off");
}

function onStreamEvent(name, data) {
  changeCount++;
  setText($("[data-testid=change-updates]"), changeCount);
  if (!current) return;
  // A page that is still loading gets the events after its initial fetch, in order.
  if (!current.ready) current.queue.push([name, data]);
  else dispatch(current.page, name, data);
}

function dispatch(page, name, data) {
  const started = performance.now();
  try {
    if (page.onEvent) page.onEvent(name, data);
  } catch (e) {
    console.warn("change-feed update failed", name, e); // one bad message must not kill the stream
  }
  timings.apply.push([name, Array.isArray(data) ? data.length : 1, performance.now() - started]);
  if (timings.apply.length > APPLY_KEPT) timings.apply.splice(0, timings.apply.length - APPLY_KEPT);
}

// ---- router ----------------------------------------------------------------

const ROUTES = [
  [/^\/?$/, () => overviewPage, "overview"],
  [/^\/devices\/?$/, () => devicesPage, "devices"],
  [/^\/devices\/(.+)$/, () => devicePage, "devices"],
  [/^\/deployments\/?$/, () => deploymentsPage, "deployments"],
  [/^\/deployments\/(.+)$/, () => deploymentPage, "deployments"],
  [/^\/events\/?$/, () => eventsPage, "events"],
  [/^\/samples\/?$/, () => samplesPage, "samples"],
  [/^\/config\/?$/, () => configIndexPage, "config"],
  [/^\/config\/(.+)$/, () => configLayerPage, "config"],
  [/^\/pending\/?$/, () => pendingPage, "pending"],
];

function unmountCurrent() {
  if (current && current.page && current.page.unmount) current.page.unmount();
  current = null;
}

async function route() {
  if (!ctx.me) return;
  const hash = location.hash.replace(/^#/, "");
  const at = hash.indexOf("?"); // a page's own parameters (#/samples?label=person), kept encoded for it
  let path = (at < 0 ? hash : hash.slice(0, at)) || "/";
  const params = new URLSearchParams(at < 0 ? "" : hash.slice(at + 1));
  try { path = decodeURIComponent(path); } catch { /* malformed %-escape: match it as typed */ }
  const seq = ++routeSeq;
  unmountCurrent();
  const match = ROUTES.map(([re, page, nav]) => [path.match(re), page, nav]).find(([m]) => m);
  for (const a of document.querySelectorAll("nav a")) {
    if (match && a.dataset.nav === match[2]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  closeNav();
  const root = h("section", { class: "page", "aria-busy": "true" }, h("p", { class: "muted" }, "Loading…"));
  view.replaceChildren(root);
  if (!match) {
    root.replaceChildren(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
    root.removeAttribute("aria-busy");
    return;
  }
  const entry = { page: null, ready: false, queue: [], seq };
  current = entry;
  try {
    entry.page = await match[1]()(root, ctx, match[0][1], params);
  } catch (e) {
    if (seq !== routeSeq) return;
    if (e instanceof ApiError && e.status === 401) return; // already back at sign-in
    root.replaceChildren(h("p", { class: "error", role: "alert" }, `Could not load: ${e.message}`));
    root.removeAttribute("aria-busy");
    return;
  }
  root.removeAttribute("aria-busy");
  if (seq !== routeSeq) {
    // The user navigated away while this page loaded.
    if (entry.page && entry.page.unmount) entry.page.unmount();
    return;
  }
  entry.ready = true;
  timings.readyAt = performance.now();
  timings.readyPage = match[2];
  for (const [name, data] of entry.queue.splice(0)) dispatch(entry.page, name, data);
}

function refresh() {
  const entry = current;
  if (entry && entry.ready && entry.page && entry.page.refresh) {
    entry.page.refresh().catch((e) => console.warn("refresh failed", e));
  } else route();
}

window.addEventListener("hashchange", route);

// ---- collapsible nav (phones) ---------------------------------------------

const navToggle = $(".nav-toggle");
function closeNav() {
  navToggle.setAttribute("aria-expanded", "false");
  header.classList.remove("nav-open");
}
navToggle.addEventListener("click", () => {
  const open = navToggle.getAttribute("aria-expanded") !== "true";
  navToggle.setAttribute("aria-expanded", String(open));
  header.classList.toggle("nav-open", open);
});

// ---- theme (dark by default; the light one on request, remembered) ---------

const THEME_KEY = "edgeinfer.theme";
const themeBtn = $(".theme-toggle");
function applyTheme(theme) {
  if (theme === "light") document.documentElement.dataset.theme = "light";
  else delete document.documentElement.dataset.theme;
  themeBtn.setAttribute("aria-pressed", String(theme === "light")); // a toggle: its label stays "Light"
}
applyTheme(localStorage.getItem(THEME_KEY));
themeBtn.addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "light" ? "dark" : "light";
  localStorage.setItem(THEME_KEY, next);
  applyTheme(next);
  route(); // charts read their colours when drawn: redraw the page
});

// ---- boot ------------------------------------------------------------------

if (token.get()) start();
else showSignin();
