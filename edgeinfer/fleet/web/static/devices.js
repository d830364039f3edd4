// Devices table. Built for ~1,000 rows: each row is created once, change-feed updates rewrite only the
// cells that changed, and sort/filter reorder or hide the existing <tr> nodes.
import { api } from "./api.js";
import { h, setText, fmtNum, fmtAgo, deviceMetrics, versionOf, DASH } from "./dom.js";

const COLS = [
  // [key, header, numeric, cell text]
  ["device", "Device", false, null],
  ["state", "State", false, (d, m) => m.status],
  ["groups", "Groups", false, (d) => (d.groups || []).join(", ") || DASH],
  ["version", "Version", false, (d) => versionOf(d)],
  ["delegate", "Delegate", false, (d) => d.delegate || DASH],
  ["fps", "FPS", true, (d, m) => fmtNum(m.fps, 1)],
  ["latency_p95", "p95 ms", true, (d, m) => fmtNum(m.latency_p95, 1)],
  ["cpu", "CPU %", true, (d, m) => fmtNum(m.cpu, 0)],
  ["temperature", "Temp °C", true, (d, m) => fmtNum(m.temperature, 0)],
  ["rss", "RSS MiB", true, (d, m) => fmtNum(m.rss, 0)],
  ["spool", "Spool", true, (d, m) => fmtNum(m.spool, 0)],
  ["last_seen", "Last seen", true, (d) => fmtAgo(d.last_seen)],
  ["config", "Config", false, (d) => (d.config_status || DASH).replace(/_/g, " ")],
];
// Each device's configuration status (api/config/devices) is read again this often, and soon after a deployment moves.
const CONFIG_EVERY_MS = 10000;

// Kept across visits (and the re-mount after a stream reconnect).
const view = { filter: "", sort: "device", dir: 1 };

export async function devicesPage(root) {
  const list = await api("devices");
  const rows = new Map(); // device_id -> {tr, cells, d, m, search}

  const tbody = h("tbody");
  const count = h("span", { "data-testid": "devices-count" });
  const empty = h("p", { class: "empty", hidden: true }, "no devices yet");
  const filter = h("input", {
    id: "devices-filter", type: "search", "data-testid": "devices-filter", value: view.filter,
    placeholder: "id, group, version, delegate, state", autocomplete: "off",
  });
  const ths = COLS.map(([key, label, numeric]) => h("th", { scope: "col", class: numeric ? "num" : "", dataset: { col: key } },
    h("button", { type: "button", class: "sort", dataset: { sort: key }, onclick: () => sortBy(key) }, label)));

  root.replaceChildren(h("div", { "data-testid": "devices" },
    h("div", { class: "page-head" },
      h("h1", {}, "Devices"),
      h("p", { class: "muted" }, count, " shown")),
    h("div", { class: "toolbar" },
      h("label", { for: "devices-filter" }, "Filter"), filter),
    h("div", { class: "table-wrap" },
      h("table", { class: "data", "data-testid": "devices-table" },
        h("thead", {}, h("tr", {}, ths)), tbody)),
    empty));

  function makeRow(d) {
    const cells = {};
    const tr = h("tr", { dataset: { deviceId: d.device_id } }, COLS.map(([key, , numeric]) => {
      const td = cells[key] = h("td", { dataset: { col: key }, class: numeric ? "num" : "" });
      if (key === "device") td.append(h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id));
      return td;
    }));
    const r = { tr, cells, d: null, m: null, search: "" };
    rows.set(d.device_id, r);
    return r;
  }

  function fill(r, d) {
    const m = deviceMetrics(d);
    r.d = d; r.m = m;
    for (const [key, , , text] of COLS) if (text) setText(r.cells[key], text(d, m));
    r.tr.dataset.state = m.status;
    r.cells.state.className = `state-${m.status}`;
    r.cells.temperature.classList.toggle("hot", m.throttled);
    r.cells.config.className = d.config_status ? `config-${d.config_status}` : "";
    r.search = [d.device_id, ...(d.groups || []), d.fleet, versionOf(d), d.model_name, d.model_version,
      d.delegate, m.status, d.config_status].filter((x) => x !== undefined && x !== null).join(" ").toLowerCase();
  }

  function sortKey(r, key) {
    switch (key) {
      case "device": return r.d.device_id;
      case "state": return r.m.status;
      case "groups": return (r.d.groups || []).join(",");
      case "version": return versionOf(r.d);
      case "delegate": return r.d.delegate || "";
      case "last_seen": return r.d.last_seen || 0;
      case "config": return r.d.config_status;
      default: return r.m[key];
    }
  }

  function applySort() {
    const { sort, dir } = view;
    // Extract each key once (not once per comparison).
    const arr = [...rows.values()].map((r) => [sortKey(r, sort), r.d.device_id, r]);
    const coll = new Intl.Collator(undefined, { numeric: true });
    arr.sort(([x, ia], [y, ib]) => {
      // Missing values always go last, whatever the direction.
      if (x === null || x === undefined) return (y === null || y === undefined) ? coll.compare(ia, ib) : 1;
      if (y === null || y === undefined) return -1;
      const c = typeof x === "number" && typeof y === "number" ? x - y : coll.compare(String(x), String(y));
      return (c || coll.compare(ia, ib)) * dir;
    });
    // Skip the DOM work when the order did not change (the common case for change-feed updates).
    const order = arr.map((e) => e[2].tr);
    if (order.length === tbody.children.length && order.every((tr, i) => tbody.children[i] === tr)) return markSorted();
    // Appending existing nodes moves them; one fragment = one reflow.
    const frag = document.createDocumentFragment();
    for (const tr of order) frag.append(tr);
    tbody.append(frag);
    markSorted();
  }

  function markSorted() {
    const { sort, dir } = view;
    for (const th of ths) {
      const active = th.dataset.col === sort;
      if (active) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  function applyFilter() {
    const terms = view.filter.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const r of rows.values()) {
      const ok = terms.every((t) => r.search.includes(t));
      if (r.tr.hidden === ok) r.tr.hidden = !ok;
      if (ok) shown++;
    }
    setText(count, shown);
    empty.hidden = rows.size > 0;
  }

  function sortBy(key) {
    view.dir = view.sort === key ? -view.dir : 1;
    view.sort = key;
    applySort();
  }

  // Change-feed updates can arrive many times a second; re-sort at most every 100 ms.
  // (setTimeout rather than requestAnimationFrame, which stalls in background tabs.)
  let pending = 0;
  function scheduleSort() {
    if (pending) return;
    pending = setTimeout(() => { pending = 0; applySort(); }, 100);
  }

  // Filtering 1,000 precomputed strings is cheap enough to do on every keystroke.
  filter.addEventListener("input", () => { view.filter = filter.value; applyFilter(); });

  for (const d of list || []) fill(makeRow(d), d);
  applySort();
  applyFilter();

  // "12 s ago" must keep counting without a server message.
  const ticker = setInterval(() => {
    const now = Date.now() / 1000;
    for (const r of rows.values()) setText(r.cells.last_seen, fmtAgo(r.d.last_seen, now));
  }, 5000);

  const configOf = new Map(); // device id -> its configuration status
  let configTimer = 0, unmounted = false;
  async function readConfig() {
    clearTimeout(configTimer);
    if (unmounted) return;
    try {
      for (const c of (await api("config/devices")).devices) configOf.set(c.device_id, c.status);
      for (const r of rows.values()) if (r.d.config_status !== configOf.get(r.d.device_id)) fill(r, { ...r.d, config_status: configOf.get(r.d.device_id) });
      applyFilter();
      if (view.sort === "config") scheduleSort();
    } catch (e) {
      console.warn("configuration:", e.message);
    }
    if (!unmounted) configTimer = setTimeout(readConfig, CONFIG_EVERY_MS);
  }
  readConfig();

  const page = {
    async refresh() { page.onEvent("devices", await api("devices")); },
    onEvent(name, payload) {
      if (name === "deployment" || name === "deployments") { clearTimeout(configTimer); configTimer = setTimeout(readConfig, 1000); }
      if (name !== "devices" || !Array.isArray(payload)) return;
      for (const d of payload) {
        if (!d || !d.device_id) continue;
        let r = rows.get(d.device_id);
        if (!r) {
          r = makeRow(d);
          tbody.append(r.tr); // in the DOM now; moved to its sorted place by scheduleSort()
        }
        fill(r, { ...d, config_status: configOf.get(d.device_id) });
      }
      applyFilter(); // a changed state/version may change what matches; O(rows), no DOM writes unless needed
      scheduleSort();
    },
    unmount() {
      clearInterval(ticker);
      clearTimeout(pending);
      clearTimeout(configTimer);
      unmounted = true;
    },
  };
  return page;
}
