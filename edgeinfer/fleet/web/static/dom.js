// Small DOM + formatting helpers shared by the pages.

/**
 * h("tr", {dataset: {deviceId: "x"}, class: "row"}, child, "text", ...)
 * Attributes: "class", "dataset", "on<event>" (addEventListener — never inline handler attributes,
 * so a strict CSP works), DOM properties for value/checked/hidden/..., otherwise setAttribute.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k in PROPS) el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}
const PROPS = { value: 1, checked: 1, hidden: 1, disabled: 1, selected: 1, textContent: 1 };

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Set text only if it changed (cheap no-op for the common live-update case). */
export function setText(el, text) {
  const t = String(text);
  if (el.textContent !== t) el.textContent = t;
}

export function clear(el) { el.replaceChildren(); return el; }

/** Replace an element's children as h() takes them (nested lists flattened; null, undefined and false left out). */
export function put(el, ...children) { el.replaceChildren(); append(el, children); return el; }

export const DASH = "—";

export function fmtNum(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  return Number(v).toFixed(digits);
}

export function fmtAgo(unixS, now = Date.now() / 1000) {
  if (!unixS) return "never";
  const s = Math.max(0, Math.round(now - unixS));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

export function fmtTime(unixS) {
  if (!unixS) return DASH;
  const d = new Date(unixS * 1000);
  return d.toLocaleString(undefined, { hour12: false });
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return DASH;
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

export function canOperate(role) { return role === "operator" || role === "admin"; }

/** One <dl> entry; wrapped in a <div> so a grid layout keeps each label with its value. */
export function fact(label, value) { return h("div", {}, h("dt", {}, label), h("dd", {}, value)); }

/** Long hex ids (deployment ids, sha256 model names) shortened for display; the full text is the title. */
export function shortId(text, n = 10) {
  const s = String(text ?? "");
  return /^[0-9a-f]{20,}$/i.test(s) ? h("span", { title: s, class: "id" }, `${s.slice(0, n)}…`) : s;
}

export function emptyState(text) { return h("p", { class: "empty" }, text); }

export function deviceLink(id) { return h("a", { href: `#/devices/${encodeURIComponent(id)}` }, id); }

/** Key figures of one /api/devices row; used by the table, the sort and the device page. */
export function deviceMetrics(d) {
  const tel = d.last_telemetry || {};
  const pipes = Array.isArray(tel.pipelines) ? tel.pipelines : [];
  const sys = tel.system || {};
  let fps = null, p95 = null;
  for (const p of pipes) {
    if (typeof p.fps === "number") fps = (fps || 0) + p.fps;
    const v = p.stages && p.stages.latency && p.stages.latency.p95;
    if (typeof v === "number") p95 = p95 === null ? v : Math.max(p95, v);
  }
  const temps = Object.values(sys.temperature_c || {}).filter((t) => typeof t === "number");
  return {
    status: deviceStatus(d),
    fps,
    latency_p95: p95,
    cpu: typeof sys.cpu_percent === "number" ? sys.cpu_percent : null,
    temperature: temps.length ? Math.max(...temps) : null,
    rss: typeof sys.rss_bytes === "number" ? sys.rss_bytes / 1048576 : null,
    spool: tel.spool && typeof tel.spool.pending === "number" ? tel.spool.pending : null,
    throttled: sys.throttled === true,
  };
}

/** "offline" | "degraded" (online but a pipeline is not running or runs on a fallback) | "online". */
export function deviceStatus(d) {
  if (!d.online) return "offline";
  if (typeof d.degraded === "boolean") return d.degraded ? "degraded" : "online"; // server knows best
  const pipes = (d.state && Array.isArray(d.state.pipelines)) ? d.state.pipelines : [];
  const bad = pipes.some((p) => (p.status && p.status !== "running") || p.fallback_reason);
  return bad ? "degraded" : "online";
}

export function versionOf(d) {
  const name = /^[0-9a-f]{20,}$/i.test(d.model_name || "") ? `${d.model_name.slice(0, 10)}…` : d.model_name;
  if (d.model_version !== undefined && d.model_version !== null) return name ? `${name} v${d.model_version}` : `v${d.model_version}`;
  return name || DASH;
}

/** In-page confirmation (<dialog>), so it is stylable and clickable by browser tests. */
export function confirmDialog(message, okLabel = "Confirm") {
  const dlg = document.querySelector("dialog.confirm");
  dlg.querySelector("#confirm-message").textContent = message;
  dlg.querySelector("[data-testid=confirm-ok]").textContent = okLabel;
  return new Promise((resolve) => {
    dlg.returnValue = "";
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
    dlg.showModal();
  });
}
