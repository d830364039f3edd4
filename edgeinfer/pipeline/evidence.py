"""Evidence for events: a JPEG snapshot and a short clip, pre-roll and post-roll, in a bounded store.

Three parts, each usable alone:

* :class:`FrameHistory` — the pre-roll ring. Of the frames offered it keeps at most ``fps`` a
  second (chosen by the frames' own timestamps, on a fixed grid so a 30 fps camera gives exactly
  every 6th frame at 5 fps), each downscaled to at most ``width`` pixels wide and JPEG-encoded
  once; the last ``seconds * fps`` of them. A frame it does not keep costs a comparison: no copy,
  no resize, no encode. Encoding at once means the ring never holds a reference to a buffer the
  pipeline reuses.
* :class:`EvidenceRecorder` — ``trigger(event, own=...)`` starts a recording: the event's own frame
  (handed with it; without one, the newest kept frame) is the snapshot, the kept frames of the
  ``seconds`` before it the pre-roll, and the frames kept until ``post_s`` seconds after it the
  post-roll — all by the frames' timestamps, which are the *source's* time (a file read faster
  than real time still gives 2 s of its own before the event); then the clip is written to the
  store. Recordings may overlap: every kept frame is encoded once and its bytes shared by all.
* :class:`EvidenceStore` — one folder per event, ``<event id>/snapshot.jpg`` (annotated),
  ``frame.jpg``, ``clip.mp4`` or ``clip.mjpeg`` (:mod:`.evidence_clip`) and ``event.json``,
  each written atomically (:func:`edgeinfer.util.fs.atomic_path`), ``event.json`` last: a folder
  without a readable ``event.json`` that matches its files is not an event, and is removed when the
  store opens. Bounded in bytes and in events: the oldest go first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputMismatch, OutputError
from ..forms.evidence import CLIP_NAME, CLIP_NAMES, EVENT_ID, PLAIN_SNAPSHOT_NAME, SNAPSHOT_NAME, new_event_id
from ..util.fs import atomic_write_bytes, remove_record
from .evidence_clip import write_clip

log = logging.getLogger(__name__)

META_NAME = "event.json"
#: the version of event.json's layout
META_VERSION = 2
#: a safe folder name for get(): no separators, no leading dot, bounded
_SAFE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,127}\Z")


@dataclass(frozen=True)
class EncodedFrame:
    """One kept frame: its id and timestamp as offered, and its JPEG bytes (shared, never copied)."""

    frame_id: int
    timestamp: float
    jpeg: bytes


def check_frame(frame: Any) -> np.ndarray:
    """The frame if it is an HxWx3 uint8 (BGR) array; :class:`InputMismatch` otherwise."""
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        what = (f"{frame.dtype} array of shape {frame.shape}" if isinstance(frame, np.ndarray)
                else type(frame).__name__)
        raise InputMismatch(f"evidence frames must be HxWx3 uint8 BGR arrays, not a {what}")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise InputMismatch(f"evidence frame is empty: shape {frame.shape}")
    return frame


class FrameHistory:
    """The pre-roll ring: at most ``fps`` JPEG frames a second, ``width`` px wide at most, the last
    ``seconds`` of them. Not thread-safe on its own (the recorder locks around it)."""

    def __init__(self, seconds: float = 2.0, fps: float = 5.0, width: int = 640, quality: int = 80) -> None:
        if not seconds > 0 or not fps > 0:
            raise ValueError(f"seconds and fps must be positive, not {seconds!r} and {fps!r}")
        if int(width) < 16:
            raise ValueError(f"width must be at least 16 pixels, not {width!r}")
        if not 1 <= int(quality) <= 100:
            raise ValueError(f"quality must be 1..100, not {quality!r}")
        self.seconds = float(seconds)
        self.fps = float(fps)
        self.width = int(width)
        self.quality = int(quality)
        self.interval = 1.0 / self.fps
        #: a frame this early before its slot on the grid still takes it (float timestamps, jitter)
        self._slack = self.interval * 1e-3
        self._frames: deque[EncodedFrame] = deque(maxlen=max(1, round(self.seconds * self.fps)))
        self._due: float | None = None
        self._last: float | None = None  # the timestamp of the last frame kept
        #: frames offered, kept (encoded) and skipped
        self.offered = 0
        self.kept = 0

    @property
    def capacity(self) -> int:
        return self._frames.maxlen or 1

    def __len__(self) -> int:
        return len(self._frames)

    def offer(self, frame: np.ndarray, frame_id: int, timestamp: float, *, keep: bool = False) -> EncodedFrame | None:
        """Keep the frame (encoded) if its time has come on the ``fps`` grid, or ``keep`` says so
        (the frame an event was decided on); returns what was kept, None for a skipped frame."""
        check_frame(frame)
        newest = self._frames[-1] if self._frames else None
        if newest is not None and newest.frame_id == frame_id and newest.timestamp == float(timestamp):
            self.offered += 1
            return newest  # offered again (forced after a normal offer): already encoded
        if not self.due(timestamp, keep=keep):
            return None
        return self.add(frame, frame_id, timestamp)

    def due(self, timestamp: float, *, keep: bool = False) -> bool:
        """Whether a frame taken at ``timestamp`` is to be kept (and, if so, its slot on the grid is
        taken): the cheap half of :meth:`offer`, for a caller that encodes elsewhere (:meth:`add`)."""
        self.offered += 1
        timestamp = float(timestamp)
        due, last = self._due, self._last
        backwards = last is not None and timestamp < last  # a source restarted
        on_time = due is None or backwards or timestamp >= due - self._slack
        if not (on_time or keep):
            return False
        self._last = timestamp
        if on_time:
            # the next slot on the grid; after a gap (or a restart) the grid starts again here
            self._due = due + self.interval if due is not None and not backwards else timestamp + self.interval
            if self._due <= timestamp + self._slack:
                self._due = timestamp + self.interval
        return True

    def add(self, frame: np.ndarray, frame_id: int, timestamp: float) -> EncodedFrame:
        """Encode ``frame`` (downscaled to ``width``) and keep it as the newest: the other half of :meth:`offer`."""
        check_frame(frame)
        encoded = EncodedFrame(int(frame_id), float(timestamp), self.encode(frame))
        self._frames.append(encoded)
        self.kept += 1
        return encoded

    def downscaled(self, frame: np.ndarray) -> np.ndarray:
        """A copy of ``frame`` at most ``width`` wide (what :meth:`add` encodes; encoding it again is a no-op
        resize): lets a caller hand a frame buffer it reuses to another thread cheaply."""
        import cv2

        check_frame(frame)
        height, width = frame.shape[:2]
        if width <= self.width:
            return frame.copy()
        size = (self.width, max(1, round(height * self.width / width)))
        return cv2.resize(frame, size, interpolation=cv2.INTER_AREA)

    def encode(self, frame: np.ndarray) -> bytes:
        """``frame`` downscaled to ``width`` at most, as a JPEG of this history's quality."""
        import cv2

        height, width = frame.shape[:2]
        if width > self.width:
            size = (self.width, max(1, round(height * self.width / width)))
            frame = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
        ok, data = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            raise InputMismatch(f"a frame of shape {frame.shape} could not be JPEG-encoded")
        return data.tobytes()

    def snapshot(self) -> EncodedFrame | None:
        """The newest kept frame (``frame_id``, ``timestamp``, ``jpeg``), or None before the first."""
        return self._frames[-1] if self._frames else None

    def frames(self) -> list[EncodedFrame]:
        """The pre-roll: the kept frames of the last ``seconds`` before the newest, oldest first."""
        if not self._frames:
            return []
        since = self._frames[-1].timestamp - self.seconds - self._slack
        return [frame for frame in self._frames if frame.timestamp >= since]

    def around(self, timestamp: float) -> list[EncodedFrame]:
        """The kept frames from ``seconds`` before ``timestamp`` on (those after it too: the post-roll
        already kept when an event arrives behind later frames), oldest first."""
        since = float(timestamp) - self.seconds - self._slack
        return [frame for frame in self._frames if frame.timestamp >= since]

    def clear(self) -> None:
        self._frames.clear()
        self._due = self._last = None


@dataclass
class _Recording:
    event_id: str
    event: dict
    snapshot: EncodedFrame | None
    frames: list[EncodedFrame] = field(default_factory=list)
    #: the snapshot with what the model saw drawn on it (JPEG), when the event came with its frame
    annotated: bytes | None = None
    #: the frame timestamp the post-roll ends at (None until the first frame arrives)
    end: float | None = None


class EvidenceRecorder:
    """Recordings of events: snapshot, pre-roll from ``history``, ``post_s`` seconds of post-roll,
    written to ``store``. Thread-safe: the pipeline offers frames, rules trigger, the agent takes
    :meth:`finished` events, from any threads."""

    def __init__(self, store: EvidenceStore, history: FrameHistory | None = None, post_s: float = 3.0) -> None:
        if not post_s >= 0:
            raise ValueError(f"post_s must be zero or more, not {post_s!r}")
        self.store = store
        self.history = history if history is not None else FrameHistory()
        self.post_s = float(post_s)
        self._lock = threading.Lock()
        self._active: list[_Recording] = []
        self._finished: list[dict] = []
        #: recordings that could not be written (disk full, permissions): logged, then dropped
        self.failed = 0

    @property
    def recording(self) -> int:
        """Recordings in progress."""
        with self._lock:
            return len(self._active)

    def offer(self, frame: np.ndarray, frame_id: int, timestamp: float, *, keep: bool = False) -> EncodedFrame | None:
        """Feed the history and every recording in progress (one encode per kept frame, shared);
        recordings whose post-roll is complete are written. Returns the kept frame or None."""
        with self._lock:
            encoded = self.history.offer(frame, frame_id, timestamp, keep=keep)
            done = self._advance(float(timestamp), encoded)
        self._write(done)
        return encoded

    def add(self, frame: np.ndarray, frame_id: int, timestamp: float) -> EncodedFrame:
        """A frame already found due (:meth:`FrameHistory.due`, in another thread): encode it into the
        history and every recording in progress; recordings whose post-roll is complete are written."""
        with self._lock:
            encoded = self.history.add(frame, frame_id, timestamp)
            done = self._advance(float(timestamp), encoded)
        self._write(done)
        return encoded

    def expire(self, now: float, grace_s: float = 2.0) -> int:
        """Finish the recordings whose post-roll should have ended ``grace_s`` before ``now`` (the
        frames' clock) with what they have: a source that stalled or ended must not hold them. Returns
        how many were written."""
        with self._lock:
            done = [r for r in self._active if r.end is not None and now > r.end + grace_s]
            if done:
                self._active = [r for r in self._active if r not in done]
        self._write(done)
        return len(done)

    def trigger(self, event: dict, *, frame_id: int | None = None, own: EncodedFrame | None = None,
                annotated: bytes | None = None) -> str:
        """Start recording ``event`` (a JSON-serialisable dict) now; returns its event id.

        The snapshot is ``own``, the event's own frame (``annotated``: the same with what the model saw
        drawn), and the pre-roll the kept frames of the ``seconds`` before it; without ``own``, the newest
        kept frame and the kept frames of the last ``seconds``.
        """
        if not isinstance(event, dict):
            raise TypeError(f"event must be a dict, not {type(event).__name__}")
        json.dumps(event)  # a caller's unserialisable event fails here, not when the clip is written
        with self._lock:
            if own is None:
                snapshot, frames = self.history.snapshot(), self.history.frames()
            else:
                snapshot, frames = own, self._with_own(own)
            ident = frame_id if frame_id is not None else snapshot.frame_id if snapshot else 0
            recording = _Recording(new_event_id(ident), dict(event), snapshot, frames, annotated=annotated)
            if snapshot is not None:
                recording.end = snapshot.timestamp + self.post_s
            done = []
            if snapshot is not None and self.post_s == 0:
                done.append(recording)
            else:
                self._active.append(recording)
        self._write(done)
        return recording.event_id

    def encode(self, frame: np.ndarray, frame_id: int, timestamp: float) -> EncodedFrame:
        """An event's own frame as the history would keep it (not kept: call from the thread that writes)."""
        return EncodedFrame(int(frame_id), float(timestamp), self.history.encode(frame))

    def _with_own(self, own: EncodedFrame) -> list[EncodedFrame]:
        """The kept frames around ``own`` with ``own`` in its place by time (the lock is held)."""
        frames = [frame for frame in self.history.around(own.timestamp) if frame.frame_id != own.frame_id]
        before = [frame for frame in frames if frame.timestamp <= own.timestamp]
        return [*before, own, *frames[len(before):]]

    def flush(self) -> None:
        """Finish every recording now, with the post-roll it has (at shutdown)."""
        with self._lock:
            done, self._active = self._active, []
        self._write(done)

    def finished(self) -> list[dict]:
        """The events whose evidence is written since the last call, oldest first (and forgets them)."""
        with self._lock:
            done, self._finished = self._finished, []
        return done

    def _advance(self, timestamp: float, encoded: EncodedFrame | None) -> list[_Recording]:
        """Add the kept frame to each recording; return those whose post-roll is over."""
        done: list[_Recording] = []
        slack = self.history.interval * 1e-3
        for recording in self._active:
            if recording.end is None:  # triggered before any frame: this one starts it
                if encoded is None:
                    continue
                recording.snapshot, recording.end = encoded, encoded.timestamp + self.post_s
                recording.frames.append(encoded)
            elif timestamp > recording.end + slack or timestamp < recording.frames[-1].timestamp:
                done.append(recording)  # past the end (or the source restarted): without this frame
                continue
            elif encoded is not None:
                recording.frames.append(encoded)
            if timestamp >= recording.end - slack:
                done.append(recording)
        if done:
            self._active = [recording for recording in self._active if recording not in done]
        return done

    def _write(self, done: list[_Recording]) -> None:
        for recording in done:
            if recording.snapshot is None:  # never saw a frame (flushed before the first)
                log.warning("event %s: no frame was offered; no evidence written", recording.event_id)
                continue
            try:
                result = self.store.write(recording.event_id, recording.event, recording.snapshot, recording.frames,
                                          annotated=recording.annotated)
            except OutputError as exc:
                self.failed += 1
                log.warning("event %s: evidence not written: %s", recording.event_id, exc)
                continue
            with self._lock:
                self._finished.append(result)


@dataclass(frozen=True)
class StoredEvent:
    """An event in the store: its folder and what its ``event.json`` says."""

    event_id: str
    folder: Path
    meta: dict
    #: bytes on disk: snapshot, clip and event.json
    size: int

    @property
    def snapshot_path(self) -> Path:
        return self.folder / SNAPSHOT_NAME

    @property
    def plain_snapshot_path(self) -> Path | None:
        """The snapshot without drawing (None for an event stored before there was one)."""
        return self.folder / PLAIN_SNAPSHOT_NAME if "plain_bytes" in self.meta else None

    @property
    def clip_path(self) -> Path:
        return self.folder / self.meta.get("clip", CLIP_NAME)

    def summary(self) -> dict:
        """What :meth:`EvidenceRecorder.finished` returns for it (paths as text, JSON-ready)."""
        meta = self.meta
        plain = self.plain_snapshot_path
        return {"event_id": self.event_id, "event": meta["event"], "snapshot": str(self.snapshot_path),
                "plain_snapshot": str(plain) if plain is not None else None, "clip": str(self.clip_path),
                "frames": meta["frames"], "first_frame_id": meta["first_frame_id"],
                "last_frame_id": meta["last_frame_id"], "snapshot_frame_id": meta["snapshot_frame_id"],
                "start": meta["start"], "end": meta["end"], "created": meta["created"], "bytes": self.size}


class EvidenceStore:
    """Events on disk under ``root``, at most ``max_bytes`` and ``max_events`` (the oldest deleted
    first; the newest event is always kept, even alone over ``max_bytes``). Thread-safe."""

    def __init__(self, root: str | os.PathLike, max_bytes: int = 200 * 1024 * 1024, max_events: int = 500, *,
                 mp4: bool = True) -> None:
        if int(max_bytes) <= 0 or int(max_events) <= 0:
            raise ValueError(f"max_bytes and max_events must be positive, not {max_bytes!r} and {max_events!r}")
        self.root = Path(root)
        #: clips as H.264/MP4 where an encoder is at hand (else, and when False, MJPEG)
        self.mp4 = mp4
        self.max_bytes = int(max_bytes)
        self.max_events = int(max_events)
        self._lock = threading.Lock()
        #: oldest first
        self._events: list[StoredEvent] = []
        self._bytes = 0
        #: folders removed when the store opened (partial or corrupt events, temporaries)
        self.cleaned: list[str] = []
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the evidence folder {self.root}: {exc}") from exc
        self._load()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    def list(self) -> list[StoredEvent]:
        """Every stored event, newest first."""
        with self._lock:
            return self._events[::-1]

    def get(self, event_id: str) -> StoredEvent | None:
        """The event ``event_id``, or None if it is not (or no longer) stored. ValueError for an id
        that is not a plain name (``../x``, ``a/b``, ``.hidden``): it never reaches the filesystem."""
        folder = self._folder_of(event_id)
        with self._lock:
            return next((event for event in self._events if event.folder == folder), None)

    def _folder_of(self, event_id: str) -> Path:
        if not isinstance(event_id, str) or not _SAFE_NAME.match(event_id):
            raise ValueError(f"not an event id: {event_id!r}")
        folder = self.root / event_id
        if folder.parent != self.root:  # belt and braces: the pattern already rules this out
            raise ValueError(f"not an event id: {event_id!r}")
        return folder

    def write(self, event_id: str, event: dict, snapshot: EncodedFrame, frames: list[EncodedFrame], *,
              annotated: bytes | None = None) -> dict:
        """Store one event (its files atomically, ``event.json`` last), then apply the bounds; returns its
        summary. ``snapshot.jpg`` is ``annotated`` when given, ``frame.jpg`` the snapshot as kept.
        :class:`OutputError` when the disk refuses."""
        folder = self._folder_of(event_id)
        frames = frames or [snapshot]
        drawn = annotated if annotated is not None else snapshot.jpeg
        try:
            folder.mkdir(parents=True, exist_ok=False)
            atomic_write_bytes(folder / SNAPSHOT_NAME, drawn)
            atomic_write_bytes(folder / PLAIN_SNAPSHOT_NAME, snapshot.jpeg)
            clip_name, clip_bytes = write_clip(folder, frames, mp4=self.mp4)
            meta = {"version": META_VERSION, "event_id": event_id, "event": event, "created": time.time(),
                    "frames": len(frames), "first_frame_id": frames[0].frame_id, "last_frame_id": frames[-1].frame_id,
                    "snapshot_frame_id": snapshot.frame_id, "snapshot_time": snapshot.timestamp,
                    "start": frames[0].timestamp, "end": frames[-1].timestamp, "annotated": annotated is not None,
                    "snapshot_bytes": len(drawn), "plain_bytes": len(snapshot.jpeg), "clip": clip_name,
                    "clip_bytes": clip_bytes, "format": "mp4" if clip_name != CLIP_NAME else "mjpeg"}
            text = json.dumps(meta, indent=1).encode("utf-8")
            atomic_write_bytes(folder / META_NAME, text)
        except OSError as exc:
            _remove(folder)
            raise OutputError(f"cannot write evidence for event {event_id} in {self.root}: {exc}") from exc
        stored = StoredEvent(event_id, folder, meta, len(drawn) + len(snapshot.jpeg) + clip_bytes + len(text))
        with self._lock:
            self._events.append(stored)
            self._bytes += stored.size
            self._enforce()
        return stored.summary()

    def _enforce(self) -> None:
        """Delete the oldest events while a bound is passed (the lock is held)."""
        while len(self._events) > 1 and (len(self._events) > self.max_events or self._bytes > self.max_bytes):
            oldest = self._events.pop(0)
            self._bytes -= oldest.size
            _remove(oldest.folder)

    def _load(self) -> None:
        found: list[StoredEvent] = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):  # a temporary left by a crash
                self._clean(entry)
                continue
            if not entry.is_dir() or not EVENT_ID.match(entry.name):
                log.warning("evidence store %s: ignoring %s (not an event)", self.root, entry.name)
                continue
            stored = _read_event(entry)
            if stored is None:
                self._clean(entry)
            else:
                found.append(stored)
        found.sort(key=lambda event: (event.meta["created"], event.event_id))
        with self._lock:
            self._events = found
            self._bytes = sum(event.size for event in found)
            self._enforce()

    def _clean(self, entry: Path) -> None:
        log.warning("evidence store %s: removing %s (partial or corrupt)", self.root, entry.name)
        self.cleaned.append(entry.name)
        _remove(entry)


def _read_event(folder: Path) -> StoredEvent | None:
    """The event in ``folder`` when its event.json is whole and its files match it; None otherwise."""
    try:
        text = (folder / META_NAME).read_bytes()
        meta = json.loads(text)
        if not isinstance(meta, dict) or meta.get("event_id") != folder.name:
            return None
        snapshot_size = (folder / SNAPSHOT_NAME).stat().st_size
        if meta.get("clip", CLIP_NAME) not in CLIP_NAMES:  # a name of ours, never a path
            return None
        clip_size = (folder / meta.get("clip", CLIP_NAME)).stat().st_size
        if snapshot_size != meta["snapshot_bytes"] or clip_size != meta["clip_bytes"]:
            return None
        if "plain_bytes" in meta:  # since version 2
            plain_size = (folder / PLAIN_SNAPSHOT_NAME).stat().st_size
            if plain_size != meta["plain_bytes"]:
                return None
            snapshot_size += plain_size
        float(meta["created"])
        if any(key not in meta for key in ("event", "frames", "first_frame_id", "last_frame_id",
                                            "snapshot_frame_id", "start", "end")):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for stray in folder.glob(".*"):  # a temporary beside whole files (a crash while replacing one)
        with contextlib.suppress(OSError):
            stray.unlink()
    return StoredEvent(folder.name, folder, meta, snapshot_size + clip_size + len(text))


def _remove(folder: Path) -> None:
    """Delete an event folder: event.json first, so a crash midway leaves no event listed."""
    remove_record(folder, META_NAME)
