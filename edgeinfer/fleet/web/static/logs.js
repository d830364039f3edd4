// Logs and diagnosis on the device page (operators only: a device's log says more than a viewer is shown, and asking
// costs the device work — docs/security.md). The Logs card shows the lines the manager has stored, filtered by level;
// opening the page sends the device nothing. Refresh asks the device for its newer lines (POST
// api/devices/<id>/logs/request: a signed logs command, secrets redacted on the device) and waits a bounded time for
// the answer; Follow keeps them coming (each read with follow=true makes the manager renew its request while the page
// reads). "Run doctor" runs `edgeinfer doctor` on the
// device and shows its findings. An offline or silent device is said plainly, with what was received before.
// The levels are the API's own (LogLine.level in its OpenAPI document).
import { api, apiSchema } from "./api.js";
import { h, clear, setText, fmtTime } from "./dom.js";

const WAIT_S = 10; // for the device's lines, as `edgeinfer fleet logs --wait`
const DOCTOR_WAIT_S = 90; // the device stops its doctor after 60 s
const POLL_MS = 500;
const FOLLOW_MS = 1000;
const SHOWN = 1000; // lines in the page, at most (the newest)

const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});
const answered = (s) => s && s.received_at != null && s.requested_at != null && s.received_at >= s.requested_at;
const clock = (ts) => (ts ? new Date(ts * 1000).toLocaleTimeString(undefined, { hour12: false }) : "?");

/** Why the device has not answered the request `state` is about (null: it has). The CLI's words. */
export function noAnswer(id, state, waitedS) {
  if (!state.online) return `${id} is offline since ${clock(state.last_seen)}`;
  if (state.refused) return `${id} refused the request (${state.refused})`;
  if (!answered(state)) return `no answer from ${id} within ${waitedS} s`;
  return null;
}

/** Read `read()` until `done(state)`, the device is offline or refused, or `waitS` seconds: [state, why]. */
async function awaitAnswer(id, state, read, done, waitS, signal) {
  const until = Date.now() + waitS * 1000;
  while (state.online && !state.refused && !done(state) && Date.now() < until && !signal.aborted) {
    await sleep(POLL_MS, signal);
    if (!signal.aborted) state = (await read()) || state;
  }
  return [state, state.online && done(state) ? null : noAnswer(id, state, waitS)];
}

function lineItem(line) {
  return h("li", { class: `log-line level-${line.level}`, dataset: { level: line.level, id: String(line.id) } },
    h("time", { datetime: new Date(line.ts * 1000).toISOString(), title: fmtTime(line.ts) }, clock(line.ts)), " ",
    h("span", { class: "log-level" }, line.level.toUpperCase()), " ",
    h("span", { class: "log-logger" }, line.logger), " ",
    h("span", { class: "log-message" }, line.message));
}

/** The Logs card: {el, unmount()}. */
export function logsCard(id) {
  const enc = encodeURIComponent(id);
  const ctrl = new AbortController();
  const level = h("select", { id: "logs-level", "data-testid": "logs-level" }, h("option", { value: "" }, "all levels"));
  const follow = h("input", { type: "checkbox", id: "logs-follow", "data-testid": "logs-follow" });
  const refresh = h("button", { type: "button", "data-testid": "logs-refresh" }, "Refresh");
  const status = h("p", { class: "result", "data-testid": "logs-status", role: "status", "aria-live": "polite" });
  const list = h("ol", { class: "log-lines", "data-testid": "log-lines", tabindex: 0, "aria-label": `Log of ${id}` });
  let next = 0; // the after= of the next follow read
  let generation = 0; // a newer load or filter wins over an older one still in flight

  const query = (extra) => new URLSearchParams(Object.entries({ level: level.value, ...extra })
    .filter(([, v]) => v !== "" && v !== undefined && v !== null)).toString();
  const read = (extra) => api(`devices/${enc}/logs?${query(extra)}`, { signal: ctrl.signal });

  function show(lines, append) {
    if (!append) clear(list);
    list.append(...lines.map(lineItem));
    while (list.children.length > SHOWN) list.firstElementChild.remove();
    if (append && lines.length) list.scrollTop = list.scrollHeight;
    list.dataset.count = String(list.children.length);
  }

  function say(text, kind) {
    status.className = `result ${kind || ""}`.trim();
    setText(status, text);
  }

  /** What the manager has, without asking the device (opening the page). */
  async function stored() {
    const mine = ++generation;
    try {
      const page = await read({ limit: SHOWN });
      if (mine !== generation) return;
      show(page.lines, false);
      next = page.next;
      const n = page.lines.length;
      if (!page.online) say(`${noAnswer(id, page, WAIT_S)}; showing the ${n} line${n === 1 ? "" : "s"} received before`,
        "error");
      else if (page.received_at) say(`${n} line${n === 1 ? "" : "s"}, received ${clock(page.received_at)} — Refresh `
        + "asks the device for newer ones");
      else say("nothing received yet: Refresh asks the device for its lines");
    } catch (e) {
      if (e.name !== "AbortError") say(`Logs failed: ${e.message}`, "error");
    }
  }

  /** Ask the device, wait for its answer (bounded), show what the manager has then. */
  async function load() {
    const mine = ++generation;
    refresh.disabled = true;
    say("asking the device…");
    try {
      let state = await api(`devices/${enc}/logs/request`, { method: "POST", body: { follow: follow.checked },
        signal: ctrl.signal });
      let why;
      [state, why] = await awaitAnswer(id, state, () => read({ limit: 1 }),
        (s) => answered(s) && s.complete !== false, WAIT_S, ctrl.signal);
      if (mine !== generation || ctrl.signal.aborted) return;
      const page = await read({ limit: SHOWN });
      if (mine !== generation) return;
      show(page.lines, false);
      next = page.next;
      const n = page.lines.length;
      if (why) say(`${why}; showing the ${n} line${n === 1 ? "" : "s"} received before`, "error");
      else say(`${n} line${n === 1 ? "" : "s"}, received ${clock(page.received_at)}`, "ok");
    } catch (e) {
      if (e.name !== "AbortError") say(`Logs failed: ${e.message}`, "error");
    } finally {
      refresh.disabled = false;
    }
  }

  async function followLoop() {
    const mine = generation;
    while (follow.checked && !ctrl.signal.aborted && mine === generation) {
      await sleep(FOLLOW_MS, ctrl.signal);
      if (!follow.checked || ctrl.signal.aborted || mine !== generation) return;
      try {
        const page = await read({ after: next, follow: true, limit: 5000 });
        if (mine !== generation) return;
        show(page.lines, true);
        next = page.next;
        if (!page.online) say(`${id} went offline at ${clock(page.last_seen)}`, "error");
      } catch (e) {
        if (e.name === "AbortError") return;
        say(`Follow failed: ${e.message}`, "error");
      }
    }
  }

  refresh.addEventListener("click", () => { load().then(() => { if (follow.checked) followLoop(); }); });
  follow.addEventListener("change", () => { if (follow.checked) load().then(followLoop); else generation += 1; });
  level.addEventListener("change", async () => {
    const mine = ++generation;
    try {
      const page = await read({ limit: SHOWN });
      if (mine !== generation) return;
      show(page.lines, false);
      next = page.next;
      if (follow.checked) followLoop();
    } catch (e) {
      if (e.name !== "AbortError") say(`Logs failed: ${e.message}`, "error");
    }
  });
  apiSchema("LogLine").then((schema) => {
    for (const name of ((schema.properties || {}).level || {}).enum || []) level.append(h("option", { value: name }, name));
  }).catch((e) => console.warn("logs:", e.message));

  const doctor = doctorPart(id, ctrl.signal);
  stored();
  return {
    el: h("section", { class: "card logs-card", "data-testid": "logs-card" }, h("h2", {}, "Logs"),
      h("div", { class: "row" }, h("label", { for: level.id }, "Level"), level,
        h("label", { class: "check" }, follow, " Follow"), refresh),
      status, list, doctor.el),
    unmount() { ctrl.abort(); generation += 1; },
  };
}

/** "Run doctor" and the device's last report. */
function doctorPart(id, signal) {
  const enc = encodeURIComponent(id);
  const run = h("button", { type: "button", "data-testid": "doctor-run" }, "Run doctor");
  const status = h("p", { class: "result", "data-testid": "doctor-status", role: "status", "aria-live": "polite" });
  const report = h("div", { "data-testid": "doctor-report" });
  run.addEventListener("click", async () => {
    run.disabled = true;
    status.className = "result";
    setText(status, "running the doctor on the device…");
    clear(report);
    try {
      let state = await api(`devices/${enc}/doctor`, { method: "POST", signal });
      let why;
      [state, why] = await awaitAnswer(id, state, () => api(`devices/${enc}/doctor`, { signal }), answered,
        DOCTOR_WAIT_S, signal);
      if (signal.aborted) return;
      if (why) {
        status.className = "result error";
        setText(status, why);
      } else if (!state.report) {
        status.className = "result error";
        setText(status, `the doctor on ${id} gave no report: ${state.error}`);
      } else {
        const problems = state.report.problems || 0;
        status.className = problems ? "result error" : "result ok";
        setText(status, `${problems ? `${problems} problem${problems === 1 ? "" : "s"} found` : "no problems found"}`
          + ` (${clock(state.ran_at)}, ${Number(state.duration_s || 0).toFixed(1)} s)`);
        report.append(findings(state.report.findings || []));
      }
    } catch (e) {
      if (e.name !== "AbortError") { status.className = "result error"; setText(status, `Doctor failed: ${e.message}`); }
    } finally {
      run.disabled = false;
    }
  });
  return { el: h("div", { class: "doctor" }, h("h3", {}, "Doctor"), h("div", { class: "row" }, run), status, report) };
}

function findings(list) {
  return h("div", { class: "table-wrap" }, h("table", { class: "data compact" },
    h("thead", {}, h("tr", {}, ["Status", "Check", "Detail", "Fix"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, list.map((f) => h("tr", { class: `finding-${f.status}`, dataset: { check: f.check, status: f.status } },
      h("td", {}, f.status), h("td", {}, h("code", {}, f.check)), h("td", {}, f.detail),
      h("td", {}, f.status === "ok" ? "" : f.fix || ""))))));
}
