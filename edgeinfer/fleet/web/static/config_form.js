// A form generated from a JSON Schema (the configuration layer's from GET api/config/schema, or a model of the API's
// OpenAPI document such as RolloutOptions): every field's type, choices, bounds, default and the schema's own words
// (`errorMessage`, `description`) come from the schema, so no key is defined twice. Nothing is judged here: the
// manager judges an edit as it would a save (POST api/config/layers/…/check) and `setProblems` shows its words at
// each field's key (`pipelines[0].max_fps`).
//
// A layer sets a few keys and inherits the rest, so the form is sparse: it shows the keys the value sets, each with
// a button that unsets it, and a select that adds any other key of the schema. `all: true` shows every key instead
// (an empty field is left out: the API's default). Lists of objects (pipelines) are a sub-form per item, added and
// removed; an item `{name, $patch: delete}` (removes that pipeline of the layers below) is shown as such.
import { h, put, setText } from "./dom.js";

const TYPE_WORDS = {
  string: "text", integer: "a whole number", number: "a number", boolean: "true or false", array: "a list",
  object: "keys", null: "null",
};
const BOUNDS = [["minimum", "≥"], ["exclusiveMinimum", ">"], ["maximum", "≤"], ["exclusiveMaximum", "<"]];
const NUMERIC = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
const PATCH = "$patch";

/** A schema's own branch when OpenAPI wraps a nullable one (anyOf [X, {type: null}]), and whether null is taken. */
function unwrap(schema) {
  const branches = schema.anyOf || schema.oneOf;
  if (!branches) return [schema, types(schema).includes("null")];
  const real = branches.filter((b) => b.type !== "null");
  const merged = { ...(real.length === 1 ? real[0] : {}), ...schema };
  delete merged.anyOf; delete merged.oneOf;
  return [merged, real.length < branches.length];
}

function types(schema) {
  if (schema.enum) return ["enum"];
  const t = schema.type;
  return (Array.isArray(t) ? t : t ? [t] : []).filter((x) => x !== "null");
}

/** How a field of `schema` is edited. */
function kindOf(schema) {
  const t = types(schema);
  if (t[0] === "enum") return "enum";
  if (t.length === 1) {
    if (t[0] === "boolean") return "boolean";
    if (t[0] === "integer" || t[0] === "number") return "number";
    if (t[0] === "string") return "text";
    if (t[0] === "object" && schema.properties) return "object";
    if (t[0] === "array") {
      const items = schema.items || {};
      if (types(items).length === 1 && types(items)[0] === "string") return "lines";
      if (types(items).length === 1 && types(items)[0] === "object" && items.properties) return "list";
      return "json";
    }
  }
  return t.length && t.every((x) => ["string", "integer", "number", "array"].includes(x)) ? "mixed" : "json";
}

/** The schema in words: its type, bounds, default and errorMessage ("a number ≥ 0 ≤ 1 · default 0.5"). */
export function hint(schema) {
  const [s, nullable] = unwrap(schema);
  const parts = [];
  if (s.enum) parts.push(`one of ${s.enum.join(", ")}`);
  else {
    const t = types(s);
    const words = t.map((x) => TYPE_WORDS[x] || x).join(" or ");
    const bounds = BOUNDS.filter(([k]) => s[k] !== undefined).map(([k, sym]) => `${sym} ${s[k]}`).join(" ");
    if (words) parts.push([words, bounds].filter(Boolean).join(" "));
    if (kindOf(s) === "lines") parts.push(`one a line${s.maxItems !== undefined ? `, at most ${s.maxItems}` : ""}`);
  }
  if (nullable) parts.push("or empty");
  if (s.default !== undefined && s.default !== null) parts.push(`default ${shown(s.default)}`);
  if (s.errorMessage) parts.push(s.errorMessage);
  return parts.join(" · ");
}

const shown = (v) => (typeof v === "string" ? v : JSON.stringify(v));
const cssId = (path) => `cfg-${path.replace(/[^A-Za-z0-9_-]+/g, "-")}`;

/** A value typed in a mixed field, as JSON would carry it (a number, a list, or the text itself). */
function parseMixed(text, schema) {
  const t = text.trim();
  const kinds = types(schema);
  if ((kinds.includes("integer") || kinds.includes("number")) && NUMERIC.test(t)) return Number(t);
  if (/^[[{]/.test(t) && (kinds.includes("array") || kinds.includes("object"))) {
    try { return JSON.parse(t); } catch { /* left as text: the manager says what is wrong */ }
  }
  return text;
}

function parseJson(text) {
  try { return JSON.parse(text); } catch { return text; } // the manager names the key and says it is not a list
}

/** What a newly added key starts as: the schema's default, else an empty value of its kind. */
function initial(schema) {
  const [s] = unwrap(schema);
  if (s.default !== undefined && s.default !== null) return structuredClone(s.default);
  return { enum: s.enum && s.enum[0], boolean: false, object: {}, list: [], lines: [], json: [] }[kindOf(s)] ?? "";
}

/**
 * The form: {el, value() (the document as the fields say it), setProblems([{key, words}]) (each shown at its
 * field, or the nearest one above it; the keys no field shows are returned)}. opts: readOnly, all, onChange().
 */
export function schemaForm(schema, value, opts = {}) {
  const ctx = { readOnly: !!opts.readOnly, all: !!opts.all, changed: () => opts.onChange && opts.onChange() };
  const el = h("div", { class: "schema-form" });
  let root = null;
  // an item removed from a list: the form is drawn again, so every field's path names its item's new place
  ctx.rebuild = () => { const v = root.get(); root = objectNode(schema, v, "", ctx, true); el.replaceChildren(root.el); ctx.changed(); };
  root = objectNode(schema, value || {}, "", ctx, true);
  el.append(root.el);
  return {
    el,
    value: () => root.get(),
    setProblems(problems) {
      for (const old of el.querySelectorAll(".field-problem")) old.remove();
      for (const old of el.querySelectorAll("[aria-invalid]")) old.removeAttribute("aria-invalid");
      const unshown = [];
      for (const p of problems || []) {
        const target = fieldFor(el, p.key);
        if (!target) { unshown.push(p); continue; }
        const input = target.querySelector(":scope > .field-input [data-path], :scope > .field-input");
        if (input) input.setAttribute("aria-invalid", "true");
        target.querySelector(":scope > .field-input, :scope > .item-body")
          .after(h("p", { class: "field-problem error", role: "alert", dataset: { key: p.key } }, `${p.key}: ${p.words}`));
      }
      return unshown;
    },
  };
}

/** The field (or list item) of `key`, or of the nearest key above it (pipelines[0].lines[2] → pipelines[0].lines). */
function fieldFor(rootEl, key) {
  let path = key;
  while (path) {
    const found = [...rootEl.querySelectorAll("[data-field]")].find((el) => el.dataset.field === path);
    if (found) return found;
    const m = path.match(/^(.*)(\[[^\]]*\]|\.[^.[\]]+)$/);
    path = m ? m[1] : "";
  }
  return null;
}

// ---- an object: its keys as fields (the ones set, or all), and a select that adds the others --------------------

function objectNode(schema, value, path, ctx, top = false) {
  const [s] = unwrap(schema);
  const props = s.properties || {};
  const rows = new Map(); // key -> {el, get}
  const body = h("div", { class: top ? "form-body" : "form-grid nested" });
  const add = h("select", { "data-testid": "cfg-add", dataset: { path }, "aria-label": `Add a key${path ? ` to ${path}` : ""}` });
  const el = h("div", { class: "schema-object", dataset: { object: path } }, body,
    ctx.readOnly || ctx.all ? null : h("div", { class: "row add-key" }, add));

  const sub = (key) => (path ? `${path}.${key}` : key);
  function addRow(key, v, focus) {
    const row = field(key, props[key], v, sub(key), ctx, () => { row.el.remove(); rows.delete(key); fillAdd(); ctx.changed(); });
    rows.set(key, row);
    // keep the schema's order: the row goes before the first shown key that comes after it in the schema
    const order = Object.keys(props);
    const next = [...rows.keys()].filter((k) => k !== key && order.indexOf(k) > order.indexOf(key))
      .sort((a, b) => order.indexOf(a) - order.indexOf(b))[0];
    if (next !== undefined && order.includes(key)) body.insertBefore(row.el, rows.get(next).el);
    else body.append(row.el);
    if (focus) { const input = row.el.querySelector("input, select, textarea"); if (input) input.focus(); }
  }
  function fillAdd() {
    const free = Object.keys(props).filter((k) => !rows.has(k));
    put(add, h("option", { value: "" }, free.length ? `Add a setting${path ? ` to ${path}` : ""}…` : "every key is set"),
      free.map((k) => h("option", { value: k, title: hint(props[k]) }, k)));
    add.disabled = !free.length;
  }
  add.addEventListener("change", () => {
    const key = add.value;
    if (!key) return;
    addRow(key, initial(props[key]), true);
    fillAdd();
    ctx.changed();
  });

  // a list item shows its name always (pipelines merge by name); `all` shows every key
  const keys = ctx.all ? Object.keys(props) : [...Object.keys(props).filter((k) => k in value || (k === "name" && path.endsWith("]"))),
    ...Object.keys(value).filter((k) => !(k in props))]; // a key the schema does not know: shown, for its problem
  for (const key of keys) addRow(key, key in value ? value[key] : (ctx.all ? undefined : initial(props[key] || {})), false);
  fillAdd();
  return {
    el,
    get() {
      const out = {};
      for (const [key, row] of rows) {
        const v = row.get();
        if (v !== undefined) out[key] = v;
      }
      return out;
    },
  };
}

// ---- one key ----------------------------------------------------------------------------------------------------

function field(key, schema, value, path, ctx, unset) {
  const known = schema !== undefined;
  const [s, nullable] = unwrap(schema || {});
  const kind = value === null && !ctx.all ? "null" : known ? kindOf(s) : "json";
  const id = cssId(path);
  const label = h("label", { for: id, title: s.description || "" }, key);
  const help = h("small", { class: "muted field-hint" }, known ? hint(schema) : "not a key of the schema");
  const remove = ctx.readOnly || ctx.all ? null : h("button", {
    type: "button", class: "unset", "data-testid": "cfg-unset", dataset: { path }, title: `Unset ${key} (the layers below, or agent.yaml, say it)`,
    "aria-label": `Unset ${path}`, onclick: unset,
  }, "×");
  const common = { id, dataset: { path }, disabled: ctx.readOnly, oninput: ctx.changed, onchange: ctx.changed };
  let input, get;
  switch (kind) {
    case "null":
      input = h("span", { class: "muted", dataset: { path } }, "null — removes what the layers below set");
      get = () => null;
      break;
    case "enum":
    case "boolean": {
      const options = kind === "enum" ? s.enum : [true, false];
      input = h("select", common, ctx.all ? h("option", { value: "" }, s.default !== undefined ? `default (${shown(s.default)})` : "default") : null,
        options.map((o) => h("option", { value: JSON.stringify(o), selected: value === o }, String(o))));
      if (value !== undefined && !options.includes(value)) input.append(h("option", { value: JSON.stringify(value), selected: true }, shown(value)));
      get = () => (input.value === "" ? undefined : JSON.parse(input.value));
      break;
    }
    case "number":
      input = h("input", { ...common, type: "number", step: types(s)[0] === "integer" ? 1 : "any", min: s.minimum, max: s.maximum,
        value: value === undefined ? "" : String(value), placeholder: s.default !== undefined && s.default !== null ? String(s.default) : "" });
      get = () => {
        if (input.value === "" && !input.validity.badInput) return ctx.all || nullable ? undefined : "";
        return input.value === "" ? "" : Number(input.value);
      };
      break;
    case "text":
      input = h("input", { ...common, type: "text", autocomplete: "off", spellcheck: "false", maxlength: s.maxLength,
        value: value === undefined ? "" : String(value) });
      get = () => (ctx.all && input.value === "" ? undefined : input.value);
      break;
    case "lines":
      input = h("textarea", { ...common, rows: Math.min(6, Math.max(2, (Array.isArray(value) ? value.length : 1) + 1)), spellcheck: "false",
        value: Array.isArray(value) ? value.join("\n") : value === undefined ? "" : String(value) });
      get = () => input.value.split("\n").map((line) => line.trim()).filter(Boolean);
      break;
    case "mixed":
      input = h("input", { ...common, type: "text", autocomplete: "off", spellcheck: "false",
        value: value === undefined ? "" : typeof value === "string" ? value : JSON.stringify(value) });
      get = () => (ctx.all && input.value === "" ? undefined : parseMixed(input.value, s));
      break;
    case "object": {
      const node = objectNode(s, value && typeof value === "object" ? value : {}, path, ctx);
      return wrap(key, path, h("fieldset", { class: "field-input" }, h("legend", {}, key, remove ? " " : "", remove), node.el), null, node.get);
    }
    case "list": {
      const node = listNode(s, Array.isArray(value) ? value : [], path, ctx);
      return wrap(key, path, h("div", { class: "field-input" }, node.el), null, node.get, "list-field");
    }
    default: // json: a value of any other form, written as JSON
      input = h("textarea", { ...common, rows: 2, spellcheck: "false", class: "json",
        value: value === undefined ? "" : JSON.stringify(value) });
      get = () => parseJson(input.value);
  }
  return wrap(key, path, h("div", { class: "field-input" }, input, remove), [label], get, "", help);
}

function wrap(key, path, inputEl, labelEls, get, cls = "", help = null) {
  const el = h("div", { class: `field ${cls}`.trim(), dataset: { field: path, key } }, labelEls, inputEl, help);
  return { el, get };
}

// ---- a list of objects (pipelines): a sub-form per item ------------------------------------------------------------

function listNode(schema, items, path, ctx) {
  const itemSchema = schema.items;
  const list = h("ol", { class: "items" });
  const nodes = []; // {li, get} in order
  const addBtn = ctx.readOnly ? null : h("button", { type: "button", "data-testid": "cfg-add-item", dataset: { path },
    onclick: () => { addItem({}); renumber(); ctx.changed(); } }, `Add to ${path.split(".").pop()}`);

  function renumber() {
    nodes.forEach((n, i) => setText(n.title, n.isMarker ? `removes ${n.markerName}` : n.name() || `#${i + 1}`));
  }
  function addItem(item) {
    const i = nodes.length;
    const at = `${path}[${i}]`;
    const isMarker = item && typeof item === "object" && PATCH in item;
    const title = h("strong", { class: "item-title" });
    const remove = ctx.readOnly ? null : h("button", { type: "button", class: "danger", "data-testid": "cfg-remove-item",
      dataset: { path: at }, onclick: () => { nodes.splice(nodes.indexOf(entry), 1); li.remove(); ctx.rebuild(); } }, "Remove");
    let body, get, name;
    if (isMarker) {
      body = h("p", { class: "item-body muted" }, `{name: ${item.name}, ${PATCH}: ${item[PATCH]}}: removes the pipeline ${item.name} the layers below set`);
      get = () => item;
      name = () => item.name;
    } else {
      const node = objectNode(itemSchema, item && typeof item === "object" ? item : {}, at, ctx);
      body = h("div", { class: "item-body" }, node.el);
      get = node.get;
      name = () => { const v = node.get().name; return typeof v === "string" ? v : ""; };
    }
    const li = h("li", { class: "item card", dataset: { field: at } }, h("div", { class: "row item-head" }, title, remove), body);
    const entry = { li, get, name, title, isMarker, markerName: isMarker ? item.name : "" };
    nodes.push(entry);
    list.append(li);
    li.addEventListener("input", renumber); // its title is its name
  }
  for (const item of items) addItem(item);
  renumber();
  return { el: h("div", { class: "list" }, list, addBtn), get: () => nodes.map((n) => n.get()) };
}
