// Events with evidence: the rules devices triggered (rule_triggered), each with its snapshot and a player
// for its clip. The fleet-wide page (#/events) and the device page's "Detections" share evidenceList().
//
// Evidence is fetched with the token in a header (apiBlob) and shown through blob: URLs — an <img src>
// cannot send the header. An MP4 clip (H.264, what a device with an encoder writes) plays in a <video>;
// an MJPEG one (JPEG frames back to back) is fetched once, split into frames by their JPEG markers here,
// and played in an <img> at the event's own rate (frames / duration_s).
import { api, apiBlob } from "./api.js";
import { h, clear, setText, emptyState, deviceLink, fmtTime, fmtAgo, fmtBytes, fmtNum, DASH } from "./dom.js";

export const RULE_EVENT = "rule_triggered";
const LIMIT = 100;
const DEFAULT_FPS = 5;
const MP4_CLIP = "clip.mp4";
// After an event arrives live, how long (ms) to wait before each look for its uploaded evidence.
const EVIDENCE_RETRIES = [1000, 2000, 4000, 8000, 15000, 30000];
// Unix seconds of 2001: an event's `timestamp` below it is no wall-clock time but a file's position, as agents
// before issue 35 sent it for line and zone events; the message's own `ts` is shown for those.
const WALL_CLOCK_MIN = 1e9;

export async function eventsPage(root) {
  const list = evidenceList({});
  root.replaceChildren(h("div", { "data-testid": "events-page" },
    h("h1", {}, "Events"),
    h("p", { class: "muted" }, "Rules triggered on devices — a line crossed, a zone entered, a detection above "
      + "its score — newest first, with the snapshot and clip each device uploaded."),
    h("section", { class: "card" }, list.el)));
  await list.load();
  return { refresh: list.load, onEvent: list.onEvent, unmount: list.unmount };
}

/** The rule_triggered events of one device (`device`) or of the fleet: {el, load(), onEvent(), unmount()}. */
export function evidenceList({ device = null, limit = LIMIT } = {}) {
  const ol = h("ol", { class: "evidence-list", "data-testid": "evidence-events" });
  const empty = emptyState("no rule has triggered yet");
  const el = h("div", {}, empty, ol);
  const items = new Map(); // device|event_id -> item
  const observer = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      observer.unobserve(entry.target);
      const item = [...items.values()].find((i) => i.li === entry.target);
      if (item) item.showSnapshot();
    }
  }, { rootMargin: "200px" }) : null;

  function add(e) {
    const data = e.data || {};
    if (!data.event_id || !e.device_id) return;
    const key = `${e.device_id}|${data.event_id}`;
    const known = items.get(key);
    if (known) { if (e.evidence) known.update(e.evidence); return; }
    const item = evidenceItem(e);
    items.set(key, item);
    // newest first by the device's time, wherever it arrives from (the first load, a refresh, the stream)
    const ts = Number(item.li.dataset.ts);
    const after = [...ol.children].find((li) => Number(li.dataset.ts) < ts);
    ol.insertBefore(item.li, after || null);
    while (ol.children.length > limit) {
      const last = ol.lastElementChild;
      const gone = [...items.entries()].find(([, i]) => i.li === last);
      if (gone) { gone[1].dispose(); items.delete(gone[0]); }
      last.remove();
    }
    empty.hidden = ol.children.length > 0;
    if (observer) observer.observe(item.li); else item.showSnapshot();
    // arrived live, or moments ago: its evidence may still be uploading
    const ev = e.evidence;
    const recent = Date.now() / 1000 - (e.ts || 0) < 120;
    if (!ev || (recent && data.upload !== false && !(ev.snapshot && ev.clip))) item.watch();
  }

  async function load() {
    const q = new URLSearchParams({ event: RULE_EVENT, limit: String(limit) });
    if (device) q.set("device", device);
    const rows = await api(`events?${q}`);
    for (const e of Array.isArray(rows) ? rows : []) add(e);
    empty.hidden = ol.children.length > 0;
  }

  return {
    el,
    load,
    onEvent(name, payload) {
      if (name !== "events" || !Array.isArray(payload)) return;
      for (const e of payload) {
        if (e && e.event === RULE_EVENT && (!device || e.device_id === device)) add(e);
      }
    },
    unmount() {
      if (observer) observer.disconnect();
      for (const item of items.values()) item.dispose();
      items.clear();
    },
  };
}

function evidenceItem(e) {
  const data = e.data || {};
  const enc = `devices/${encodeURIComponent(e.device_id)}/events/${encodeURIComponent(data.event_id)}`;
  let evidence = e.evidence || null;
  let disposed = false;
  let snapshotUrl = null;
  let player = null;
  let timer = null;

  const thumb = h("div", { class: "evidence-media" }, h("span", { class: "muted" }, "…"));
  const play = h("button", { type: "button", "data-testid": "evidence-play", hidden: true }, "Play clip");
  const info = h("span", { class: "muted evidence-sizes" });
  // when it happened (the wall clock); for a file source, where in the file too (docs/events.md: two times)
  const when = data.timestamp >= WALL_CLOCK_MIN ? data.timestamp : e.ts;
  const inSource = sourcePosition(data);
  const li = h("li", { "data-testid": "evidence-event",
    dataset: { eventId: data.event_id, deviceId: e.device_id, ts: String(e.ts || when || 0) } },
    thumb,
    h("div", { class: "evidence-meta" },
      h("div", {},
        h("time", { datetime: new Date((when || 0) * 1000).toISOString(), title: fmtTime(when) }, fmtAgo(when)),
        " ", deviceLink(e.device_id),
        data.stream ? h("span", { class: "muted" }, ` · ${data.stream}`) : ""),
      h("div", {}, h("span", { class: "badge", "data-testid": "evidence-kind" }, data.kind || DASH), " ",
        h("code", { "data-testid": "evidence-rule" }, data.rule || e.message || "")),
      h("dl", { class: "evidence-facts" },
        fact("label", data.label, "evidence-label"),
        fact("name", data.name),
        fact("track", data.track_id === null || data.track_id === undefined ? null : `#${data.track_id}`,
          "evidence-track"),
        fact("score", typeof data.score === "number" ? fmtNum(data.score, 2) : null),
        inSource ? fact("in the source", inSource, "evidence-source-time") : ""),
      h("div", { class: "row" }, play, info)));

  function fact(label, value, testid) {
    return h("div", {}, h("dt", {}, label), h("dd", testid ? { "data-testid": testid } : {}, value ?? DASH));
  }

  function renderInfo() {
    const ev = evidence || {};
    const parts = [];
    if (ev.snapshot_bytes) parts.push(`snapshot ${fmtBytes(ev.snapshot_bytes)}`);
    if (ev.clip_bytes) parts.push(`clip ${fmtBytes(ev.clip_bytes)}${ev.frames ? `, ${ev.frames} frames` : ""}`);
    if (!parts.length) parts.push(data.upload === false ? "evidence kept on the device" : "no evidence uploaded yet");
    setText(info, parts.join(" · "));
    play.hidden = !ev.clip;
  }

  let wantSnapshot = false;
  async function showSnapshot() {
    wantSnapshot = true;
    if (disposed || snapshotUrl || player) return;
    if (!evidence || !evidence.snapshot) {
      thumb.replaceChildren(h("span", { class: "muted" }, evidence ? "no snapshot" : "…"));
      return;
    }
    try {
      const blob = await apiBlob(`${enc}/snapshot.jpg`);
      if (disposed || snapshotUrl) return;
      snapshotUrl = URL.createObjectURL(blob);
      if (!player) thumb.replaceChildren(snapshotImg());
    } catch (err) {
      thumb.replaceChildren(h("span", { class: "error" }, `snapshot: ${err.message}`));
    }
  }

  function snapshotImg() {
    return h("img", { src: snapshotUrl, alt: `snapshot of ${data.rule || "the event"} on ${e.device_id}`,
      "data-testid": "evidence-snapshot", class: "evidence-img" });
  }

  function update(ev) {
    const had = evidence;
    evidence = ev;
    renderInfo();
    if (wantSnapshot && ev.snapshot && !(had && had.snapshot)) showSnapshot();
  }

  // Live events come without their evidence: look for it a few times while the device may be uploading.
  function watch() {
    let attempt = 0;
    const look = async () => {
      timer = null;
      if (disposed) return;
      try {
        const q = new URLSearchParams({ device: e.device_id, event_id: data.event_id, limit: "1" });
        const rows = await api(`events?${q}`);
        if (Array.isArray(rows) && rows[0] && rows[0].evidence) update(rows[0].evidence);
      } catch { /* try again later */ }
      const complete = evidence && evidence.snapshot && evidence.clip;
      if (!disposed && !complete && data.upload !== false && attempt < EVIDENCE_RETRIES.length) {
        timer = setTimeout(look, EVIDENCE_RETRIES[attempt++]);
      }
    };
    timer = setTimeout(look, EVIDENCE_RETRIES[attempt++]);
  }

  async function togglePlay() {
    if (player) { stopPlaying(); return; }
    play.disabled = true;
    try {
      if (evidence && evidence.clip_name === MP4_CLIP) { await playVideo(); return; }
      const blob = await apiBlob(`${enc}/clip.mjpeg`);
      const frames = jpegFrames(new Uint8Array(await blob.arrayBuffer()));
      if (disposed) return;
      if (!frames.length) throw new Error("no frame in the clip");
      const urls = frames.map(([start, end]) => URL.createObjectURL(blob.slice(start, end, "image/jpeg")));
      const fps = data.frames > 0 && data.duration_s > 0 ? data.frames / data.duration_s : DEFAULT_FPS;
      const img = h("img", { alt: `clip of ${data.rule || "the event"} on ${e.device_id}`, class: "evidence-img",
        "data-testid": "evidence-clip", src: urls[0], dataset: { frame: "0", frames: String(urls.length) } });
      let index = 0;
      const tick = setInterval(() => {
        index = (index + 1) % urls.length; // loops until stopped
        img.src = urls[index];
        img.dataset.frame = String(index);
      }, 1000 / Math.min(60, Math.max(0.2, fps)));
      player = { urls, tick };
      thumb.replaceChildren(img);
      setText(play, "Stop");
    } catch (err) {
      setText(info, `clip: ${err.message}`);
    } finally {
      play.disabled = false;
    }
  }

  async function playVideo() {
    const blob = await apiBlob(`${enc}/${MP4_CLIP}`);
    if (disposed) return;
    const url = URL.createObjectURL(blob);
    const video = h("video", { src: url, controls: true, autoplay: true, muted: true, loop: true, playsinline: true,
      class: "evidence-img", "data-testid": "evidence-clip", "aria-label": `clip of ${data.rule || "the event"}` });
    player = { urls: [url], tick: null };
    thumb.replaceChildren(video);
    setText(play, "Stop");
  }

  function stopPlaying() {
    if (!player) return;
    clearInterval(player.tick);
    for (const url of player.urls) URL.revokeObjectURL(url);
    player = null;
    setText(play, "Play clip");
    thumb.replaceChildren(snapshotUrl ? snapshotImg() : h("span", { class: "muted" }, "…"));
  }

  play.addEventListener("click", togglePlay);
  renderInfo();

  return {
    li,
    showSnapshot,
    update,
    watch,
    dispose() {
      disposed = true;
      clearTimeout(timer);
      stopPlaying();
      if (snapshotUrl) URL.revokeObjectURL(snapshotUrl);
      snapshotUrl = null;
      clear(thumb);
    },
  };
}

/**
 * Where in its source an event happened, when that is not its wall-clock time: "1:19.3" into a file (its
 * `source_time`, or an older agent's `timestamp`); null for a live source (the two times are one).
 */
export function sourcePosition(data) {
  const wall = data.timestamp >= WALL_CLOCK_MIN ? data.timestamp : null;
  const source = typeof data.source_time === "number" ? data.source_time : (wall === null ? data.timestamp : null);
  if (typeof source !== "number" || !Number.isFinite(source)) return null;
  if (wall !== null && Math.abs(source - wall) < 1) return null;
  if (source >= WALL_CLOCK_MIN) return fmtTime(source); // a source with a clock of its own
  const tenths = Math.round(Math.max(0, source) * 10);
  const minutes = Math.floor(tenths / 600), seconds = (tenths - minutes * 600) / 10;
  return `${minutes}:${seconds < 10 ? "0" : ""}${seconds.toFixed(1)}`;
}

/**
 * [start, end) of each whole JPEG in `bytes` (an MJPEG clip), found by walking each frame's markers as
 * edgeinfer/fleet/evidence.py's JpegFrames does: segments by their lengths up to SOS, then entropy-coded
 * data (FF 00 is data, FF D0-D7 restart markers) to the next marker; EOI ends the frame. An embedded
 * thumbnail's FF D9 (inside APP1) does not end one.
 */
export function jpegFrames(bytes) {
  const out = [];
  const n = bytes.length;
  let from = 0;
  frames: while (from < n - 1) {
    let start = bytes.indexOf(0xff, from);
    while (start >= 0 && start < n - 1 && bytes[start + 1] !== 0xd8) start = bytes.indexOf(0xff, start + 1);
    if (start < 0 || start >= n - 1) break;
    let p = start + 2;
    let scan = false;
    for (;;) {
      if (!scan) {
        if (p + 2 > n) break frames;
        if (bytes[p] !== 0xff) { from = start + 1; continue frames; }
        const marker = bytes[p + 1];
        if (marker === 0xff) { p += 1; continue; }
        if (marker === 0xd9) { out.push([start, p + 2]); from = p + 2; continue frames; }
        if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd7)) { p += 2; continue; }
        if (marker === 0x00 || marker === 0xd8) { from = start + 1; continue frames; }
        if (p + 4 > n) break frames;
        const length = (bytes[p + 2] << 8) | bytes[p + 3];
        if (length < 2) { from = start + 1; continue frames; }
        p += 2 + length;
        if (marker === 0xda) scan = true;
      } else {
        const f = bytes.indexOf(0xff, p);
        if (f < 0 || f + 1 >= n) break frames;
        const next = bytes[f + 1];
        if (next === 0x00 || (next >= 0xd0 && next <= 0xd7)) p = f + 2;
        else if (next === 0xff) p = f + 1;
        else { p = f; scan = false; }
      }
    }
  }
  return out;
}
