// Deployments: the list (+ create form for operators) and one deployment's live wave view.
import { api, apiSchema } from "./api.js";
import { h, clear, setText, emptyState, fmtTime, canOperate, confirmDialog, deviceLink, fact, shortId, DASH } from "./dom.js";

// The target states in the order a device passes through them (link/vocabulary.py TargetState).
const DEVICE_STATES = ["pending", "notified", "downloading", "validating", "active", "failed", "rolled_back", "rejected", "timeout"];

function countsText(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n);
  entries.sort((a, b) => DEVICE_STATES.indexOf(a[0]) - DEVICE_STATES.indexOf(b[0]));
  return entries;
}

function countChips(counts) {
  const entries = countsText(counts);
  if (!entries.length) return DASH;
  return h("ul", { class: "chips" }, entries.map(([s, n]) => h("li", { class: `state-${s}` }, `${s} ${n}`)));
}

// ---- list -----------------------------------------------------------------

export async function deploymentsPage(root, ctx) {
  const list = await api("deployments");
  const rows = new Map();
  const tbody = h("tbody");
  const empty = h("p", { class: "empty" }, "no deployments yet");

  function fill(r, dep) {
    r.tr.dataset.status = dep.status;
    setText(r.cells.status, dep.status || DASH);
    r.cells.status.className = `status-${dep.status}`;
    setText(r.cells.kind, dep.kind || "model");
    r.cells.model.replaceChildren(shortId(dep.model_name || DASH));
    setText(r.cells.version, dep.version ?? DASH);
    r.cells.counts.replaceChildren(countChips(dep.counts));
    setText(r.cells.created, fmtTime(dep.created_at));
    setText(r.cells.detail, dep.detail || "");
  }
  function upsert(dep, top) {
    if (!dep || dep.deployment_id === undefined) return;
    let r = rows.get(String(dep.deployment_id));
    if (!r) {
      const cells = {};
      const td = (k, cls) => (cells[k] = h("td", { dataset: { col: k }, class: cls || "" }));
      const tr = h("tr", { dataset: { deploymentId: dep.deployment_id } },
        h("td", { dataset: { col: "id" } }, h("a", { href: `#/deployments/${encodeURIComponent(dep.deployment_id)}` }, shortId(dep.deployment_id))),
        td("status"), td("kind"), td("model"), td("version"), td("counts"), td("created"), td("detail", "muted"));
      r = { tr, cells };
      rows.set(String(dep.deployment_id), r);
      if (top) tbody.prepend(tr); else tbody.append(tr);
    }
    fill(r, dep);
    empty.hidden = rows.size > 0;
  }

  root.replaceChildren(h("div", { "data-testid": "deployments" },
    h("h1", {}, "Deployments"),
    canOperate(ctx.me.role) ? deployForm(await apiSchema("DeploymentSpec")) : null,
    h("section", { class: "card" },
      h("h2", {}, "All deployments"),
      h("div", { class: "table-wrap" }, h("table", { class: "data" },
        h("thead", {}, h("tr", {}, ["ID", "Status", "Kind", "Artifact", "Version", "Devices by state", "Created", "Detail"]
          .map((t) => h("th", { scope: "col" }, t)))),
        tbody)),
      empty)));

  // Newest first, as live-created ones are added at the top.
  const byNewest = (a, b) => (b.created_at || 0) - (a.created_at || 0);
  for (const dep of (list || []).slice().sort(byNewest)) upsert(dep, false);
  empty.hidden = rows.size > 0;

  return {
    async refresh() { for (const dep of (await api("deployments")) || []) upsert(dep, false); },
    onEvent(name, payload) {
      if (name === "deployments" && Array.isArray(payload)) for (const dep of payload) upsert(dep, true);
      else if (name === "deployment" && payload) upsert(payload, true);
    },
  };
}

// One field of the API's DeploymentSpec: its type, bounds and default (a nullable field's non-null branch).
function specField(spec, key) {
  const prop = spec.properties[key] || {};
  const value = (prop.anyOf || [prop]).find((p) => p.type && p.type !== "null") || prop;
  return {
    integer: value.type === "integer", low: value.minimum ?? value.exclusiveMinimum, high: value.maximum,
    lowOpen: value.exclusiveMinimum !== undefined, fallback: prop.default ?? null,
  };
}

// What is wrong with a number typed for `field`, by the DeploymentSpec's own bounds; null when nothing is.
function numberProblem(field, label, text) {
  const v = Number(text);
  const range = field.high === undefined ? `${field.lowOpen ? "above" : "at least"} ${field.low}`
    : `between ${field.low} and ${field.high}`;
  const what = field.integer ? "a whole number" : "a number";
  const ok = text !== "" && Number.isFinite(v) && (!field.integer || Number.isInteger(v))
    && (field.low === undefined || (field.lowOpen ? v > field.low : v >= field.low))
    && (field.high === undefined || v <= field.high);
  return ok ? null : `${label} must be ${what} ${range}.`;
}

// The create form. Its bounds, steps and placeholders come from the DeploymentSpec schema of the API's OpenAPI
// document, so they cannot drift from what the manager checks; the manager's 400 says the rest.
function deployForm(spec) {
  const field = (id, label, input, hint) => h("div", { class: "field" },
    h("label", { for: id }, label), input, hint ? h("small", { class: "muted", id: `${id}-hint` }, hint) : null);
  const number = (id, key, testid) => {
    const f = specField(spec, key);
    return h("input", { id, type: "number", min: f.low, max: f.high, step: f.integer ? 1 : "any",
      "data-testid": testid, dataset: { specKey: key },
      placeholder: f.fallback === null ? "server default" : String(f.fallback) });
  };
  const bounds = (key) => { const f = specField(spec, key); return `${f.low}–${f.high}`; };
  const file = h("input", { id: "deploy-file", type: "file", "data-testid": "deploy-file", required: true });
  const name = h("input", { id: "deploy-name", type: "text", "data-testid": "deploy-model-name", autocomplete: "off",
    placeholder: "the file's name" });
  const version = h("input", { id: "deploy-version", type: "text", inputmode: "numeric", pattern: "[0-9]+",
    "data-testid": "deploy-version", required: true, autocomplete: "off" });
  const target = h("select", { id: "deploy-target", "data-testid": "deploy-target" },
    h("option", { value: "all" }, "All devices"), h("option", { value: "group" }, "A group"),
    h("option", { value: "devices" }, "Device ids"));
  const targetValue = h("input", { id: "deploy-target-value", type: "text", "data-testid": "deploy-target-value",
    autocomplete: "off", placeholder: "group name, or ids separated by commas/spaces" });
  const canary = number("deploy-canary", "canary_pct", "deploy-canary");
  const wave = number("deploy-wave-size", "wave_size", "deploy-wave-size");
  const abortRate = number("deploy-abort-rate", "abort_failure_pct", "deploy-abort-rate");
  const timeout = number("deploy-timeout", "device_timeout_s", "deploy-timeout");
  const analysis = h("input", { id: "deploy-canary-analysis", type: "checkbox", checked: true, "data-testid": "deploy-canary-analysis" });
  const canaryWindow = number("deploy-canary-window", "canary_window_s", "deploy-canary-window");
  const maxLatency = number("deploy-max-latency", "max_latency_regression", "deploy-max-latency");
  const maxDrift = number("deploy-max-drift", "max_output_drift", "deploy-max-drift");
  const submit = h("button", { type: "submit", class: "primary", "data-testid": "deploy-submit" }, "Upload and deploy");
  const error = h("p", { class: "error", "data-testid": "deploy-error", role: "alert", "aria-live": "assertive" });
  const progress = h("p", { class: "muted", role: "status", "aria-live": "polite" });
  const targetField = field("deploy-target-value", "Group / device ids", targetValue);

  const syncTarget = () => { targetField.hidden = target.value === "all"; };
  target.addEventListener("change", syncTarget);
  syncTarget();

  const form = h("form", { class: "card deploy-form", "data-testid": "deploy-form", novalidate: true },
    h("h2", {}, "New deployment"),
    h("div", { class: "form-grid" },
      field("deploy-file", "Model file", file),
      field("deploy-name", "Model name", name),
      field("deploy-version", "Version", version),
      field("deploy-target", "Target", target),
      targetField,
      field("deploy-canary", "Canary %", canary, bounds("canary_pct")),
      field("deploy-wave-size", "Wave size", wave, "devices per wave"),
      field("deploy-abort-rate", "Abort failure rate (%)", abortRate, `${bounds("abort_failure_pct")}, e.g. 20, as edgeinfer deploy --abort-failure-rate`),
      field("deploy-timeout", "Device timeout (s)", timeout),
      field("deploy-canary-analysis", "Canary analysis", analysis, "judge the canary on its telemetry"),
      field("deploy-canary-window", "Canary window (s)", canaryWindow, "telemetry watched before judging"),
      field("deploy-max-latency", "Max latency regression (%)", maxLatency),
      field("deploy-max-drift", "Max output drift", maxDrift, `total variation, ${bounds("max_output_drift")}`)),
    h("div", { class: "row" }, submit), progress, error);

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setText(error, "");
    const f = file.files && file.files[0];
    const body = {
      model_name: name.value.trim() || (f ? f.name : ""), // like the CLI: the file's name by default
    };
    // Checked here, by the DeploymentSpec's bounds, so the operator learns of a mistake before a large upload.
    if (!f) return setText(error, "Choose a model file.");
    const versionProblem = numberProblem(specField(spec, "version"), "The version", version.value.trim());
    if (versionProblem) return setText(error, versionProblem);
    body.version = Number(version.value.trim());
    const tv = targetValue.value.trim();
    if (target.value === "all") body.all = true;
    else if (target.value === "group") {
      if (!tv) return setText(error, "Enter a group name.");
      body.group = tv;
    } else {
      const ids = tv.split(/[\s,]+/).filter(Boolean);
      if (!ids.length) return setText(error, "Enter at least one device id.");
      body.devices = ids;
    }
    for (const input of [canary, wave, abortRate, timeout, canaryWindow, maxLatency, maxDrift]) {
      const text = input.value.trim();
      if (text === "") continue;
      const key = input.dataset.specKey;
      const problem = numberProblem(specField(spec, key), input.labels[0].textContent, text);
      if (problem) return setText(error, problem);
      body[key] = Number(text);
    }
    body.canary_analysis = analysis.checked;

    submit.disabled = true;
    try {
      setText(progress, `Uploading ${f.name}…`);
      const art = await api("artifacts", { method: "PUT", body: f });
      body.sha256 = art.sha256;
      setText(progress, "Creating the deployment…");
      const dep = await api("deployments", { method: "POST", body });
      setText(progress, "");
      location.hash = `#/deployments/${encodeURIComponent(dep.deployment_id)}`;
    } catch (e) {
      setText(progress, "");
      setText(error, e.message);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

// ---- one deployment --------------------------------------------------------

export async function deploymentPage(root, ctx, id) {
  let dep = await api(`deployments/${encodeURIComponent(id)}`);
  const status = h("span", { "data-testid": "deployment-status", class: "badge" });
  const summary = h("dl", { class: "facts" });
  const counts = h("div");
  const waves = wavesView();
  const result = h("p", { class: "result", "data-testid": "action-result", role: "status", "aria-live": "polite" });

  let abortBtn = null;
  if (canOperate(ctx.me.role)) {
    abortBtn = h("button", { type: "button", class: "danger", "data-testid": "action-abort" }, "Abort deployment");
    abortBtn.addEventListener("click", async () => {
      if (!(await confirmDialog(`Abort deployment #${dep.deployment_id}? Devices not yet updated stay on their current model.`, "Abort"))) return;
      abortBtn.disabled = true;
      try {
        const r = await api(`deployments/${encodeURIComponent(id)}/abort`, { method: "POST", body: {} });
        result.className = "result ok";
        setText(result, "Abort requested.");
        if (r && r.status) apply({ ...dep, ...r });
      } catch (e) {
        result.className = "result error";
        setText(result, `Failed: ${e.message}`);
        abortBtn.disabled = false;
      }
    });
  }
  const actions = h("div", { class: "row" });

  root.replaceChildren(h("div", { "data-testid": "deployment", dataset: { deploymentId: id } },
    h("p", { class: "crumbs" }, h("a", { href: "#/deployments" }, "Deployments"), " / "),
    h("div", { class: "page-head" }, h("h1", {}, "Deployment ", shortId(dep.deployment_id ?? id)), status),
    summary, counts, actions, result,
    h("section", { class: "card" }, h("h2", {}, "Waves"), waves.el)));

  function apply(next) {
    dep = next;
    setText(status, dep.status || DASH);
    status.className = `badge status-${dep.status}`;
    const opt = dep.options || {};
    clear(summary).append(...[
      fact("ID", h("code", { class: "wrap" }, String(dep.deployment_id ?? id))),
      fact("Kind", dep.kind || "model"),
      fact(dep.kind === "agent" ? "Agent" : "Model", [shortId(dep.model_name || "?"), ` v${dep.version ?? "?"}`]),
      fact("Created", fmtTime(dep.created_at)),
      dep.detail ? fact("Detail", dep.detail) : null,
      ...Object.entries(opt).filter(([, v]) => v !== null && v !== undefined)
        .map(([k, v]) => fact(k.replace(/_/g, " "), typeof v === "object" ? JSON.stringify(v) : String(v))),
    ].filter(Boolean));
    counts.replaceChildren(countChips(dep.counts), analysisCard(dep.analysis));

    waves.apply(dep);

    // The abort button exists only while the deployment runs.
    if (abortBtn) {
      if (dep.status === "running") { if (!abortBtn.isConnected) { abortBtn.disabled = false; actions.append(abortBtn); } }
      else abortBtn.remove();
    }
  }

  apply(dep);
  return {
    async refresh() { apply(await api(`deployments/${encodeURIComponent(id)}`)); },
    onEvent(name, payload) {
      if (name === "deployment" && payload && String(payload.deployment_id) === String(dep.deployment_id)) {
        apply({ ...dep, ...payload });
      } else if (name === "deployments" && Array.isArray(payload)) {
        const s = payload.find((x) => x && String(x.deployment_id) === String(dep.deployment_id));
        if (s) apply({ ...dep, ...s, devices: dep.devices }); // a summary has no device rows: keep ours
      }
    },
  };
}

/** The waves of a deployment and each device's state in them: {el, apply(deployment)} (also the Configuration tab's
 * view of a rollout). */
export function wavesView() {
  const wavesEl = h("div", { class: "waves" });
  const waves = new Map(); // wave number -> {section, list, progress}
  const devs = new Map(); // device id -> li

  function waveFor(n) {
    let w = waves.get(n);
    if (w) return w;
    const list = h("ul", { class: "wave-devices" });
    const progress = h("span", { "data-testid": "wave-progress", class: "muted" });
    const section = h("section", { "data-testid": "wave", dataset: { wave: n }, class: "wave" },
      h("h3", {}, n === 0 ? "Wave 0 (canary)" : `Wave ${n}`, " ", progress), list);
    w = { section, list, progress };
    waves.set(n, w);
    // Keep waves in numeric order even when a later one appears first.
    const after = [...waves.keys()].filter((k) => k > n).sort((a, b) => a - b)[0];
    if (after !== undefined) wavesEl.insertBefore(section, waves.get(after).section);
    else wavesEl.append(section);
    return w;
  }

  function apply(dep) {
    if (Array.isArray(dep.devices)) {
      for (const dv of dep.devices) {
        const n = Number(dv.wave) || 0;
        let li = devs.get(dv.device_id);
        const w = waveFor(n);
        if (!li) {
          li = h("li", { dataset: { deviceId: dv.device_id } }, deviceLink(dv.device_id), " ",
            h("span", { class: "badge dev-state" }), h("span", { class: "muted dev-detail" }));
          devs.set(dv.device_id, li);
        }
        if (li.parentNode !== w.list) w.list.append(li);
        li.dataset.state = dv.state;
        const badge = li.querySelector(".dev-state");
        setText(badge, dv.state);
        badge.className = `badge dev-state state-${dv.state}`;
        setText(li.querySelector(".dev-detail"), dv.detail ? ` ${dv.detail}` : "");
        li.title = dv.updated_at ? `updated ${fmtTime(dv.updated_at)}` : "";
      }
      for (const w of waves.values()) {
        const items = [...w.list.children];
        const active = items.filter((li) => li.dataset.state === "active").length;
        setText(w.progress, `${active}/${items.length} active`);
      }
    }
    if (!waves.size && !wavesEl.querySelector(".empty")) wavesEl.append(emptyState("no devices in this deployment"));
    if (waves.size) { const e = wavesEl.querySelector(".empty"); if (e) e.remove(); }

  }
  return { el: wavesEl, apply };
}

// The canary verdict: one row per metric, canary against control (or the canary before the update).
function analysisCard(analysis) {
  if (!analysis || analysis.passed === undefined) return h("span");
  const fmt = (v) => (v === null || v === undefined ? DASH : Number(v).toPrecision(3));
  const rows = (analysis.metrics || []).map((m) => h("tr", { dataset: { metric: m.name, passed: String(m.passed) } },
    h("td", {}, m.label), h("td", {}, fmt(m.canary)), h("td", {}, fmt(m.control)), h("td", {}, fmt(m.change)),
    h("td", {}, `${m.threshold}`), h("td", { class: m.passed ? "ok" : "error" }, !m.judged ? "not judged" : m.passed ? "pass" : "FAIL")));
  return h("section", { class: "card", "data-testid": "canary-analysis" },
    h("h2", {}, "Canary analysis"),
    h("p", { class: analysis.passed ? "result ok" : "result error" }, analysis.summary || ""),
    h("table", {}, h("thead", {}, h("tr", {}, ...["Metric", "Canary", analysis.baseline === "before" ? "Before" : "Control",
      "Change", "Threshold", ""].map((t) => h("th", {}, t)))), h("tbody", {}, ...rows)));
}
