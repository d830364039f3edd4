// "Capture the next N frames" on the device page (operators only): a row per pipeline the device reports — and,
// for a pipeline of several streams, a row per stream too — each with a number of frames and a Capture button.
// It POSTs api/devices/<id>/capture (a signed capture command: the device keeps those frames as samples,
// docs/datasets.md) and says in the page what was sent, with a link to the Samples page filtered to this device
// and pipeline, then what came of it (verdict.js): the device's answer, and how many of the frames the manager
// stored and how many it dropped as near-duplicates of stored samples. The API's refusal (a bad number, no such
// device) is said there too. The number's bounds and default come from the API's own CaptureArgs schema; the
// manager judges what is sent.
import { api, apiSchema } from "./api.js";
import { h, clear, setText } from "./dom.js";
import { followCommand, showVerdict } from "./verdict.js";

/** [pipeline, stream] rows for the device's state: "" is every stream of the pipeline. */
export function captureTargets(device) {
  const pipes = (device.state || {}).pipelines;
  const out = [];
  for (const p of Array.isArray(pipes) ? pipes : []) {
    if (!p || !p.name) continue;
    out.push([p.name, ""]);
    const streams = (Array.isArray(p.streams) ? p.streams : []).map((s) => (typeof s === "string" ? s : s && s.name))
      .filter(Boolean);
    if (streams.length > 1) for (const s of streams) out.push([p.name, s]);
  }
  return out.length ? out : [["main", ""]];
}

/** The Capture card: {el, refresh()} — refresh redraws the rows only when the device's pipelines changed. */
export function captureCard(id, getDevice) {
  const enc = encodeURIComponent(id);
  const rows = h("div", { class: "capture-rows" });
  const result = h("p", { class: "result", "data-testid": "capture-result", role: "status", "aria-live": "polite" });
  let shown = "";
  let bounds = null; // {min, max, default} of CaptureArgs.frames, once the API's document has said them
  const inputs = new Set();
  let follow = null; // the last capture's command, followed until it settles

  function apply(input) {
    if (!bounds) return;
    if (bounds.min !== undefined) input.min = bounds.min;
    if (bounds.max !== undefined) input.max = bounds.max;
    if (bounds.default !== undefined) {
      input.placeholder = String(bounds.default);
      if (input.value === "") input.value = String(bounds.default);
    }
  }

  function row([pipeline, stream], index) {
    const label = stream ? `${pipeline} / ${stream}` : pipeline;
    const frames = h("input", { id: `capture-frames-${index}`, type: "number", step: 1, inputmode: "numeric",
      class: "capture-frames", "data-testid": "capture-frames", placeholder: "server default" });
    const send = h("button", { type: "submit", "data-testid": "capture-submit" }, "Capture");
    const form = h("form", { class: "row capture-row", novalidate: true, "data-testid": "capture-form",
      dataset: { pipeline, stream } },
      h("span", { class: "capture-target" }, label,
        !stream && multi(pipeline) ? h("span", { class: "muted" }, " (every stream)") : ""),
      h("label", { for: frames.id, class: "visually-hidden" }, `Frames of ${label}`), frames, send);
    inputs.add(frames);
    apply(frames);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      // an empty box asks for the API's default; a typed number goes as typed, for the API to judge
      const body = { pipeline, ...(stream ? { stream } : {}) };
      if (frames.validity.badInput) body.frames = frames.value; // what the box could not read: "" for the API
      else if (frames.value !== "") body.frames = Number(frames.value);
      send.disabled = true;
      result.className = "result";
      setText(result, "sending…");
      try {
        const sent = await api(`devices/${enc}/capture`, { method: "POST", body });
        const n = sent.args && sent.args.frames;
        const q = new URLSearchParams({ device: id, pipeline });
        result.className = "result ok";
        const what = `${n} frame${n === 1 ? "" : "s"} of ${label}`;
        const verdict = h("span", { "data-testid": "capture-verdict", class: "verdict waiting" }, "waiting for the device");
        clear(result).append(`Capture of ${what} sent (command ${sent.command_id}): `, verdict, ". ",
          h("a", { href: `#/samples?${q}`, "data-testid": "capture-samples" }, "Its samples"));
        if (follow) follow.stop();
        follow = followCommand(sent.command_id, (rec) => {
          showVerdict(verdict, rec, { online: getDevice().online !== false });
          if (rec.state === "refused" || rec.state === "expired") result.classList.replace("ok", "error");
        });
      } catch (e) {
        result.className = "result error";
        setText(result, `Capture of ${label} failed: ${e.message}`);
      } finally {
        send.disabled = false;
      }
    });
    return form;
  }

  let targets = [];
  const multi = (pipeline) => targets.some(([p, s]) => p === pipeline && s);
  function refresh() {
    targets = captureTargets(getDevice());
    const key = JSON.stringify(targets);
    if (key === shown) return;
    shown = key;
    inputs.clear();
    clear(rows).append(...targets.map(row));
  }
  refresh();

  apiSchema("CaptureArgs").then((schema) => {
    const f = (schema.properties || {}).frames || {};
    bounds = { min: f.minimum, max: f.maximum, default: f.default };
    for (const input of inputs) apply(input);
  }).catch((e) => console.warn("capture:", e.message)); // the API still judges the number

  return {
    el: h("section", { class: "card capture-card", "data-testid": "capture-card" }, h("h2", {}, "Capture frames"),
      h("p", { class: "muted" }, "Keep a pipeline's next frames as samples for labelling: how many, then Capture."),
      rows, result),
    refresh,
    onEvent(name, data) { if (follow) follow.onEvent(name, data); },
  };
}
