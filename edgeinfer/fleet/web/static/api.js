// HTTP + change-feed access to the fleet manager API.
// Paths are relative ("api/...") so the dashboard also works behind a reverse proxy sub-path.

const TOKEN_KEY = "edgeinfer.token";

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Called on any 401 so the app can drop back to the sign-in form (set by app.js).
let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

export function headers(extra = {}) {
  const h = { ...extra };
  const t = token.get();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

async function errorFrom(resp) {
  let msg = `${resp.status} ${resp.statusText}`.trim();
  try {
    const body = await resp.json();
    if (body && body.error) msg = body.error;
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(resp.status, msg);
}

/** fetch `api/<path>`: a response that is ok, or an ApiError (0 for the network; a 401 signs out). */
async function send(path, init) {
  let resp;
  try {
    resp = await fetch(`api/${path}`, init);
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, `network error: ${e.message}`);
  }
  if (!resp.ok) {
    const err = await errorFrom(resp);
    if (resp.status === 401) onUnauthorized(err.message);
    throw err;
  }
  return resp;
}

/** JSON request. `body` may be a plain object (sent as JSON) or a Blob/File (sent raw). */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, headers: headers() };
  if (body instanceof Blob) {
    init.body = body; // fetch sets Content-Length from the Blob's size
    init.headers["Content-Type"] = "application/octet-stream";
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await send(path, init);
  if (resp.status === 204) return null;
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

/**
 * A schema of the API's OpenAPI document (/openapi.json, the contract), e.g. "DeploymentSpec": fetched once
 * per page load, with the token. Forms take their bounds and defaults from it instead of repeating them.
 */
let contract = null;
export async function apiSchema(name) {
  if (!contract) {
    contract = fetch("openapi.json", { headers: headers() })
      .then(async (resp) => { if (!resp.ok) throw await errorFrom(resp); return resp.json(); })
      .catch((e) => { contract = null; throw e; });
  }
  const schema = ((await contract).components || {}).schemas || {};
  if (!schema[name]) throw new ApiError(0, `the API describes no ${name}`);
  return schema[name];
}

/**
 * A file from the API as a Blob (evidence: a snapshot, a clip). Fetched with the token in a header, since
 * an <img src> cannot send one; show it through URL.createObjectURL (the page's CSP allows blob: images).
 */
export async function apiBlob(path, { signal } = {}) {
  return (await send(path, { headers: headers(), signal })).blob();
}

/**
 * Change-feed updates from GET api/changes (Server-Sent Events).
 * EventSource cannot send an Authorization header, so this reads the body with fetch() and
 * parses the SSE framing itself. Reconnects with capped exponential backoff + jitter.
 * onEvent(name, data) gets parsed JSON; onState("connected" | "reconnecting" | "off").
 * Returns stop().
 */
export function openStream(onEvent, onState) {
  let stopped = false;
  let ctrl = null;
  let delay = 1000;
  let timer = null;

  async function connect() {
    if (stopped) return;
    ctrl = new AbortController();
    onState("reconnecting");
    try {
      const resp = await fetch("api/changes", {
        headers: headers({ Accept: "text/event-stream" }),
        signal: ctrl.signal,
        cache: "no-store",
      });
      if (resp.status === 401) {
        const err = await errorFrom(resp);
        stopped = true;
        onState("off");
        onUnauthorized(err.message);
        return;
      }
      if (!resp.ok || !resp.body) throw new Error(`stream: HTTP ${resp.status}`);
      onState("connected");
      delay = 1000; // a successful connection resets the backoff
      await readSse(resp.body, onEvent);
    } catch (e) {
      if (stopped || e.name === "AbortError") return;
    }
    if (stopped) return;
    // Dropped (server restart, proxy timeout, network): retry later, never reload the page.
    onState("reconnecting");
    const wait = delay * (0.75 + Math.random() * 0.5);
    delay = Math.min(delay * 2, 30000);
    timer = setTimeout(connect, wait);
  }

  connect();
  return function stop() {
    stopped = true;
    clearTimeout(timer);
    if (ctrl) ctrl.abort();
    onState("off");
  };
}

async function readSse(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let event = "message";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    // Process complete lines only; keep a trailing partial line in buf.
    let m;
    const re = /\r\n|\r|\n/g;
    let start = 0;
    while ((m = re.exec(buf)) !== null) {
      // A lone "\r" at the very end might be the first half of "\r\n": wait for more bytes.
      if (m[0] === "\r" && m.index === buf.length - 1) break;
      const line = buf.slice(start, m.index);
      start = re.lastIndex;
      if (line === "") {
        // Blank line: dispatch the frame (if it carried data).
        if (data.length) {
          let parsed;
          try { parsed = JSON.parse(data.join("\n")); } catch { parsed = undefined; }
          if (parsed !== undefined) onEvent(event, parsed);
        }
        event = "message";
        data = [];
      } else if (line.startsWith(":")) {
        // keep-alive comment
      } else {
        const i = line.indexOf(":");
        const field = i < 0 ? line : line.slice(0, i);
        let val = i < 0 ? "" : line.slice(i + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "event") event = val || "message";
        else if (field === "data") data.push(val);
        // "id"/"retry" are ignored: after a reconnect app.js re-fetches the current page instead.
      }
    }
    buf = buf.slice(start);
  }
}
