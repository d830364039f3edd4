// Overview page: fleet health at a glance. The payload is small, so live `overview` events
// simply re-render the sections (in place, inside the same containers).
import { api } from "./api.js";
import { h, clear, setText, emptyState, deviceLink, fmtTime, fmtAgo } from "./dom.js";
import { countChips } from "./config_parts.js";

// The change feed's overview says nothing of configurations: their counts are read again at most this often, after
// a change the stream reports.
const CONFIG_EVERY_MS = 3000;

export async function overviewPage(root) {
  const data = await api("overview");

  const counts = {};
  const stat = (key, label) => h("div", { class: `stat stat-${key}` },
    counts[key] = h("span", { class: "stat-num", "data-testid": `count-${key}` }),
    h("span", { class: "stat-label" }, label));

  const sec = (testid, title) => {
    const body = h("div", { "data-testid": testid, class: "section-body" });
    return [h("section", { class: "card" }, h("h2", {}, title), body), body];
  };
  const [versionsCard, versions] = sec("versions", "Versions in the field");
  const [delegatesCard, delegates] = sec("delegates", "Delegates in use");
  const [fallbacksCard, fallbacks] = sec("fallbacks", "Running on a fallback");
  const lists = {};
  const listCards = [
    ["throttling", "Throttling"], ["hot", "Hot"], ["backlogged", "Backlogged spool"], ["silent", "Silent (no telemetry)"],
  ].map(([k, t]) => { const [c, b] = sec(k, t); lists[k] = b; return c; });
  const [eventsCard, events] = sec("events", "Last events");
  const [configCard, config] = sec("config", "Configuration");
  const outOfStep = h("span", { "data-testid": "count-config-out-of-step" });
  const configChips = h("div");
  config.append(h("p", {}, h("a", { href: "#/config?status=out-of-step", "data-testid": "config-out-of-step-link" },
    outOfStep, " out of step"), h("span", { class: "muted" }, " (not running what their layers say)")), configChips);

  root.replaceChildren(h("div", { "data-testid": "overview" },
    h("h1", {}, "Overview"),
    h("div", { class: "stats" }, stat("online", "online"), stat("degraded", "degraded"),
      stat("offline", "offline"), stat("total", "total")),
    h("div", { class: "grid" }, versionsCard, delegatesCard, fallbacksCard, configCard, ...listCards),
    eventsCard));

  let eventKeys = new Set();

  function renderConfig(c) {
    if (!c) return; // a live overview: the counts last read stay
    setText(outOfStep, c.out_of_step ?? 0);
    config.dataset.outOfStep = String(c.out_of_step ?? 0);
    configChips.replaceChildren(countChips(c.counts));
  }
  let configTimer = null, configAt = 0;
  function readConfig() {
    if (configTimer) return;
    configTimer = setTimeout(async () => {
      try { renderConfig(await api("config/devices")); } catch (e) { console.warn("configuration:", e.message); }
      configAt = Date.now();
      configTimer = null;
    }, Math.max(0, configAt + CONFIG_EVERY_MS - Date.now()));
  }

  function render(o) {
    renderConfig(o.config);
    const d = o.devices || {};
    for (const k of ["online", "offline", "degraded", "total"]) setText(counts[k], d[k] ?? 0);

    renderCounts(versions, o.versions, "no models reported yet");
    const fb = Array.isArray(o.fallbacks) ? o.fallbacks : [];
    renderCounts(delegates, o.delegates, "no delegates reported yet",
      fb.length ? `${fb.length} pipeline${fb.length === 1 ? "" : "s"} on a fallback` : "");

    clear(fallbacks).append(fb.length
      ? h("ul", { class: "plain" }, fb.map((f) => h("li", {},
          deviceLink(f.device_id), ` · ${f.pipeline} → `, h("code", {}, f.delegate),
          f.reason ? h("span", { class: "muted" }, ` (${f.reason})`) : "")))
      : emptyState("none — every pipeline runs on its planned delegate"));

    for (const k of Object.keys(lists)) {
      const ids = Array.isArray(o[k]) ? o[k] : [];
      clear(lists[k]).append(ids.length
        ? h("ul", { class: "chips" }, ids.map((id) => h("li", {}, deviceLink(id))))
        : emptyState("none"));
    }

    const evs = Array.isArray(o.events) ? o.events : [];
    eventKeys = new Set(evs.map(eventKey));
    clear(events).append(evs.length ? h("ol", { class: "events" }, evs.map(eventItem)) : emptyState("no events yet"));
  }

  render(data);
  return {
    async refresh() { render(await api("overview")); },
    unmount() { clearTimeout(configTimer); },
    onEvent(name, payload) {
      if (name === "overview" || name === "deployment" || name === "deployments") readConfig();
      if (name === "overview") render(payload);
      else if (name === "events" && Array.isArray(payload)) {
        // Newest first, keep the last 20; skip ones already shown via an overview snapshot.
        let list = events.querySelector("ol.events");
        const fresh = payload.filter((e) => !eventKeys.has(eventKey(e)));
        if (!fresh.length) return;
        if (!list) clear(events).append(list = h("ol", { class: "events" }));
        for (const e of fresh) { eventKeys.add(eventKey(e)); list.prepend(eventItem(e)); }
        while (list.children.length > 20) list.lastElementChild.remove();
      }
    },
  };
}

function renderCounts(el, obj, emptyText, note = "") {
  const entries = Object.entries(obj || {}).sort((a, b) => b[1] - a[1]);
  clear(el).append(entries.length
    ? h("table", { class: "kv" }, h("tbody", {}, entries.map(([k, n]) =>
        h("tr", {}, h("th", { scope: "row" }, k), h("td", { class: "num" }, n)))))
    : emptyState(emptyText));
  if (note) el.append(h("p", { class: "warn" }, note));
}

export function eventKey(e) { return `${e.device_id}|${e.ts}|${e.event}|${e.message ?? ""}`; }

export function eventItem(e) {
  const level = e.level || "info";
  return h("li", { "data-testid": "event", class: `event level-${level}` },
    h("time", { datetime: new Date((e.ts || 0) * 1000).toISOString(), title: fmtTime(e.ts) }, fmtAgo(e.ts)),
    " ", h("span", { class: `badge level-${level}` }, level),
    " ", e.device_id ? deviceLink(e.device_id) : "",
    " ", h("strong", {}, e.event || ""),
    e.message ? h("span", { class: "muted" }, ` — ${e.message}`) : "");
}
