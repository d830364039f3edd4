// The Configuration tab's parts, shared by its pages (config.js), the device page and the devices list: a status
// badge, a diff, each device's verdict (desired vs applied vs refused, with the device's reason), a layer's history,
// and where each key of a device's effective document comes from. The words are the API's (api/config.py).
import { h, setText, fmtTime, fmtAgo, deviceLink, emptyState, DASH } from "./dom.js";

/** The statuses a device is "out of step" in: not running what its layers say (the overview's count). Everything
 * but in_step and unmanaged; a test checks this list against the API's own count. */
export function outOfStep(status) { return status !== "in_step" && status !== "unmanaged"; }

export const layerHref = (scope, name) => `#/config/${scope}/${encodeURIComponent(name)}`;

export function statusBadge(status) {
  return h("span", { class: `badge config-status config-${status || "unknown"}`, dataset: { status: status || "" } },
    (status || "unknown").replace(/_/g, " "));
}

/** The device page and the device's Configuration tab, side by side. */
export function deviceTabs(id, current) {
  const enc = encodeURIComponent(id);
  const tab = (key, href, label) => h("a", { href, "data-testid": `tab-${key}`,
    "aria-current": current === key ? "page" : false }, label);
  return h("nav", { class: "tabs", "aria-label": `${id}'s pages` },
    tab("device", `#/devices/${enc}`, "Device"), tab("config", layerHref("device", id), "Configuration"));
}

const value = (v) => (v === undefined ? DASH : typeof v === "string" ? v : JSON.stringify(v));
const short = (sha) => (sha ? h("code", { title: sha }, sha.slice(0, 10)) : DASH);

/** A diff (DiffEntry rows: path, op, before, after, secret), values as the API masked them. */
export function diffTable(diff, testid = "cfg-diff") {
  if (!diff || !diff.length) return h("p", { class: "empty", "data-testid": testid, dataset: { count: "0" } }, "no change");
  return h("div", { class: "table-wrap" }, h("table", { class: "data compact diff", "data-testid": testid,
    dataset: { count: String(diff.length) } },
  h("thead", {}, h("tr", {}, ["Key", "Change", "Before", "After"].map((t) => h("th", { scope: "col" }, t)))),
  h("tbody", {}, diff.map((d) => h("tr", { class: `diff-${d.op}`, dataset: { path: d.path, op: d.op } },
    h("td", {}, h("code", {}, d.path)),
    h("td", {}, d.secret ? "secret changed" : d.op),
    h("td", { class: "before" }, d.op === "add" ? DASH : h("code", { class: "wrap" }, value(d.before))),
    h("td", { class: "after" }, d.op === "remove" ? DASH : h("code", { class: "wrap" }, value(d.after))))))));
}

/** Each device's verdict, one row each: {el, apply(statuses)} — rows kept, cells rewritten when they change. */
export function verdictTable() {
  const tbody = h("tbody");
  const rows = new Map();
  const empty = emptyState("no devices");
  const el = h("div", {}, h("div", { class: "table-wrap" }, h("table", { class: "data compact", "data-testid": "cfg-verdicts" },
    h("thead", {}, h("tr", {}, ["Device", "Status", "Desired", "Applied", "Refused (the device's reason)", "Rollout"]
      .map((t) => h("th", { scope: "col" }, t)))), tbody)), empty);
  function apply(statuses, keep = () => true) {
    const seen = new Set();
    for (const d of statuses) {
      if (!keep(d)) continue;
      seen.add(d.device_id);
      let r = rows.get(d.device_id);
      if (!r) {
        const cells = {};
        const td = (k) => (cells[k] = h("td", { dataset: { col: k } }));
        r = { tr: h("tr", { dataset: { deviceId: d.device_id } }, td("device"), td("status"), td("desired"), td("applied"),
          td("refused"), td("rollout")), cells };
        rows.set(d.device_id, r);
      }
      tbody.append(r.tr); // in the order given
      const key = JSON.stringify(d);
      if (r.key === key) continue;
      r.key = key;
      r.tr.dataset.status = d.status;
      r.tr.dataset.online = String(!!d.online);
      r.cells.device.replaceChildren(deviceLink(d.device_id), d.online ? "" : h("span", { class: "muted" }, " (offline)"));
      r.cells.status.replaceChildren(statusBadge(d.status));
      const want = d.desired || {};
      r.cells.desired.replaceChildren(want.problem ? h("span", { class: "error" }, want.problem)
        : h("span", {}, short(want.sha256), " ", h("span", { class: "muted" }, (want.layers || []).map((l) => `${l.layer} r${l.revision}`).join(", "))));
      const got = d.applied;
      r.cells.applied.replaceChildren(got ? h("span", {}, short(got.sha256), got.version != null ? ` v${got.version}` : "",
        want.sha256 && got.sha256 === want.sha256 ? h("span", { class: "ok" }, " = desired") : "") : h("span", { class: "muted" }, "agent.yaml"));
      const no = d.refused;
      r.cells.refused.replaceChildren(no ? h("span", { class: "error", "data-testid": "cfg-refused-reason" },
        `${no.state}${no.reason ? `: ${no.reason}` : ""}`, h("span", { class: "muted" }, ` (v${no.version})`)) : DASH);
      const dep = d.deployment;
      r.cells.rollout.replaceChildren(dep ? h("span", {}, h("a", { href: `#/deployments/${encodeURIComponent(dep.deployment_id)}` }, dep.status),
        " ", h("span", { class: `badge state-${dep.state}` }, dep.state)) : DASH);
    }
    for (const [id, r] of rows) if (!seen.has(id)) { r.tr.remove(); rows.delete(id); }
    empty.hidden = rows.size > 0;
  }
  return { el, apply };
}

/** A layer's revisions, newest first, each with its diff; a Roll back button on each but the newest (operators). */
export function historyList(revisions, onRollBack) {
  if (!revisions.length) return emptyState("never saved");
  const newest = revisions[0].revision;
  return h("ol", { class: "history", "data-testid": "cfg-history-list" }, revisions.map((r) => h("li", { dataset: { revision: String(r.revision) } },
    h("div", { class: "row" },
      h("strong", {}, `r${r.revision}`),
      h("span", {}, r.author || DASH, r.role ? h("span", { class: "muted" }, ` (${r.role})`) : ""),
      h("time", { title: fmtTime(r.created_at), class: "muted" }, fmtAgo(r.created_at)),
      r.applied_at ? null : h("span", { class: "badge", "data-testid": "cfg-draft" }, "draft"),
      r.restored_from ? h("span", { class: "badge" }, `roll back to r${r.restored_from}`) : null,
      r.revision === newest ? h("span", { class: "badge state-active" }, "newest") : null,
      onRollBack && r.revision !== newest ? h("button", { type: "button", "data-testid": "cfg-rollback", dataset: { revision: String(r.revision) },
        onclick: () => onRollBack(r.revision) }, `Roll back to r${r.revision}`) : null),
    h("p", { class: "history-message" }, r.message || h("span", { class: "muted" }, "(no message)")),
    h("details", {}, h("summary", {}, `${(r.diff || []).length} key${(r.diff || []).length === 1 ? "" : "s"} changed`),
      diffTable(r.diff, "cfg-history-diff")))));
}

/** The value at a path of the API's origins (`pipelines[main].backoff.max_s`: pipelines by name). */
function valueAt(document, path) {
  const m = path.match(/^pipelines\[([^\]]*)\]\.?(.*)$/);
  let at = document;
  let rest = path;
  if (m) {
    at = (document.pipelines || []).find((p) => p && p.name === m[1]);
    rest = m[2];
  }
  for (const key of rest ? rest.split(".") : []) at = at && typeof at === "object" ? at[key] : undefined;
  return at;
}

/** Where each key of a device's effective document comes from: a layer, or its own agent.yaml (DeviceConfig). */
export function effectiveTable(found) {
  const rows = Object.entries(found.origins || {}).map(([path, layer]) => [path, valueAt(found.document || {}, path), layer]);
  for (const key of found.bootstrap || []) rows.push([key, undefined, "agent.yaml"]);
  if (!rows.length) return emptyState("no layer sets anything: the device runs its agent.yaml");
  return h("div", { class: "table-wrap" }, h("table", { class: "data compact", "data-testid": "cfg-origins" },
    h("thead", {}, h("tr", {}, ["Key", "Value", "From"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows.map(([path, v, layer]) => h("tr", { dataset: { path, origin: layer } },
      h("td", {}, h("code", {}, path)),
      h("td", {}, layer === "agent.yaml" ? h("span", { class: "muted" }, "the device's own") : h("code", { class: "wrap" }, value(v))),
      h("td", {}, layer === "agent.yaml" ? layer : h("a", { href: layerHref(...layer.split(/:(.*)/s)) }, layer)))))));
}

/** Counts per status as chips, each a link to the devices in that status. */
export function countChips(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n);
  if (!entries.length) return emptyState("no devices");
  return h("ul", { class: "chips", "data-testid": "cfg-counts" }, entries.map(([s, n]) => h("li", { dataset: { status: s } },
    h("a", { href: `#/config?status=${s}` }, statusBadge(s), ` ${n}`))));
}

export function say(el, text, kind = "") {
  el.className = `result ${kind}`.trim();
  setText(el, text);
}
