// A pipeline's live view and its counting lines and zones, on the device page.
// The MJPEG stream is read with fetch() (the bearer token in a header, never in a URL) and a multipart parser
// over its ReadableStream; each JPEG becomes the <img>'s blob URL. Lines and zones are drawn in an SVG over it
// whose viewBox is the frame's own pixels, so what is drawn is in source pixels, as the device counts. The editor
// shows the lines and zones the device applied; a save says what the device did with it (verdict.js).
import { api, apiSchema, headers, ApiError } from "./api.js";
import { h, clear, setText, fmtTime } from "./dom.js";
import { followCommand, showVerdict } from "./verdict.js";

// A live frame older than this many seconds — by its capture time on the device (X-Frame-Time), against this
// browser's clock — is marked stale: the device stopped sending (a restart, a stalled camera, a lost network),
// and what is shown is the past. A few seconds: a frame a second (the slowest live view) is never stale in a
// healthy stream. docs/fleet.md, "The live view".
export const STALE_FRAME_S = 5;
// How often the frame's age is shown again while no new frame comes (ms).
const AGE_TICK_MS = 1000;
// What a name, a line and a zone must be comes from the API's AnalyticsSpec (/openapi.json: the manager's and the
// device's one definition, edgeinfer/_regions.py); the editor says it in that document's words, never a pattern.

const SVG = "http://www.w3.org/2000/svg";
const svg = (tag, attrs = {}) => {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
};

/** The parts of a multipart/x-mixed-replace body (each with a Content-Length), as {headers, jpeg}. */
export async function* mjpegParts(body) {
  const reader = body.getReader();
  let buf = new Uint8Array(0);
  const find = (seq) => { // index of the byte sequence `seq` in buf, or -1
    outer: for (let i = 0; i + seq.length <= buf.length; i++) {
      for (let j = 0; j < seq.length; j++) if (buf[i + j] !== seq[j]) continue outer;
      return i;
    }
    return -1;
  };
  const blank = [13, 10, 13, 10];
  for (;;) {
    const end = find(blank);
    if (end >= 0) {
      const head = new TextDecoder().decode(buf.subarray(0, end));
      const hdrs = {};
      for (const line of head.split("\r\n")) {
        const at = line.indexOf(":");
        if (at > 0) hdrs[line.slice(0, at).trim().toLowerCase()] = line.slice(at + 1).trim();
      }
      const size = Number(hdrs["content-length"]);
      if (buf.length >= end + 4 + size) {
        yield { headers: hdrs, jpeg: buf.slice(end + 4, end + 4 + size) };
        buf = buf.slice(end + 4 + size);
        continue;
      }
    }
    const { value, done } = await reader.read();
    if (done) return;
    const next = new Uint8Array(buf.length + value.length);
    next.set(buf); next.set(value, buf.length);
    buf = next;
  }
}

/** "0.4 s", "12 s", "3 min", "2 h", "4 d": how old a frame is. */
export function fmtAge(seconds) {
  const s = Math.max(0, seconds);
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

/**
 * What the live view says of the frame it shows: {state, text, age}. `frame`: {id, time} (time: its capture time,
 * unix seconds, 0 when the device did not say) or null before the first; `online`: whether the device is online.
 * state: "waiting" (no frame yet), "live", "stale" (older than STALE_FRAME_S), "offline" (the device is offline:
 * whatever is shown is its last frame), "unknown" (a frame without its capture time).
 */
export function frameStatus(frame, online, now = Date.now() / 1000) {
  if (!frame) {
    return online ? { state: "waiting", text: "waiting for the device…", age: null }
      : { state: "offline", text: "device offline — no frame yet", age: null };
  }
  const age = frame.time > 0 ? Math.max(0, now - frame.time) : null;
  if (!online) {
    return { state: "offline", age, text: age === null ? `device offline — last frame ${frame.id}, its time unknown`
      : `device offline — last frame ${fmtTime(frame.time)} (${fmtAge(age)} old)` };
  }
  if (age === null) return { state: "unknown", age, text: `frame ${frame.id} — its capture time unknown` };
  if (age > STALE_FRAME_S) return { state: "stale", age, text: `stale — frame ${frame.id}, ${fmtAge(age)} old` };
  return { state: "live", age, text: `live: frame ${frame.id} · ${fmtAge(age)} old` };
}

/**
 * The editor's rules from the AnalyticsSpec schema: the name pattern and its words, a zone's fewest and most points,
 * the most lines and zones. Until the document is read (or if it cannot be) nothing is checked here: the manager's
 * answer says what is wrong.
 */
function shapeRules(spec) {
  const kind = (key) => {
    const field = (spec.properties || {})[key] || {};
    const [pattern, shape] = Object.entries(field.patternProperties || {})[0] || [];
    return { pattern: pattern ? new RegExp(pattern) : null, words: (field.propertyNames || {}).description || "",
      most: field.maxProperties, minPoints: (shape || {}).minItems, maxPoints: (shape || {}).maxItems };
  };
  return { line: kind("lines"), zone: kind("zones") };
}

/** The first thing wrong with `shapes` by `rules`, in words (null: nothing the editor can tell). */
export function shapeProblem(shapes, rules) {
  const seen = new Set();
  for (const s of shapes) {
    const rule = rules[s.kind];
    if (rule.pattern && !rule.pattern.test(s.name)) return `${s.kind} '${s.name}' is not ${rule.words}`;
    if (seen.has(s.name)) return `the name '${s.name}' is used twice: each line and zone needs a name of its own`;
    seen.add(s.name);
  }
  for (const kind of ["line", "zone"]) {
    const count = shapes.filter((s) => s.kind === kind).length;
    if (rules[kind].most !== undefined && count > rules[kind].most) return `at most ${rules[kind].most} ${kind}s, not ${count}`;
  }
  return null;
}

/** The Live card: a button per pipeline (and stream) the device reports; the viewer and editor below them. */
export function liveCard(id, getDevice, canEdit) {
  const buttons = h("div", { class: "row" });
  const view = h("div", { class: "live-view", "data-testid": "live-view" });
  let open = null;
  function targets() {
    const pipes = (getDevice().state || {}).pipelines;
    const out = [];
    for (const p of Array.isArray(pipes) ? pipes : []) {
      const streams = (Array.isArray(p.streams) ? p.streams : []).map((s) => (typeof s === "string" ? s : s && s.name))
        .filter(Boolean);
      if (streams.length > 1) for (const s of streams) out.push([p.name, s]); else out.push([p.name, ""]);
    }
    return out.length ? out : [["main", ""]];
  }
  function render() {
    clear(buttons).append(...targets().map(([pipeline, stream]) => {
      const b = h("button", { type: "button", "data-testid": "live-button", dataset: { pipeline, stream } },
        `Live ${pipeline}${stream ? ` / ${stream}` : ""}`);
      b.addEventListener("click", () => {
        if (open) open.close();
        open = liveView(view, id, pipeline, stream, canEdit, getDevice);
      });
      return b;
    }));
  }
  render();
  return { el: h("section", { class: "card live-card" }, h("h2", {}, "Live view"), buttons, view), refresh: render,
    onEvent(name, data) { if (open) open.onEvent(name, data); },
    unmount() { if (open) open.close(); } };
}

function liveView(root, id, pipeline, stream, canEdit, getDevice) {
  const isOnline = () => getDevice().online !== false;
  const enc = encodeURIComponent(id), pipe = encodeURIComponent(pipeline);
  const q = stream ? `?stream=${encodeURIComponent(stream)}` : "";
  const img = h("img", { class: "live-frame", alt: `${pipeline} live`, "data-testid": "live-frame" });
  const overlay = svg("svg", { class: "live-overlay", "data-testid": "live-overlay", preserveAspectRatio: "none" });
  const status = h("p", { class: "muted live-status", "data-testid": "live-status", role: "status",
    dataset: { staleAfter: String(STALE_FRAME_S) } }, "connecting…");
  const list = h("ul", { class: "plain live-shapes", "data-testid": "live-shapes" });
  const result = h("p", { class: "result", "data-testid": "live-result", role: "status", "aria-live": "polite" });
  const shapes = []; // {kind: "line" | "zone", name, points: [[x, y], ...]}
  let mode = null, draft = null, size = null, frames = 0;
  let rules = { line: {}, zone: {} };
  const ctl = new AbortController();
  apiSchema("AnalyticsSpec").then((spec) => { rules = shapeRules(spec); }).catch(() => {});
  const say = (text, kind) => { result.className = `result ${kind}`; setText(result, text); };

  const tool = (label, testid, fn) => {
    const b = h("button", { type: "button", "data-testid": testid }, label);
    b.addEventListener("click", fn);
    return b;
  };
  const tools = canEdit ? h("div", { class: "row live-tools" },
    tool("Draw line", "draw-line", () => { mode = "line"; draft = null; paint(); }),
    tool("Draw zone", "draw-zone", () => { mode = "zone"; draft = null; paint(); }),
    tool("Close zone", "close-zone", () => finishZone()),
    tool("Save", "save-analytics", () => save())) : h("p", { class: "muted" }, "Viewers see the lines and zones; operators edit them.");
  const stage = h("div", { class: "live-stage" }, img, overlay);
  clear(root).append(h("h3", {}, `${pipeline}${stream ? ` / ${stream}` : ""}`), stage, status, tools, list, result);

  // the frame shown, with its age: a frame from before a restart, or of a device gone offline, says so
  let shown = null, connected = false;
  function showAge() {
    if (!connected) return;
    const st = frameStatus(shown, isOnline());
    setText(status, st.text);
    status.dataset.frameState = st.state;
    status.dataset.frameAge = st.age === null ? "" : st.age.toFixed(1);
    stage.dataset.frameState = st.state;
  }
  const ticker = setInterval(showAge, AGE_TICK_MS);

  function setFrame(blob) {
    const old = img.src;
    img.src = URL.createObjectURL(blob);
    if (old) URL.revokeObjectURL(old);
  }
  // the editor works in the source's pixels (X-Frame-Size), whatever size the JPEG was scaled to
  let sourceSize = null;
  img.addEventListener("load", () => {
    const want = sourceSize || [img.naturalWidth, img.naturalHeight];
    if (!size || size[0] !== want[0] || size[1] !== want[1]) {
      size = want;
      overlay.setAttribute("viewBox", `0 0 ${size[0]} ${size[1]}`);
      paint();
    }
  });

  // the stream's first part is the newest frame the manager has, so the editor has a still while live is off
  (async () => {
    try {
      const resp = await fetch(`api/devices/${enc}/live/${pipe}${q}`, { headers: headers(), signal: ctl.signal });
      if (!resp.ok) throw new ApiError(resp.status, `${resp.status}`);
      connected = true;
      showAge();
      for await (const part of mjpegParts(resp.body)) {
        frames += 1;
        const stated = /^(\d+)x(\d+)$/.exec(part.headers["x-frame-size"] || "");
        sourceSize = stated && +stated[1] > 0 ? [+stated[1], +stated[2]] : null;
        setFrame(new Blob([part.jpeg], { type: "image/jpeg" }));
        root.dataset.frames = String(frames);
        shown = { id: part.headers["x-frame-id"] || String(frames), time: Number(part.headers["x-frame-time"]) || 0 };
        showAge();
      }
      connected = false;
      setText(status, "the stream ended");
    } catch (e) {
      connected = false;
      if (e.name !== "AbortError") setText(status, `live view unavailable: ${e.message}`);
    }
  })();

  // ---- the device's lines and zones, and what it did with the last ones sent ----
  let follow = null, revision = 0, verdict = null;
  function showApplied(a) { // what the device applied: never a revision it refused or has not taken yet
    shapes.length = 0;
    for (const [name, points] of Object.entries(a.applied.lines || {})) shapes.push({ kind: "line", name, points });
    for (const [name, points] of Object.entries(a.applied.zones || {})) shapes.push({ kind: "zone", name, points });
    root.dataset.applied = String(a.applied.revision);
    paint();
  }
  const loadApplied = () => api(`devices/${enc}/pipelines/${pipe}/analytics${q}`, { signal: ctl.signal });
  function showRecord(rec) {
    verdict = rec;
    const prefix = rec.state === "applied" ? "" : `Revision ${revision}: `;
    showVerdict(result, rec, { online: getDevice().online !== false, prefix });
    if (rec.settled) loadApplied().then(showApplied).catch(() => {}); // applied, or back to what the device has
  }
  function track(commandId, rev) {
    if (follow) follow.stop();
    revision = rev;
    follow = followCommand(commandId, showRecord);
  }
  loadApplied().then((a) => {
    showApplied(a);
    if (a.sent.command_id && a.sent.revision > a.applied.revision) track(a.sent.command_id, a.sent.revision);
  }).catch(() => {});

  // ---- drawing ----
  function toFrame(ev) {
    const r = overlay.getBoundingClientRect();
    if (!size || !r.width) return null;
    const clamp = (v, hi) => Math.round(Math.min(hi, Math.max(0, v)));
    return [clamp((ev.clientX - r.left) * size[0] / r.width, size[0]), clamp((ev.clientY - r.top) * size[1] / r.height, size[1])];
  }
  const unique = (base) => { let i = 1; while (shapes.some((s) => s.name === `${base}-${i}`)) i++; return `${base}-${i}`; };
  function finishZone() {
    const drawn = draft && draft.kind === "zone" ? draft.points.length : mode === "zone" ? 0 : null;
    if (drawn === null) return;
    const fewest = rules.zone.minPoints || 1; // the AnalyticsSpec's minItems (until it is read: the manager says)
    if (drawn < fewest) { // kept as drawn: the next clicks add to it
      const more = fewest - drawn;
      say(`A zone needs at least ${fewest} points: click ${more} more, then Close zone.`, "error");
      return;
    }
    shapes.push(draft);
    draft = null; mode = null; setText(result, ""); paint();
  }
  if (canEdit) overlay.addEventListener("pointerdown", (ev) => {
    if (!mode || ev.target.classList.contains("handle")) return;
    const p = toFrame(ev);
    if (!p) return;
    if (!draft) draft = { kind: mode, name: unique(mode), points: [] };
    if (draft.points.some(([x, y]) => x === p[0] && y === p[1])) return; // a point twice makes no shape
    if (mode === "zone" && rules.zone.maxPoints && draft.points.length >= rules.zone.maxPoints) {
      say(`A zone has at most ${rules.zone.maxPoints} points: Close zone.`, "error");
      return;
    }
    draft.points.push(p);
    if (mode === "line" && draft.points.length === 2) { shapes.push(draft); draft = null; mode = null; }
    paint();
  });
  function drag(shape, i, handle) {
    handle.addEventListener("pointerdown", (ev) => {
      ev.stopPropagation();
      handle.setPointerCapture(ev.pointerId);
      const move = (e) => { const p = toFrame(e); if (p) { shape.points[i] = p; paint(); } };
      const up = () => { handle.removeEventListener("pointermove", move); handle.removeEventListener("pointerup", up); };
      handle.addEventListener("pointermove", move);
      handle.addEventListener("pointerup", up);
    });
  }
  function paint() {
    overlay.replaceChildren();
    const r = size ? Math.max(size[0], size[1]) / 80 : 4;
    for (const s of [...shapes, ...(draft ? [draft] : [])]) {
      const pts = s.points.map((p) => p.join(",")).join(" ");
      const closed = s.kind === "zone" && s !== draft;
      overlay.append(svg(closed ? "polygon" : "polyline", { points: pts, class: `shape ${s.kind}`,
        "stroke-width": r / 2, "data-name": s.name }));
      if (s.points.length) overlay.append(labelOf(s, r));
      if (canEdit) s.points.forEach((p, i) => {
        const c = svg("circle", { cx: p[0], cy: p[1], r, class: "handle" });
        drag(s, i, c);
        overlay.append(c);
      });
    }
    clear(list).append(...shapes.map((s) => h("li", { dataset: { kind: s.kind } },
      canEdit ? nameInput(s) : h("strong", {}, s.name), ` ${s.kind}: `,
      h("code", {}, s.points.map((p) => `(${p.join(", ")})`).join(" ")),
      canEdit ? tool("Delete", "delete-shape", () => { shapes.splice(shapes.indexOf(s), 1); paint(); }) : "")));
  }
  // A shape's name beside its first point, on the side towards the shape and clear of that point's handle, moved
  // wholly inside the frame (the device's own label is at the zone's middle, beside the line's middle).
  function labelOf(s, r) {
    const [px, py] = s.points[0];
    const cx = s.points.reduce((a, p) => a + p[0], 0) / s.points.length;
    const cy = s.points.reduce((a, p) => a + p[1], 0) / s.points.length;
    const right = cx >= px, down = cy > py || (cy === py && py < (size ? size[1] / 2 : 0));
    const label = svg("text", { x: px + (right ? 2 : -2) * r, y: py + (down ? 2 : -2) * r,
      "font-size": r * 3, class: "shape-label", "text-anchor": right ? "start" : "end",
      "dominant-baseline": down ? "hanging" : "auto", "data-name": s.name });
    label.textContent = s.name;
    requestAnimationFrame(() => { // measured once drawn; kept inside the viewBox
      if (!size || !label.isConnected) return;
      const box = label.getBBox();
      const dx = Math.max(0, -box.x) - Math.max(0, box.x + box.width - size[0]);
      const dy = Math.max(0, -box.y) - Math.max(0, box.y + box.height - size[1]);
      if (dx || dy) label.setAttribute("transform", `translate(${dx} ${dy})`);
    });
    return label;
  }
  function nameInput(s) {
    const input = h("input", { type: "text", value: s.name, "aria-label": `${s.kind} name`, "data-testid": "shape-name" });
    input.addEventListener("change", () => {
      s.name = input.value.trim();
      const problem = shapeProblem(shapes, rules);
      if (problem) say(problem, "error"); else setText(result, "");
      paint();
    });
    return input;
  }
  async function save() {
    const body = { lines: {}, zones: {}, ...(stream ? { stream } : {}) };
    const problem = shapeProblem(shapes, rules);
    if (problem) return say(problem, "error");
    for (const s of shapes) (s.kind === "line" ? body.lines : body.zones)[s.name] = s.points;
    result.className = "result";
    setText(result, "saving…");
    try {
      const sent = await api(`devices/${enc}/pipelines/${pipe}/analytics`, { method: "PUT", body });
      result.className = "result";
      setText(result, `Revision ${sent.revision} sent: waiting for the device`);
      track(sent.command_id, sent.revision);
    } catch (e) {
      result.className = "result error";
      setText(result, `Failed: ${e.message}`);
    }
  }
  return {
    onEvent(name, data) {
      if (follow) follow.onEvent(name, data);
      // online or not: the note follows (after the device page has taken the change in)
      if (name === "devices" && verdict && !verdict.settled) setTimeout(() => showRecord(verdict), 0);
    },
    close() { clearInterval(ticker); ctl.abort(); if (follow) follow.stop(); if (img.src) URL.revokeObjectURL(img.src); },
  };
}
