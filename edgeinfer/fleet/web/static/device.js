// One device: charts over time, delegate plan, model, events, operator actions (capturing frames among them), its logs.
import { api, ApiError } from "./api.js";
import { h, clear, setText, emptyState, fact, fmtNum, fmtAgo, fmtTime, fmtBytes, deviceMetrics, versionOf,
  canOperate, confirmDialog, DASH } from "./dom.js";
import { lineChart, join } from "./charts.js";
import { eventItem, eventKey } from "./overview.js";
import { evidenceList } from "./events.js";
import { liveCard } from "./live_view.js";
import { samplingCard } from "./sampling.js";
import { logsCard } from "./logs.js";
import { deviceTabs, layerHref, statusBadge } from "./config_parts.js";

const TELEMETRY_LIMIT = 300;
// A page opened before its device registered looks for it this often (ms), this long, besides the change feed's
// `devices` updates (which show it within a second of its registering, while the stream is up).
const UNKNOWN_RETRY_MS = 5000;
const UNKNOWN_RETRY_FOR_MS = 10 * 60 * 1000;

/** The device and its recent telemetry; [null, []] while the manager knows no such device (404). */
async function loadDevice(id) {
  const enc = encodeURIComponent(id);
  return Promise.all([
    api(`devices/${enc}`).catch((e) => { if (e instanceof ApiError && e.status === 404) return null; throw e; }),
    // Charts are useful without telemetry history (roll-ups), so a failure here is not fatal.
    api(`devices/${enc}/telemetry?limit=${TELEMETRY_LIMIT}`).catch(() => []),
  ]);
}

export async function devicePage(root, ctx, id) {
  const [dev, telemetry] = await loadDevice(id);
  return dev === null ? unknownDevicePage(root, ctx, id) : shownDevicePage(root, ctx, id, dev, telemetry);
}

/**
 * A device page opened before its device registered (a link sent ahead of an installation, a device page kept
 * open across a re-enrolment): it says the device is not known yet and becomes the device's page as soon as the
 * manager knows it — on the change feed's `devices` update naming it, or a look every UNKNOWN_RETRY_MS — with
 * no reload.
 */
function unknownDevicePage(root, ctx, id) {
  root.replaceChildren(h("div", { "data-testid": "device-unknown", dataset: { deviceId: id } },
    h("p", { class: "crumbs" }, h("a", { href: "#/devices" }, "Devices"), " / "),
    h("div", { class: "page-head" }, h("h1", {}, id), h("span", { class: "badge state-offline" }, "not known yet")),
    h("p", { role: "status" }, `The manager knows no device ${id} yet. This page shows it as soon as it registers `
      + "(its agent's first connection, once enrolled)."),
    h("p", { class: "muted" }, h("a", { href: "#/devices" }, "The devices known so far"))));
  let inner = null, looking = null, disposed = false;
  const started = Date.now();
  const timer = setInterval(() => {
    if (Date.now() - started > UNKNOWN_RETRY_FOR_MS) clearInterval(timer); // the change feed still watches
    else look();
  }, UNKNOWN_RETRY_MS);
  function look() {
    if (inner || disposed) return Promise.resolve();
    if (!looking) {
      looking = loadDevice(id).then(async ([dev, telemetry]) => {
        if (dev === null || disposed || inner) return;
        clearInterval(timer);
        const page = await shownDevicePage(root, ctx, id, dev, telemetry);
        if (disposed) page.unmount(); else inner = page;
      }).catch((e) => console.warn(`device ${id}:`, e.message)).finally(() => { looking = null; });
    }
    return looking;
  }
  return {
    onEvent(name, payload) {
      if (inner) { inner.onEvent(name, payload); return; }
      if (name === "devices" && Array.isArray(payload) && payload.some((x) => x && x.device_id === id)) look();
    },
    // app.js refreshes a page after the change feed was down: a look while unknown, then as the device page would be
    get refresh() { return inner ? inner.refresh : look; },
    unmount() {
      disposed = true;
      clearInterval(timer);
      if (inner) inner.unmount();
    },
  };
}

async function shownDevicePage(root, ctx, id, dev, telemetry) {
  const enc = encodeURIComponent(id);
  let d = dev;
  const tel = Array.isArray(telemetry) ? telemetry.slice() : [];
  const rollups = Array.isArray(d.rollups) ? d.rollups : [];

  // ---- skeleton ----
  const status = h("span", { class: "badge" });
  const facts = h("dl", { class: "facts" });
  const chartBox = (key, title) => h("figure", { class: "chart card" },
    h("figcaption", {}, title), h("div", { class: "chart-body", "data-testid": `chart-${key}` }));
  const boxes = {
    fps: chartBox("fps", "Frames per second"),
    latency: chartBox("latency", "Latency (ms)"),
    cpu: chartBox("cpu", "CPU (%)"),
    temperature: chartBox("temperature", "Temperature (°C) and throttling"),
  };
  const plan = h("div", { "data-testid": "delegate-plan" });
  const slots = h("div", { "data-testid": "model-slots" });
  const events = h("ol", { class: "events", "data-testid": "device-events" });
  const detections = evidenceList({ device: id, limit: 20 });
  const actions = canOperate(ctx.me.role) ? actionsCard(id, () => d) : null;
  const live = liveCard(id, () => d, canOperate(ctx.me.role));
  const sampling = canOperate(ctx.me.role) ? samplingCard(id, () => d) : null;
  const logs = canOperate(ctx.me.role) ? logsCard(id) : null; // operators only (docs/security.md)
  // its configuration's status (desired vs applied vs refused), read again when a deployment moves
  const configEl = h("a", { href: layerHref("device", id), "data-testid": "device-config-status" }, DASH);
  let configTimer = null;
  const readConfig = () => api(`config/devices/${enc}`).then((c) => {
    configEl.replaceChildren(statusBadge(c.status), c.status === "refused" && c.refused
      ? h("span", { class: "error" }, ` ${c.refused.reason || c.refused.state}`) : "");
  }).catch((e) => console.warn("configuration:", e.message));
  readConfig();

  root.replaceChildren(h("div", { "data-testid": "device", dataset: { deviceId: id } },
    h("p", { class: "crumbs" }, h("a", { href: "#/devices" }, "Devices"), " / "),
    deviceTabs(id, "device"),
    h("div", { class: "page-head" }, h("h1", {}, id), status),
    facts,
    h("div", { class: "charts" }, Object.values(boxes)),
    live.el,
    h("div", { class: "grid" },
      h("section", { class: "card" }, h("h2", {}, "Delegate plan"), plan),
      h("section", { class: "card" }, h("h2", {}, "Model"), slots),
      actions,
      sampling && sampling.el),
    h("section", { class: "card", "data-testid": "device-detections" }, h("h2", {}, "Detections"), detections.el),
    h("section", { class: "card" }, h("h2", {}, "Events"), events),
    logs && logs.el));
  // Not fatal: the rest of the page is useful without it (a manager without evidence answers 404).
  detections.load().catch((e) => console.warn("detections:", e.message));

  // ---- charts ----
  const charts = {};
  function chartData() {
    const xs = [], fps = [], p50 = [], p95 = [], cpu = [], thr = [];
    const sensors = new Set();
    for (const t of tel) for (const k of Object.keys((t.system || {}).temperature_c || {})) sensors.add(k);
    const sensorList = [...sensors].slice(0, 5);
    const temps = sensorList.map(() => []);
    for (const t of tel) {
      const ts = t.ts ?? t.timestamp;
      if (typeof ts !== "number") continue;
      const m = deviceMetrics({ online: true, last_telemetry: t });
      let lo = null;
      for (const p of t.pipelines || []) {
        const v = p.stages && p.stages.latency && p.stages.latency.p50;
        if (typeof v === "number") lo = lo === null ? v : Math.max(lo, v);
      }
      const sys = t.system || {};
      xs.push(ts); fps.push(m.fps); p50.push(lo); p95.push(m.latency_p95); cpu.push(m.cpu);
      thr.push(sys.throttled === true ? 1 : sys.throttled === false ? 0 : null);
      sensorList.forEach((s, i) => { const v = (sys.temperature_c || {})[s]; temps[i].push(typeof v === "number" ? v : null); });
    }
    const [rx, rfps, rp95] = minuteSteps(rollups, tel);
    return {
      fps: join([[xs, fps], [rx, rfps]]),
      latency: join([[xs, p50, p95], [rx, rp95]]),
      cpu: [xs, cpu],
      temperature: [xs, ...temps, thr],
      sensorList,
    };
  }

  let data = chartData();
  let sensorKey = data.sensorList.join(",");
  function makeTempChart() {
    return lineChart(boxes.temperature.lastChild, {
      series: [
        ...data.sensorList.map((s) => ({ label: s, unit: " °C" })),
        { label: "throttled", scale: "thr", range: [0, 1.05], stepped: true, color: "#e57373", digits: 0,
          ticks: [0, 1], tickLabels: ["no", "yes"] },
      ],
      data: data.temperature,
    });
  }
  const hasData = (arr) => arr.slice(1).some((s) => s.some((v) => v !== null && v !== undefined));
  function renderCharts() {
    for (const [k, el] of Object.entries(boxes)) {
      const body = el.lastChild;
      const ok = hasData(data[k]);
      body.classList.toggle("no-data", !ok);
      if (!ok && !charts[k]) { setText(body, "no data yet"); continue; }
      if (charts[k]) { charts[k].update(data[k]); continue; }
      clear(body);
      if (k === "fps") charts.fps = lineChart(body, { series: [{ label: "fps" }, { label: "fps (1-min mean)", minutes: true }], data: data.fps });
      if (k === "latency") charts.latency = lineChart(body, {
        series: [{ label: "p50", unit: " ms" }, { label: "p95", unit: " ms" }, { label: "p95 (1-min max)", unit: " ms", minutes: true }],
        data: data.latency,
      });
      if (k === "cpu") charts.cpu = lineChart(body, { series: [{ label: "CPU", unit: " %", digits: 0 }], data: data.cpu, yRange: [0, 100] });
      if (k === "temperature") charts.temperature = makeTempChart();
    }
  }

  // ---- sections ----
  function renderInfo() {
    const m = deviceMetrics(d);
    setText(status, m.status);
    status.className = `badge state-${m.status}`;
    clear(facts).append(...[
      fact("Fleet", d.fleet || DASH),
      fact("Groups", (d.groups || []).join(", ") || DASH),
      fact("Last seen", h("span", { title: fmtTime(d.last_seen), class: "last-seen" }, fmtAgo(d.last_seen))),
      fact("FPS", fmtNum(m.fps, 1)),
      fact("p95 latency", m.latency_p95 === null ? DASH : `${fmtNum(m.latency_p95, 1)} ms`),
      fact("CPU", m.cpu === null ? DASH : `${fmtNum(m.cpu, 0)} %`),
      fact("Temperature", m.temperature === null ? DASH : `${fmtNum(m.temperature, 0)} °C${m.throttled ? " (throttled)" : ""}`),
      fact("RSS", m.rss === null ? DASH : fmtBytes(m.rss * 1048576)),
      fact("Spool backlog", m.spool === null ? DASH : `${m.spool} pending`),
      fact("Configuration", configEl),
    ]);

    const st = d.state || {};
    const dels = Array.isArray(st.delegates) ? st.delegates : [];
    const pipes = Array.isArray(st.pipelines) ? st.pipelines : [];
    clear(plan);
    if (!dels.length && !pipes.length) plan.append(emptyState("no state reported yet"));
    if (pipes.length) plan.append(h("div", { class: "table-wrap" }, h("table", { class: "data compact" },
      h("thead", {}, h("tr", {}, ["Pipeline", "Status", "Delegate", "Fallback reason"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, pipes.map((p) => h("tr", { dataset: { pipeline: p.name }, class: p.fallback_reason ? "fallback" : "" },
        h("td", {}, p.name), h("td", {}, p.status || DASH), h("td", {}, h("code", {}, p.delegate || DASH)),
        h("td", {}, p.fallback_reason || DASH)))))));
    if (dels.length) plan.append(h("h3", {}, "Delegates on this device"), h("ul", { class: "plain" },
      dels.map((x) => h("li", { class: x.available ? "ok" : "muted" },
        h("code", {}, x.name), x.available ? " — available" : " — unavailable",
        x.reason ? ` (${x.reason})` : ""))));

    clear(slots);
    const active = versionOf(d);
    const pipeVersions = [...new Set(pipes.map((p) => p.model && p.model.version).filter((v) => v !== undefined && v !== null))];
    slots.append(h("p", {}, h("strong", {}, "active: "), active,
      pipeVersions.length && !pipeVersions.every((v) => String(v) === String(d.model_version))
        ? h("span", { class: "muted" }, ` (pipelines report ${pipeVersions.map((v) => `v${v}`).join(", ")})`) : ""));
    const prev = d.slots && (d.slots.previous || d.slots.inactive);
    slots.append(h("p", {}, h("strong", {}, "previous: "), prev ? slotText(prev) : "unknown"));
  }

  const shown = new Set();
  function addEvents(list, top) {
    for (const e of list) {
      const k = eventKey(e);
      if (shown.has(k)) continue;
      shown.add(k);
      if (top) events.prepend(eventItem(e)); else events.append(eventItem(e));
    }
    while (events.children.length > 50) events.lastElementChild.remove();
    const none = events.querySelector(".empty-item");
    if (events.children.length > 1 && none) none.remove();
    if (!events.children.length) events.append(h("li", { class: "empty-item empty" }, "no events yet"));
  }

  renderInfo();
  // API order is oldest first; show newest first.
  addEvents((Array.isArray(d.events) ? d.events : []).slice().reverse(), false);
  renderCharts();

  const ticker = setInterval(() => {
    const el = facts.querySelector(".last-seen");
    if (el) setText(el, fmtAgo(d.last_seen));
  }, 5000);

  return {
    onEvent(name, payload) {
      live.onEvent(name, payload); // the verdicts of what was asked here (verdict.js)
      if (sampling) sampling.onEvent(name, payload);
      if (name === "devices" && Array.isArray(payload)) {
        const upd = payload.find((x) => x && x.device_id === id);
        if (!upd) return;
        d = { ...d, ...upd };
        renderInfo();
        if (sampling) sampling.refresh();
        // Extend the charts with the new telemetry sample (if it is newer than the last one).
        const t = upd.last_telemetry;
        const ts = t && (t.ts ?? t.timestamp);
        const last = tel.length ? (tel[tel.length - 1].ts ?? tel[tel.length - 1].timestamp) : -Infinity;
        if (t && typeof ts === "number" && ts > last) {
          tel.push(t);
          if (tel.length > TELEMETRY_LIMIT * 2) tel.splice(0, tel.length - TELEMETRY_LIMIT * 2);
          data = chartData();
          const key = data.sensorList.join(",");
          if (key !== sensorKey && charts.temperature) { // new sensor: rebuild that chart's series
            charts.temperature.destroy(); delete charts.temperature; clear(boxes.temperature.lastChild);
            sensorKey = key;
          }
          renderCharts();
        }
      } else if (name === "events" && Array.isArray(payload)) {
        addEvents(payload.filter((e) => e && e.device_id === id), true);
        detections.onEvent(name, payload);
      } else if ((name === "deployment" || name === "deployments") && !configTimer) {
        configTimer = setTimeout(() => { configTimer = null; readConfig(); }, 1000);
      }
    },
    unmount() {
      clearInterval(ticker);
      clearTimeout(configTimer);
      live.unmount();
      if (logs) logs.unmount();
      detections.unmount();
      for (const c of Object.values(charts)) c.destroy();
    },
  };
}

/**
 * The 1-minute roll-ups as steps, each flat over its own minute: [xs, fps means, p95 maxes], two points a minute
 * (its start and just before its end) and a null where a minute is missing. The minutes the page has telemetry
 * for from the newest stored roll-up on (the current minute included) are summed here from that telemetry, so
 * the current minute is live and ends at its newest sample instead of lagging a minute behind.
 */
export function minuteSteps(rollups, tel) {
  const byMinute = new Map(rollups.map((r) => [r.minute, { fps: r.fps_mean ?? null, p95: r.latency_p95_max_ms ?? null }]));
  const liveFrom = rollups.length ? Math.max(...rollups.map((r) => r.minute)) : -Infinity;
  const sums = new Map();
  let newest = -Infinity;
  for (const t of tel) {
    const ts = t.ts ?? t.timestamp;
    if (typeof ts !== "number" || Math.floor(ts / 60) < liveFrom) continue;
    const m = deviceMetrics({ online: true, last_telemetry: t });
    const minute = Math.floor(ts / 60);
    const acc = sums.get(minute) || { n: 0, fps: 0, p95: null };
    if (typeof m.fps === "number") { acc.n += 1; acc.fps += m.fps; }
    if (typeof m.latency_p95 === "number") acc.p95 = Math.max(acc.p95 ?? -Infinity, m.latency_p95);
    sums.set(minute, acc);
    newest = Math.max(newest, ts);
  }
  for (const [minute, acc] of sums) byMinute.set(minute, { fps: acc.n ? acc.fps / acc.n : null, p95: acc.p95 });
  const xs = [], fps = [], p95 = [];
  const minutes = [...byMinute.keys()].sort((a, b) => a - b);
  minutes.forEach((minute, i) => {
    const v = byMinute.get(minute);
    const current = newest >= minute * 60 && newest < minute * 60 + 60; // the minute still going on
    xs.push(minute * 60, current ? Math.max(newest, minute * 60 + 0.001) : minute * 60 + 59.999);
    fps.push(v.fps, v.fps); p95.push(v.p95, v.p95);
    if (i + 1 < minutes.length && minutes[i + 1] !== minute + 1) { xs.push(minute * 60 + 60); fps.push(null); p95.push(null); }
  });
  return [xs, fps, p95];
}

function slotText(s) {
  if (typeof s !== "object") return String(s);
  const parts = [];
  if (s.name || s.model_name) parts.push(s.name || s.model_name);
  if (s.version !== undefined) parts.push(`v${s.version}`);
  if (s.sha256) parts.push(`(${String(s.sha256).slice(0, 12)})`);
  return parts.join(" ") || JSON.stringify(s);
}

function actionsCard(id, getDevice) {
  const enc = encodeURIComponent(id);
  const result = h("p", { "data-testid": "action-result", class: "result", role: "status", "aria-live": "polite" });
  const pipes = () => {
    const st = getDevice().state || {};
    const names = (Array.isArray(st.pipelines) ? st.pipelines : []).map((p) => p.name).filter(Boolean);
    return names.length ? names : ["main"];
  };
  const select = h("select", { id: "restart-pipeline" }, pipes().map((n) => h("option", { value: n }, n)));

  async function run(btn, question, okLabel, path, body, done) {
    if (!(await confirmDialog(question, okLabel))) return;
    btn.disabled = true;
    result.className = "result";
    setText(result, "sending…");
    try {
      await api(path, { method: "POST", body });
      result.className = "result ok";
      setText(result, done);
    } catch (e) {
      result.className = "result error";
      setText(result, `Failed: ${e.message}`);
    } finally {
      btn.disabled = false;
    }
  }

  const restart = h("button", { type: "button", "data-testid": "action-restart" }, "Restart pipeline");
  restart.addEventListener("click", () => {
    const p = select.value || "main";
    run(restart, `Restart pipeline "${p}" on ${id}?`, "Restart", `devices/${enc}/restart`, { pipeline: p },
      `Restart of "${p}" requested.`);
  });
  const rollback = h("button", { type: "button", "data-testid": "action-rollback", class: "danger" }, "Roll back model");
  rollback.addEventListener("click", () => {
    run(rollback, `Roll ${id} back to its previous model?`, "Roll back", `devices/${enc}/rollback`, {},
      "Rollback requested.");
  });

  return h("section", { class: "card" }, h("h2", {}, "Actions"),
    h("div", { class: "row" }, h("label", { for: "restart-pipeline" }, "Pipeline"), select, restart),
    h("div", { class: "row" }, rollback),
    result);
}
