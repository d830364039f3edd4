// Samples: the frames devices captured where their model was unsure (docs/datasets.md), as a grid — each
// frame with the model's detections (solid boxes, label and score) and a person's corrected labels (dashed)
// drawn over it — filtered by device, pipeline, model version, rule, label and review. The filters live in
// the hash (#/samples?device=cam-a&label=person), so a filtered view can be linked. Operators select tiles
// and mark them reviewed or not, or delete them; anyone exports the filtered samples as a dataset (zip).
//
// Frames are fetched with the token in a header (apiBlob) and shown through blob: URLs, as evidence is. The
// boxes are an SVG over the <img> whose viewBox is the frame's own pixels; both letterbox the same way in
// the tile (object-fit: contain, preserveAspectRatio meet), so a box sits on what it boxes at any tile size.
// A pose model's keypoints are drawn with their box: the seen ones as points (a model's from the confidence the
// contract states, a person's label's when flagged 1 or 2), joined by the skeleton the contract states for their
// count (COCO's 19 limbs for COCO's 17 keypoints: the Detection schema's x-skeletons); other counts as points.
import { api, apiBlob, apiSchema } from "./api.js";
import { h, setText, deviceLink, fmtTime, fmtAgo, fmtBytes, canOperate, confirmDialog, DASH } from "./dom.js";

const PAGE = 48;
// the most samples one export asks for (the API's own bound)
const MAX_EXPORT = 20000;
// requests at once when a change is applied to a selection
const PARALLEL = 4;
// [query key, label, facets key]
const FILTERS = [
  ["device", "Device", "devices"],
  ["pipeline", "Pipeline", "pipelines"],
  ["model_version", "Model version", "model_versions"],
  ["rule", "Rule", "rules"],
  ["label", "Label", "labels"],
];
const REVIEWED = [["", "any"], ["false", "not reviewed"], ["true", "reviewed"]];
const FORMATS = [["coco", "COCO"], ["yolo", "YOLO"], ["label-studio", "Label Studio"]];

const SVG = "http://www.w3.org/2000/svg";
const svg = (tag, attrs = {}) => {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
};

/** The page's filters from the hash's query: the known keys with a value ("reviewed" only true or false). */
export function filtersFrom(params) {
  const out = {};
  for (const [key] of FILTERS) if (params.get(key)) out[key] = params.get(key);
  if (["true", "false"].includes(params.get("reviewed"))) out.reviewed = params.get("reviewed");
  return out;
}

/** How keypoints are drawn, from the contract's Detection schema (none known: points whose v is above 0). */
async function keypointDrawing() {
  try {
    const schema = await apiSchema("Detection");
    return { skeletons: schema["x-skeletons"] || {}, visible: schema["x-keypoint-visible"] ?? 0 };
  } catch {
    return { skeletons: {}, visible: 0 };
  }
}

export async function samplesPage(root, ctx, _arg, params = new URLSearchParams()) {
  const operator = canOperate(ctx.me.role);
  const drawing = await keypointDrawing();
  let chosen = filtersFrom(params);
  const tiles = new Map(); // "device/sample" -> tile
  const selected = new Set();
  let total = 0, loadSeq = 0;

  const selects = Object.fromEntries([...FILTERS, ["reviewed", "Reviewed"]].map(([key]) => [key,
    h("select", { id: `samples-${key}`, name: key, "data-testid": `samples-filter-${key}` })]));
  const form = h("form", { class: "card samples-filters", "data-testid": "samples-filters" },
    h("div", { class: "form-grid" }, [...FILTERS, ["reviewed", "Reviewed"]].map(([key, label]) =>
      h("div", { class: "field" }, h("label", { for: `samples-${key}` }, label), selects[key]))),
    h("div", { class: "row" }, h("a", { href: "#/samples", "data-testid": "samples-clear" }, "Clear the filters")));
  form.addEventListener("submit", (ev) => ev.preventDefault());
  form.addEventListener("change", () => {
    chosen = Object.fromEntries(Object.entries(selects).map(([k, s]) => [k, s.value]).filter(([, v]) => v));
    const q = new URLSearchParams(chosen).toString();
    history.replaceState(null, "", `#/samples${q ? `?${q}` : ""}`); // linkable, without re-mounting the page
    reload().catch(fail);
  });

  const grid = h("ul", { class: "sample-grid", "data-testid": "samples-grid" });
  const empty = h("p", { class: "empty", hidden: true }, "no samples match these filters");
  const count = h("span", { "data-testid": "samples-count" }, "0");
  const totalEl = h("span", { "data-testid": "samples-total" }, "0");
  const result = h("p", { class: "result", "data-testid": "samples-result", role: "status", "aria-live": "polite" });
  const more = button("More", "samples-more", () => loadMore().catch(fail));
  const all = h("input", { type: "checkbox", id: "samples-select-all", "data-testid": "samples-select-all" });
  const howMany = h("span", { class: "muted", "data-testid": "samples-selected" }, "none selected");
  const actions = operator ? [
    h("label", { class: "check" }, all, " Select all shown"), howMany,
    button("Mark reviewed", "samples-mark-reviewed", () => review(true)),
    button("Mark unreviewed", "samples-mark-unreviewed", () => review(false)),
    button("Delete", "samples-delete", () => remove(), "danger")] : [];
  const format = h("select", { "data-testid": "samples-export-format", "aria-label": "Export format" },
    FORMATS.map(([value, label]) => h("option", { value }, label)));
  const exportBtn = button("Export", "samples-export", () => exportZip());
  all.addEventListener("change", () => {
    const on = all.checked; // counts() sets it again as each tile is picked
    for (const [key, tile] of tiles) { tile.check.checked = on; pick(key, on); }
  });

  root.replaceChildren(h("div", { "data-testid": "samples-page" },
    h("div", { class: "page-head" }, h("h1", {}, "Samples"),
      h("p", { class: "muted" }, count, " of ", totalEl, " shown")),
    h("p", { class: "muted" }, "Frames devices captured where their model was unsure, newest first: ",
      h("span", { class: "legend detection" }, "the model's detections"), " and ",
      h("span", { class: "legend label" }, "corrected labels"), " drawn over each."),
    form,
    h("div", { class: "toolbar samples-actions", "data-testid": "samples-actions" }, actions,
      h("span", { class: "spacer" }), format, exportBtn, button("Refresh", "samples-refresh", () => reload().catch(fail))),
    result, grid, empty, h("div", { class: "row" }, more)));

  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      observer.unobserve(entry.target);
      const tile = tiles.get(entry.target.dataset.key);
      if (tile) tile.show();
    }
  }, { rootMargin: "300px" }) : null;

  function say(text, ok = true) {
    result.className = `result ${ok ? "ok" : "error"}`;
    setText(result, text);
  }
  function fail(e) {
    say(`Could not load the samples: ${e.message}`, false);
    if (!selects.reviewed.options.length) fillFilters({}); // the form still shows (and can clear) the filters
  }

  function query(extra = {}) { return new URLSearchParams({ ...chosen, ...extra }); }

  function fillFilters(facets) {
    for (const [key, , facet] of FILTERS) {
      const values = [...(facets[facet] || [])];
      if (chosen[key] && !values.includes(chosen[key])) values.unshift(chosen[key]); // a linked value kept
      selects[key].replaceChildren(h("option", { value: "" }, "any"),
        ...values.map((v) => h("option", { value: v, selected: v === chosen[key] }, v)));
    }
    selects.reviewed.replaceChildren(...REVIEWED.map(([value, label]) =>
      h("option", { value, selected: value === (chosen.reviewed || "") }, label)));
  }

  function counts() {
    setText(count, tiles.size);
    setText(totalEl, total);
    empty.hidden = tiles.size > 0;
    more.hidden = tiles.size >= total;
    for (const key of [...selected]) if (!tiles.has(key)) selected.delete(key);
    setText(howMany, selected.size ? `${selected.size} selected` : "none selected");
    for (const b of root.querySelectorAll("[data-needs-selection]")) b.disabled = selected.size === 0;
    all.checked = selected.size > 0 && selected.size === tiles.size;
    all.indeterminate = selected.size > 0 && selected.size < tiles.size;
  }

  function pick(key, on) {
    if (on) selected.add(key); else selected.delete(key);
    counts();
  }

  function add(rows) {
    for (const s of rows) {
      const key = `${s.device_id}/${s.sample_id}`;
      if (tiles.has(key)) continue; // a newer sample arrived and shifted the pages
      const tile = sampleTile(s, key, operator ? (on) => pick(key, on) : null, drawing);
      tiles.set(key, tile);
      grid.append(tile.li);
      if (observer) observer.observe(tile.li); else tile.show();
    }
    counts();
  }

  function drop(key) {
    const tile = tiles.get(key);
    if (!tile) return;
    if (observer) observer.unobserve(tile.li);
    tile.dispose();
    tile.li.remove();
    tiles.delete(key);
    total = Math.max(0, total - 1);
  }

  async function reload() {
    const seq = ++loadSeq;
    const [facets, rows] = await Promise.all([api(`samples/facets?${query()}`),
      api(`samples?${query({ limit: PAGE, offset: 0 })}`)]);
    if (seq !== loadSeq) return; // the filters changed meanwhile
    fillFilters(facets);
    for (const key of [...tiles.keys()]) drop(key);
    total = facets.total;
    selected.clear();
    add(rows);
    setText(result, "");
  }

  async function loadMore() {
    const seq = loadSeq;
    more.disabled = true;
    try {
      const rows = await api(`samples?${query({ limit: PAGE, offset: tiles.size })}`);
      if (seq === loadSeq) add(rows);
    } finally {
      more.disabled = false;
    }
  }

  /** Apply `fn` to each selected sample, PARALLEL at a time; the [key, error] of those that failed. */
  async function onSelection(fn) {
    const queue = [...selected], failed = [];
    for (const b of root.querySelectorAll("[data-needs-selection]")) b.disabled = true;
    const worker = async () => {
      for (let key = queue.shift(); key; key = queue.shift()) {
        try { await fn(key, tiles.get(key)); } catch (e) { failed.push([key, e]); }
      }
    };
    await Promise.all(Array.from({ length: Math.min(PARALLEL, queue.length) }, worker));
    counts();
    return failed;
  }

  function report(done, failed, verb) {
    if (!failed.length) { say(`${done} sample${done === 1 ? "" : "s"} ${verb}.`); return; }
    const [key, e] = failed[0];
    say(`${failed.length} of ${done + failed.length} could not be ${verb}: ${key}: ${e.message}`, false);
  }

  async function review(reviewed) {
    const n = selected.size;
    const failed = await onSelection(async (key, tile) => {
      const row = await api(tile.path, { method: "PATCH", body: { reviewed } });
      if (chosen.reviewed && chosen.reviewed !== String(row.reviewed)) drop(key); // no longer in this view
      else tile.update(row);
    });
    report(n - failed.length, failed, reviewed ? "marked reviewed" : "marked unreviewed");
  }

  async function remove() {
    const n = selected.size;
    if (!n || !(await confirmDialog(`Delete ${n} sample${n === 1 ? "" : "s"}? Their frames and labels are gone `
      + "for good.", "Delete"))) return;
    const failed = await onSelection(async (key, tile) => {
      try {
        await api(tile.path, { method: "DELETE" });
      } catch (e) {
        if (e.status !== 404) throw e; // gone already: as deleted
      }
      drop(key);
    });
    report(n - failed.length, failed, "deleted");
  }

  async function exportZip() {
    const name = `samples-${format.value}.zip`;
    exportBtn.disabled = true;
    say(`Exporting ${name}…`);
    try {
      const limit = Math.min(MAX_EXPORT, Math.max(1, total));
      const blob = await apiBlob(`samples/export?${query({ format: format.value, limit })}`);
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      say(`${name}: ${Math.min(total, limit)} samples, ${fmtBytes(blob.size)}.`);
      result.dataset.bytes = String(blob.size);
    } catch (e) {
      say(`Export failed: ${e.message}`, false);
    } finally {
      exportBtn.disabled = false;
    }
  }

  await reload().catch(fail); // a linked filter the API refuses (400) is said here; the form still works
  return {
    refresh: reload,
    unmount() {
      loadSeq++;
      if (observer) observer.disconnect();
      for (const tile of tiles.values()) tile.dispose();
      tiles.clear();
    },
  };
}

function button(label, testid, onclick, cls = "") {
  const needs = ["samples-mark-reviewed", "samples-mark-unreviewed", "samples-delete"].includes(testid);
  return h("button", { type: "button", "data-testid": testid, class: cls, onclick, disabled: needs,
    "data-needs-selection": needs ? "" : null }, label);
}

// ---- one tile ----------------------------------------------------------------

/** A sample's tile: {li, path, check, show() (fetch the frame), update(row), dispose()}. */
function sampleTile(s, key, onPick, drawing) {
  const path = `devices/${encodeURIComponent(s.device_id)}/samples/${encodeURIComponent(s.sample_id)}`;
  const img = h("img", { class: "sample-frame", "data-testid": "sample-frame",
    alt: `frame ${s.sample_id} of ${s.device_id}` });
  const check = h("input", { type: "checkbox", "data-testid": "sample-select", "aria-label": `select ${key}` });
  if (onPick) check.addEventListener("change", () => onPick(check.checked));
  const overlay = svg("svg", { class: "sample-overlay", "data-testid": "sample-overlay", "aria-hidden": "true",
    preserveAspectRatio: "xMidYMid meet" });
  const mark = h("span", { "data-testid": "sample-reviewed" });
  const model = [s.model_name, s.model_version ? `v${s.model_version}` : ""].filter(Boolean).join(" ");
  const li = h("li", { class: "sample", "data-testid": "sample",
    dataset: { key, deviceId: s.device_id, sampleId: s.sample_id } },
    h("div", { class: "sample-stage" }, img, overlay,
      onPick ? h("label", { class: "sample-check" }, check) : null),
    h("div", { class: "sample-meta" },
      h("div", {}, deviceLink(s.device_id), " · ", s.pipeline || DASH, s.stream ? ` / ${s.stream}` : "", " ", mark),
      h("div", {}, h("code", { "data-testid": "sample-rule" }, s.rule || DASH)),
      h("div", { class: "muted", "data-testid": "sample-model", title: s.model_name || "" }, model || DASH),
      h("time", { datetime: new Date(s.captured_at * 1000).toISOString(), title: fmtTime(s.captured_at) },
        fmtAgo(s.captured_at))));
  let url = null, disposed = false;

  function update(row) {
    s = row;
    li.dataset.reviewed = String(row.reviewed);
    li.classList.toggle("reviewed", row.reviewed);
    mark.className = `badge ${row.reviewed ? "ok" : "muted"}`;
    setText(mark, row.reviewed ? "reviewed" : "not reviewed");
    drawBoxes(overlay, row, drawing);
  }

  async function show() {
    if (url || disposed) return;
    try {
      const blob = await apiBlob(`${path}/frame.jpg`);
      if (disposed) return;
      url = URL.createObjectURL(blob);
      img.src = url;
    } catch (e) {
      img.replaceWith(h("span", { class: "error sample-frame" }, `frame: ${e.message}`));
    }
  }

  update(s);
  return { li, path, check, show, update,
    dispose() { disposed = true; if (url) URL.revokeObjectURL(url); url = null; } };
}

/** The model's detections (solid, label and score above) and the corrected labels (dashed, label inside at
 * the bottom) in the frame's own pixels, each with its keypoints; text about a 28th of the frame's larger side. */
function drawBoxes(overlay, s, drawing) {
  overlay.setAttribute("viewBox", `0 0 ${s.width} ${s.height}`);
  const size = Math.max(s.width, s.height) / 28;
  const boxes = [
    ...(s.detections || []).map((d) => [d, "detection",
      typeof d.score === "number" ? `${d.label} ${Math.round(d.score * 100)}%` : d.label]),
    ...(s.labels || []).map((d) => [d, "label", d.label])];
  overlay.replaceChildren(...boxes.map(([d, kind, text]) => {
    const [x1, y1, x2, y2] = d.box;
    const g = svg("g", { class: `box ${kind}` });
    const textY = kind === "label" ? y2 - size * 0.3 : (y1 > size ? y1 - size * 0.3 : y1 + size);
    const past = x1 + text.length * size * 0.6 > s.width; // it would run off the frame: end it at the box's right
    const label = svg("text", { x: past ? x2 - size * 0.2 : x1 + size * 0.2, y: textY, "font-size": size,
      "text-anchor": past ? "end" : "start" });
    label.textContent = text;
    g.append(svg("rect", { x: x1, y: y1, width: Math.max(0, x2 - x1), height: Math.max(0, y2 - y1) }));
    drawKeypoints(g, d.keypoints || [], kind, size, drawing);
    g.append(label); // over the keypoints
    return g;
  }));
}

/** A box's keypoints ([x, y, v] in the frame's pixels): the limbs between two seen ones, then the seen points. */
function drawKeypoints(g, points, kind, size, drawing) {
  if (!points.length) return;
  // a person's label flags 0 (not labelled), 1 (hidden), 2 (visible); a model's v is its confidence
  const seen = points.map(([x, y, v]) => ((kind === "label" ? v > 0 : v > 0 && v >= drawing.visible) ? [x, y] : null));
  for (const [a, b] of drawing.skeletons[String(points.length)] || []) {
    if (seen[a] && seen[b]) {
      g.append(svg("line", { class: "limb", x1: seen[a][0], y1: seen[a][1], x2: seen[b][0], y2: seen[b][1],
        "data-limb": `${a}-${b}` }));
    }
  }
  seen.forEach((p, index) => {
    if (p) g.append(svg("circle", { class: "keypoint", cx: p[0], cy: p[1], r: size * 0.14, "data-index": index }));
  });
}
