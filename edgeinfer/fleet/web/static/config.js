// The Configuration tab (docs/fleet.md, *The dashboard's Configuration tab*): #/config lists every device's status
// and the layers saved; #/config/<scope>/<name> edits a layer — the fleet's, a group's or a device's — as a form
// generated from the layer's JSON Schema (config_form.js) or as YAML or JSON text, each edit judged by the manager as
// a save would be (POST …/check: the key and agent --check's words, the diff, secrets masked) before Save is offered;
// then the rollout (its waves, each device's state) and each device's verdict — desired vs applied vs refused, with
// the device's reason — live; the history with a roll back to any revision, its diff shown first. Operators edit;
// viewers read (no edit control: the API would refuse them anyway).
import { api, apiSchema, ApiError } from "./api.js";
import { h, put, setText, fmtAgo, fmtTime, canOperate, shortId, emptyState, DASH } from "./dom.js";
import { schemaForm } from "./config_form.js";
import { wavesView } from "./deployments.js";
import { countChips, deviceTabs, diffTable, effectiveTable, historyList, layerHref, outOfStep, say, statusBadge,
  verdictTable } from "./config_parts.js";

const CHECK_DELAY_MS = 200; // after the last keystroke
const POLL_MS = 1000; // the devices' verdicts while a rollout runs
const IDLE_POLL_MS = 5000;

const layerPath = (scope, name) => `config/layers/${scope}/${encodeURIComponent(name)}`;

// ---- #/config ---------------------------------------------------------------------------------------------------

export async function configIndexPage(root, ctx, _match, params) {
  const [schema, found, layers, devices] = await Promise.all([api("config/schema"), api("config/devices"),
    api("config/layers"), api("devices")]);
  const filter = h("select", { id: "cfg-filter", "data-testid": "cfg-filter" },
    h("option", { value: "" }, "every device"), h("option", { value: "out-of-step" }, "out of step (every status but in step and unmanaged)"),
    schema.statuses.map((s) => h("option", { value: s }, s.replace(/_/g, " "))));
  filter.value = params.get("status") || "";
  const counts = h("div");
  const outCount = h("span", { "data-testid": "cfg-out-of-step" });
  const verdicts = verdictTable();
  const groups = new Map(); // group -> devices
  const fleets = new Map();
  for (const d of devices || []) {
    for (const g of d.groups || []) groups.set(g, (groups.get(g) || 0) + 1);
    if (d.fleet) fleets.set(d.fleet, (fleets.get(d.fleet) || 0) + 1);
  }
  const scope = h("select", { id: "cfg-open-scope", "data-testid": "cfg-open-scope" }, schema.scopes.map((s) => h("option", { value: s }, s)));
  const name = h("input", { id: "cfg-open-name", type: "text", "data-testid": "cfg-open-name", autocomplete: "off", required: true });
  const open = h("form", { class: "row", "data-testid": "cfg-open", onsubmit: (ev) => {
    ev.preventDefault();
    if (name.value.trim()) location.hash = layerHref(scope.value, name.value.trim());
  } }, h("label", { for: scope.id }, "Layer"), scope, h("label", { for: name.id, class: "visually-hidden" }, "Name"), name,
  h("button", { type: "submit" }, "Open"));
  const known = (label, scopeName, map) => h("p", {}, h("strong", {}, label), " ",
    [...map].sort().map(([n, c]) => [h("a", { href: layerHref(scopeName, n) }, `${n}`), h("span", { class: "muted" }, ` (${c}) `)]));

  root.replaceChildren(h("div", { "data-testid": "config-index" },
    h("h1", {}, "Configuration"),
    h("section", { class: "card" }, h("h2", {}, "Devices"), counts,
      h("p", {}, outCount, " out of step (they do not run what their layers say)"),
      h("div", { class: "toolbar" }, h("label", { for: filter.id }, "Show"), filter), verdicts.el),
    h("section", { class: "card" }, h("h2", {}, "Layers saved"), layersTable(layers)),
    h("section", { class: "card" }, h("h2", {}, "Open a layer"),
      h("p", { class: "muted" }, "From the weakest to the strongest: the device's own agent.yaml, then ",
        schema.scopes.join(" → "), ". A group's layer reaches every device that lists the group in its agent.yaml."),
      known("Fleets:", "fleet", fleets), known("Groups:", "group", groups), open)));

  function render(answer) {
    counts.replaceChildren(countChips(answer.counts));
    setText(outCount, answer.out_of_step);
    const want = filter.value;
    verdicts.apply(answer.devices, (d) => !want || (want === "out-of-step" ? outOfStep(d.status) : d.status === want));
  }
  let last = found;
  filter.addEventListener("change", () => {
    render(last);
    history.replaceState(null, "", filter.value ? `#/config?status=${filter.value}` : "#/config");
  });
  render(found);
  const poll = poller(async () => { last = await api("config/devices"); render(last); }, IDLE_POLL_MS);
  return { refresh: poll.now, onEvent: (n) => { if (n === "deployment" || n === "deployments") poll.soon(); }, unmount: poll.stop };
}

function layersTable(layers) {
  if (!layers.length) return emptyState("no layer saved yet");
  return h("div", { class: "table-wrap" }, h("table", { class: "data", "data-testid": "cfg-layers" },
    h("thead", {}, h("tr", {}, ["Layer", "Revision", "By", "When", "Message"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, layers.map((l) => h("tr", { dataset: { layer: l.layer } },
      h("td", {}, h("a", { href: layerHref(l.scope, l.name) }, l.layer)),
      h("td", {}, `r${l.revision}`, l.applied_at ? "" : h("span", { class: "badge" }, " draft")),
      h("td", {}, l.author || DASH), h("td", { title: fmtTime(l.created_at) }, fmtAgo(l.created_at)),
      h("td", { class: "muted" }, l.message || ""))))));
}

/** fn() now and every `every` ms (soon(): within a moment, once); errors are logged, never thrown. */
function poller(fn, every) {
  let timer = null, stopped = false, running = null, period = every;
  const run = async () => {
    clearTimeout(timer);
    if (stopped) return;
    if (!running) running = fn().catch((e) => console.warn("config:", e.message)).finally(() => { running = null; });
    await running;
    if (!stopped) timer = setTimeout(run, period);
  };
  timer = setTimeout(run, period);
  return { now: run, soon() { clearTimeout(timer); timer = setTimeout(run, 100); }, stop() { stopped = true; clearTimeout(timer); },
    every(ms) { period = ms; } };
}

// ---- #/config/<scope>/<name> -----------------------------------------------------------------------------------

export async function configLayerPage(root, ctx, rest) {
  const at = rest.indexOf("/");
  const scope = rest.slice(0, at), name = rest.slice(at + 1);
  const schema = await api("config/schema");
  if (at < 0 || !schema.scopes.includes(scope) || !name) {
    root.replaceChildren(h("h1", {}, "Not found"), h("p", {}, `No layer ${rest}: #/config/<${schema.scopes.join("|")}>/<name>.`));
    return {};
  }
  const operator = canOperate(ctx.me.role);
  const [layer, revisions, rolloutSchema] = await Promise.all([api(layerPath(scope, name)),
    api(`${layerPath(scope, name)}/history?limit=100`), operator ? apiSchema("RolloutOptions") : null]);
  const page = new LayerPage(root, { scope, name, schema, operator, rolloutSchema });
  await page.show(layer, revisions);
  return page;
}

class LayerPage {
  constructor(root, { scope, name, schema, operator, rolloutSchema }) {
    Object.assign(this, { root, scope, name, schema, operator, label: `${scope}:${name}` });
    this.path = layerPath(scope, name);
    this.seq = 0;
    this.checked = null; // the manager's judgement of the edit shown (ConfigChecked), null while one is asked
    this.mode = "form";
    this.deployment = null;
    this.rollout = operator ? schemaForm(rolloutSchema, {}, { all: true }) : null;
    this.verdicts = verdictTable();
    this.waves = wavesView();
    this.build();
    const load = scope === "device" ? () => api(`config/devices/${encodeURIComponent(name)}`).then((d) => { this.showDevice(d); return [d]; }, (e) => {
      if (e instanceof ApiError && e.status === 404) { this.showDevice(null); return []; } throw e;
    }) : () => api(`config/devices?${scope}=${encodeURIComponent(name)}`).then((a) => a.devices);
    this.poll = poller(async () => { this.verdicts.apply(await load()); }, IDLE_POLL_MS);
    this.poll.now();
  }

  build() {
    const el = (tag, attrs, ...kids) => h(tag, attrs, ...kids);
    this.badge = el("span", { class: "badge", "data-testid": "cfg-revision" });
    this.about = el("p", { class: "muted", "data-testid": "cfg-about" });
    this.draft = el("div", { class: "row warn", "data-testid": "cfg-draft-banner", hidden: true });
    this.modeButtons = ["form", "yaml", "json"].map((m) => el("button", { type: "button", "data-testid": `cfg-mode-${m}`,
      "aria-pressed": String(m === "form"), onclick: () => this.switchMode(m) }, m === "form" ? "Form" : m.toUpperCase()));
    this.formBox = el("div", { "data-testid": "cfg-form" });
    this.text = el("textarea", { class: "config-text", "data-testid": "cfg-text", rows: 18, spellcheck: "false", hidden: true,
      readOnly: !this.operator, "aria-label": `${this.label} as text`, oninput: () => this.scheduleCheck() });
    this.problems = el("ul", { class: "problems", "data-testid": "cfg-problems", role: "alert", "aria-live": "polite" });
    this.diffBox = el("div", { "data-testid": "cfg-changes" });
    this.message = el("input", { id: "cfg-message", type: "text", "data-testid": "cfg-message", autocomplete: "off",
      placeholder: "why (kept with the revision, shown in its history)" });
    this.save = el("button", { type: "button", class: "primary", "data-testid": "cfg-save", disabled: true, onclick: () => this.send(true) }, "Save and roll out");
    this.saveDraft = el("button", { type: "button", "data-testid": "cfg-save-draft", disabled: true, onclick: () => this.send(false) }, "Save as draft");
    this.result = el("div", { class: "result", "data-testid": "cfg-result", role: "status", "aria-live": "polite" });
    this.progress = el("section", { class: "card", "data-testid": "cfg-rollout-progress", hidden: true });
    this.history = el("div", { "data-testid": "cfg-history" });
    this.preview = el("div", { "data-testid": "cfg-rollback-preview", hidden: true, class: "card rollback-preview" });
    this.deviceBox = el("div");
    const editing = this.operator ? [
      el("h3", {}, "Changes"), this.diffBox,
      el("div", { class: "field" }, el("label", { for: "cfg-message" }, "Message"), this.message),
      el("details", { class: "rollout-options", "data-testid": "cfg-rollout" }, el("summary", {}, "Rollout (waves, canary, abort rate: as a model's unless set)"),
        this.rollout.el),
      el("div", { class: "row" }, this.save, this.saveDraft), this.result,
    ] : [el("h3", {}, "Changes"), this.diffBox];
    this.root.replaceChildren(el("div", { "data-testid": "config-layer", dataset: { layer: this.label } },
      this.scope === "device" ? deviceTabs(this.name, "config")
        : el("p", { class: "crumbs" }, el("a", { href: "#/config" }, "Configuration"), " / "),
      el("div", { class: "page-head" }, el("h1", {}, this.label), this.badge), this.about, this.draft,
      this.deviceBox,
      el("div", { class: "config-columns" },
        el("section", { class: "card", "data-testid": "cfg-editor" },
          el("div", { class: "row" }, el("h2", {}, this.operator ? "Edit the layer" : "The layer"),
            el("div", { class: "segmented", role: "group", "aria-label": "Edit as" }, this.modeButtons)),
          this.formBox, this.text, this.problems),
        el("section", { class: "card" }, ...editing)),
      this.progress,
      el("section", { class: "card" }, el("h2", {}, this.scope === "device" ? "This device" : "Its devices"), this.verdicts.el),
      el("section", { class: "card" }, el("h2", {}, "History"), this.preview, this.history)));
  }

  /** The layer as read (its newest revision) and its history: the editor starts again from it. */
  async show(layer, revisions) {
    this.layer = layer;
    setText(this.badge, `r${layer.revision}`);
    setText(this.about, layer.revision ? `Revision ${layer.revision} by ${layer.author || "?"}${layer.role ? ` (${layer.role})` : ""}, `
      + `${fmtAgo(layer.created_at)}${layer.message ? `: ${layer.message}` : ""}` : "Never saved: every key comes from the layers below, or agent.yaml.");
    this.showDraft();
    this.history.replaceChildren(historyList(revisions, this.operator ? (r) => this.previewRollBack(r) : null));
    this.mode = "form";
    this.pressed();
    this.text.hidden = true;
    this.drawForm(layer.document);
    await this.check();
  }

  showDraft() {
    const draft = this.layer.revision > 0 && !this.layer.applied_at;
    this.draft.hidden = !draft;
    if (!draft) return;
    put(this.draft, h("span", {}, `Revision ${this.layer.revision} is a draft: saved, not rolled out to any device.`),
      this.operator ? h("button", { type: "button", "data-testid": "cfg-apply", onclick: (ev) => this.apply(ev.target) }, "Roll it out") : null);
  }

  drawForm(document) {
    this.form = schemaForm(this.schema.layer, document, { readOnly: !this.operator, onChange: () => this.scheduleCheck() });
    this.formBox.replaceChildren(this.form.el);
    this.formBox.hidden = false;
  }

  pressed() { for (const b of this.modeButtons) b.setAttribute("aria-pressed", String(b.dataset.testid === `cfg-mode-${this.mode}`)); }

  /** What to ask the manager about: the form's document, or the text. */
  edit(format = this.mode === "json" ? "json" : "yaml") {
    return this.mode === "form" ? { document: this.form.value(), format } : { text: this.text.value, format };
  }

  scheduleCheck() {
    // a field's change event when it loses focus (to the Save button, say) changes nothing: keep the judgement
    if (this.checked && JSON.stringify(this.edit()) === this.checkedEdit) return;
    this.seq += 1;
    this.checked = null;
    this.ready();
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.check(), CHECK_DELAY_MS);
  }

  async check() {
    const mine = ++this.seq;
    this.checked = null;
    this.ready();
    try {
      const edit = this.edit();
      const answer = await api(`${this.path}/check`, { method: "POST", body: edit });
      if (mine !== this.seq) return;
      this.checked = answer;
      this.checkedEdit = JSON.stringify(edit);
      this.showChecked(answer);
    } catch (e) {
      if (mine === this.seq) say(this.result, `Could not check the edit: ${e.message}`, "error");
    }
    this.ready();
  }

  showChecked(answer) {
    const unshown = this.mode === "form" ? this.form.setProblems(answer.problems) : answer.problems;
    this.problems.replaceChildren(...unshown.map((p) => h("li", { class: "error", dataset: { key: p.key } }, `${p.key}: ${p.words}`)));
    this.problems.dataset.count = String(answer.problems.length);
    put(this.diffBox, answer.revision !== this.layer.revision
      ? h("p", { class: "warn" }, `The layer is at revision ${answer.revision} now, not ${this.layer.revision}: reload it before saving.`) : "",
    diffTable(answer.diff));
  }

  /** Save is offered for a checked edit that changes something and has no problem. */
  ready() {
    if (!this.operator) return;
    const c = this.checked;
    const ok = !!c && !c.problems.length && c.diff.length > 0 && !this.sending;
    this.save.disabled = !ok;
    this.saveDraft.disabled = !ok;
    this.save.title = !c ? "checking…" : c.problems.length ? "fix the problems first" : !c.diff.length ? "nothing changed" : "";
  }

  async switchMode(mode) {
    if (mode === this.mode) return;
    const from = this.mode;
    try {
      let document;
      if (from === "form") document = this.form.value();
      else {
        const read = await api(`${this.path}/check`, { method: "POST", body: { text: this.text.value, format: from === "json" ? "json" : "yaml" } });
        if (read.document === null) {
          this.problems.replaceChildren(...read.problems.map((p) => h("li", { class: "error" }, `${p.key}: ${p.words}`)),
            h("li", { class: "error" }, "Fix the text before switching."));
          return;
        }
        document = read.document;
      }
      if (mode === "form") {
        this.drawForm(document);
        this.text.hidden = true;
      } else {
        const as = await api(`${this.path}/check`, { method: "POST", body: { document, format: mode } });
        this.text.value = as.text ?? "";
        this.text.hidden = false;
        this.formBox.hidden = true;
      }
      this.mode = mode;
      this.pressed();
      await this.check();
    } catch (e) {
      say(this.result, `Could not switch: ${e.message}`, "error");
    }
  }

  rolloutOptions() {
    if (!this.rollout) return null;
    const options = this.rollout.value();
    return Object.keys(options).length ? options : null;
  }

  /** Save the checked edit on the revision read (apply: roll it out now; else a draft). */
  async send(apply) {
    const c = this.checked;
    if (!c || c.problems.length) return;
    await this.change(() => api(this.path, { method: "PUT", body: { document: c.document, revision: this.layer.revision,
      message: this.message.value.trim(), apply, rollout: this.rolloutOptions() } }), apply ? "Saved" : "Saved as a draft");
  }

  async apply(button) {
    button.disabled = true;
    await this.change(() => api(`${this.path}/apply`, { method: "POST", body: { rollout: this.rolloutOptions() } }), "Rolled out");
  }

  /** A save, roll back or apply; its answer (ConfigSaved) shown, the layer read again. A stale 409 offers to reload. */
  async change(call, done) {
    this.sending = true;
    this.ready();
    say(this.result, "saving…");
    try {
      const saved = await call();
      say(this.result, `${done}: revision ${saved.layer.revision}${saved.deployment ? "" : " (no device needed it)"}.`, "ok");
      this.message.value = "";
      this.preview.hidden = true;
      this.showRollout(saved);
      await this.show(saved.layer, await api(`${this.path}/history?limit=100`));
    } catch (e) {
      if (e instanceof ApiError && e.status === 409) await this.conflict(e);
      else say(this.result, `Not saved: ${e.message}`, "error");
    } finally {
      this.sending = false;
      this.ready();
    }
  }

  /** A 409 is one of two things (docs/fleet.md): the layer moved on since it was read (offer to reload), or the
   * device's check refused the document (its words, the layer unchanged) — told apart by reading the layer again. */
  async conflict(e) {
    const newest = await api(this.path).catch(() => null);
    if (newest && newest.revision === this.layer.revision) {
      this.result.className = "result error";
      this.result.replaceChildren(h("span", { "data-testid": "cfg-refused" }, `Not saved: a device would refuse it — ${e.message}`));
      return;
    }
    const who = newest ? `${newest.author || "someone"} saved revision ${newest.revision}${newest.message ? ` (“${newest.message}”)` : ""} `
      + `${fmtAgo(newest.created_at)}` : "someone saved it";
    this.result.className = "result error";
    this.result.replaceChildren(h("span", { "data-testid": "cfg-conflict" }, `Not saved: ${who}, after you read revision ${this.layer.revision}. `
      + `(${e.message}) `), h("button", { type: "button", "data-testid": "cfg-reload", onclick: () => this.reload() },
      `Reload revision ${newest ? newest.revision : ""} (your edit is dropped)`));
  }

  async reload() {
    say(this.result, "");
    const [layer, revisions] = await Promise.all([api(this.path), api(`${this.path}/history?limit=100`)]);
    await this.show(layer, revisions);
  }

  /** A roll back to revision `to`: its diff from the newest first, then confirmed with a message. */
  async previewRollBack(to) {
    const answer = await api(`${this.path}/check`, { method: "POST", body: { to_revision: to } });
    const message = h("input", { type: "text", "data-testid": "cfg-rollback-message", value: `roll back to revision ${to}`,
      "aria-label": "Message", autocomplete: "off" });
    const confirm = h("button", { type: "button", class: "danger", "data-testid": "cfg-rollback-confirm", disabled: !answer.diff.length,
      onclick: () => this.change(() => api(`${this.path}/rollback`, { method: "POST", body: { to_revision: to, revision: this.layer.revision,
        message: message.value.trim(), apply: true, rollout: this.rolloutOptions() } }), `Rolled back to r${to}`) }, `Roll back to r${to}`);
    put(this.preview, h("h3", {}, `Roll back to revision ${to}: what changes from r${answer.revision}`),
      diffTable(answer.diff, "cfg-rollback-diff"),
      answer.problems.length ? h("p", { class: "error" }, answer.problems.map((p) => `${p.key}: ${p.words}`).join("; ")) : null,
      h("div", { class: "row" }, message, confirm, h("button", { type: "button", onclick: () => { this.preview.hidden = true; } }, "Cancel")));
    this.preview.hidden = false;
    this.preview.scrollIntoView({ block: "nearest" });
  }

  /** The answer's rollout: its deployment's waves and each device's state (live), and the devices left out. */
  showRollout(saved) {
    this.deployment = saved.deployment;
    const status = h("span", { class: "badge", "data-testid": "cfg-rollout-status" });
    this.waves = wavesView();
    put(this.progress, h("h2", {}, "Rollout"),
      saved.deployment ? h("p", {}, "Deployment ", h("a", { href: `#/deployments/${encodeURIComponent(saved.deployment.deployment_id)}`,
        "data-testid": "cfg-deployment-link" }, shortId(saved.deployment.deployment_id)), " ", status)
        : h("p", { class: "muted" }, "No device needed it: every device it reaches runs it already, or is left out below."),
      this.waves.el,
      saved.skipped.length ? h("details", {}, h("summary", {}, `${saved.skipped.length} left out`), h("ul", { class: "plain" },
        saved.skipped.map((s) => h("li", {}, h("code", {}, s.device_id), ` — ${s.reason}`)))) : null);
    this.rolloutStatus = status;
    this.progress.hidden = false;
    if (saved.deployment) this.applyDeployment(saved.deployment);
    this.poll.every(POLL_MS);
    this.poll.soon();
  }

  applyDeployment(dep) {
    this.deployment = { ...this.deployment, ...dep };
    setText(this.rolloutStatus, this.deployment.status || DASH);
    this.rolloutStatus.className = `badge status-${this.deployment.status}`;
    this.waves.apply(this.deployment);
    if (this.deployment.status !== "running") this.poll.every(IDLE_POLL_MS);
  }

  /** A device's tab: its status, drafts, and where each key of its effective document comes from. */
  showDevice(found) {
    if (!found) {
      this.deviceBox.replaceChildren(h("p", { class: "muted" }, `The manager knows no device ${this.name} yet: its layer is kept for it.`));
      return;
    }
    this.deviceBox.replaceChildren(h("section", { class: "card", "data-testid": "cfg-effective" },
      h("div", { class: "row" }, h("h2", {}, "Its effective configuration"), statusBadge(found.status)),
      h("p", { class: "muted" }, "Merged from ", found.layers.join(" → "), " over its agent.yaml (a later layer wins).",
        found.drafts.length ? h("span", { class: "warn" }, ` Drafts not rolled out: ${found.drafts.join(", ")}.`) : ""),
      found.desired.problem ? h("p", { class: "error" }, `Its layers merge into a document it would refuse: ${found.desired.problem}`) : null,
      found.refused ? h("p", { class: "error", "data-testid": "cfg-device-refused" }, `It refused v${found.refused.version} (${found.refused.state}): `
        + `${found.refused.reason || "no reason given"}`) : null,
      effectiveTable(found)));
  }

  onEvent(name, payload) {
    const id = this.deployment && this.deployment.deployment_id;
    if (name === "deployment" && payload && id && String(payload.deployment_id) === String(id)) this.applyDeployment(payload);
    else if (name === "deployments" && Array.isArray(payload) && id) {
      const s = payload.find((x) => x && String(x.deployment_id) === String(id));
      if (s) this.applyDeployment({ ...s, devices: this.deployment.devices });
    }
    if (name === "deployment" || name === "deployments") this.poll.soon();
  }

  async refresh() { this.poll.now(); }

  unmount() { this.poll.stop(); clearTimeout(this.timer); this.seq += 1; }
}
