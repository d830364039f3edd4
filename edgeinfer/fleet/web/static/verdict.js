// What a device did with a command, shown where it was asked for (the live view's editor, the Capture card).
// A command's record (GET api/commands/<id>, fleet/verdicts.py) says where it stands — sent, applied, refused,
// expired — and says it in words (`text`: the same sentence the CLI prints). The live stream's "commands" events
// carry each change; a slow poll stands in while the stream is down. The page adds one thing the record cannot
// know when it changes: that the device is offline while the command waits for it.
import { api } from "./api.js";
import { setText } from "./dom.js";

const POLL_MS = 5000;
export const OFFLINE = "the device is offline: it gets it when it reconnects";

/** The record's words, and the offline note while it waits for a device that is offline. */
export function verdictText(rec, online = true) {
  return rec.state === "sent" && !online ? `${rec.text} — ${OFFLINE}` : rec.text;
}

/** Show `rec` in `el`: its words (after `prefix`), its state as data-state and as a class. */
export function showVerdict(el, rec, { online = true, prefix = "" } = {}) {
  el.dataset.state = rec.state;
  el.dataset.settled = String(Boolean(rec.settled));
  const failed = rec.state === "refused" || rec.state === "expired";
  el.classList.toggle("verdict", true);
  el.classList.toggle("error", failed);
  el.classList.toggle("ok", rec.state === "applied");
  el.classList.toggle("waiting", !rec.settled && !failed);
  setText(el, `${prefix}${verdictText(rec, online)}`);
}

/**
 * Follow command `commandId` until it settles: `onRecord(record)` with its record now (a GET) and at each change (the
 * live stream's "commands" events, handed to `onEvent`; a GET every few seconds meanwhile). Returns {onEvent, stop}.
 */
export function followCommand(commandId, onRecord, { pollMs = POLL_MS } = {}) {
  let stopped = false, last = null, timer = null;
  function take(rec) {
    if (stopped || !rec || rec.command_id !== commandId) return;
    if (last && last.updated_at > rec.updated_at) return; // an older record arriving late
    last = rec;
    onRecord(rec);
    if (rec.settled) stop();
  }
  async function poll() {
    try {
      take(await api(`commands/${encodeURIComponent(commandId)}`));
    } catch (e) {
      console.warn("command", commandId, e.message); // the live stream may still bring it
    }
    if (!stopped) timer = setTimeout(poll, pollMs);
  }
  function stop() {
    stopped = true;
    clearTimeout(timer);
  }
  poll();
  return {
    onEvent(name, data) {
      if (name === "commands" && Array.isArray(data)) for (const rec of data) take(rec);
    },
    stop,
    get record() { return last; },
  };
}
