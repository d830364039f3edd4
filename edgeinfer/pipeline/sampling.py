"""Sampling rules: frames worth labelling kept on the device with the model's own output (docs/datasets.md).

A rule is a short text, the same in ``Pipeline(sample=[...])``, ``edgeinfer run --sample`` and an agent.yaml
pipeline's ``sample:`` list::

    uncertain:LOW-HIGH[/LABEL,...]   the top score (a classifier) or any box's score (a detector) in [LOW, HIGH)
    drift:DISTANCE[@FRAMES]          the last FRAMES frames' labels drift from the first FRAMES' by more than
                                     DISTANCE (total variation: the canary analysis's measure, ``forms/samples.py``)
    event:RULE                       an event rule fires (pipeline/events.py: ``event:detection:0.9/person``,
                                     ``event:line_crossed:door``)
    random:RATE                      a share RATE (0..1) of the frames, at random
    request                          none by itself: only the frames asked for

and :meth:`StreamSampler.request` keeps the next N frames (the dashboard's "sample the next N frames", the
agent's ``sample`` command), whatever the rules.

A kept sample is a folder of the store (``forms/samples.py``: ``frame.jpg`` and ``sample.json``, written last, with the
model's boxes in the frame's pixels and the frame's perceptual hash) that the agent uploads to the fleet manager.

The inference thread calls :meth:`StreamSampler.check` with each result while the frame's buffer is held
(as the evidence does): a few comparisons, and a copy of the frame only when a rule keeps it. The JPEG
encoding and the writes happen on the ``edgeinfer-sample-store`` thread, fed by a bounded queue (a slow
disk drops samples, counted). Each rule keeps at most ``per_minute`` samples a minute; the store is bounded
(the oldest dropped first); a sample the disk refuses is a logged, counted error and the store keeps what
it has.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OutputError
from ..forms.evidence import EVENT_ID, new_event_id
from ..forms.samples import (
    MAX_KEYPOINTS,
    REQUEST_RULE,
    SAMPLE_FRAME_NAME,
    SAMPLE_META_NAME,
    SAMPLE_VERSION,
    total_variation,
)
from ..util.fs import atomic_write_bytes, remove_record
from .events import DETECTION, EventRule, scored_items
from .postprocess import keypoint_rows

if TYPE_CHECKING:
    import numpy as np

    from .zones import AnalyticsEvent

log = logging.getLogger(__name__)

SAMPLING_KINDS = ("uncertain", "drift", "event", "random")
#: samples waiting for the store's thread at most (a slow disk drops the rest, counted)
QUEUE_SAMPLES = 4
#: frames in the drift rule's baseline and window when the rule does not say
DRIFT_FRAMES = 300
_RULE = re.compile(r"\A(?P<kind>[a-z]+):(?P<arg>.+)\Z")
_BAND = re.compile(r"\A(?P<low>[0-9.]+)-(?P<high>[0-9.]+)(?:/(?P<labels>[^/]+))?\Z")


@dataclass(frozen=True)
class SamplingRule:
    """One parsed sampling rule (``text`` as written)."""

    text: str
    kind: str
    low: float = 0.0
    high: float = 1.0
    labels: frozenset[str] = frozenset()
    frames: int = DRIFT_FRAMES
    event: EventRule | None = None

    @classmethod
    def parse(cls, text: str) -> SamplingRule:
        """A rule from its text; ValueError saying what is wrong with it."""
        if isinstance(text, str) and text.strip() == REQUEST_RULE:
            return cls(REQUEST_RULE, REQUEST_RULE)
        match = _RULE.match(text.strip()) if isinstance(text, str) else None
        if match is None or match["kind"] not in SAMPLING_KINDS:
            raise ValueError(f"sampling rule {text!r}: not one of uncertain:LOW-HIGH[/LABEL,...], "
                             f"drift:DISTANCE[@FRAMES], event:RULE, random:RATE, request")
        kind, arg = match["kind"], match["arg"].strip()
        try:
            return _parsers[kind](text.strip(), arg)
        except ValueError as exc:
            raise ValueError(f"sampling rule {text!r}: {exc}") from None

    def band_hit(self, result: Any) -> bool:
        """Any scored item of ``result`` (a detection, a classifier's top-1) in [low, high)."""
        return any(self.low <= float(getattr(item, "score", -1.0)) < self.high
                   and (not self.labels or str(getattr(item, "label", "")) in self.labels)
                   for item in scored_items(result))


def _uncertain(text: str, arg: str) -> SamplingRule:
    band = _BAND.match(arg)
    if band is None:
        raise ValueError("the band is LOW-HIGH, scores within 0..1 (uncertain:0.3-0.6)")
    low, high = float(band["low"]), float(band["high"])
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"the band must be 0 <= LOW < HIGH <= 1, not {low}-{high}")
    labels = frozenset(p.strip() for p in (band["labels"] or "").split(",") if p.strip())
    return SamplingRule(text, "uncertain", low, high, labels)


def _drift(text: str, arg: str) -> SamplingRule:
    distance, _, frames = arg.partition("@")
    value, count = float(distance), int(frames) if frames else DRIFT_FRAMES
    if not 0.0 < value < 1.0 or count < 10:
        raise ValueError("DISTANCE must be within (0, 1) and FRAMES >= 10")
    return SamplingRule(text, "drift", low=value, frames=count)


def _event(text: str, arg: str) -> SamplingRule:
    return SamplingRule(text, "event", event=EventRule.parse(arg))


def _random(text: str, arg: str) -> SamplingRule:
    rate = float(arg)
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"RATE is a share of the frames within (0, 1], not {rate}")
    return SamplingRule(text, "random", low=rate)


_parsers = {"uncertain": _uncertain, "drift": _drift, "event": _event, "random": _random}


class SampleStore:
    """Samples on disk under ``root``, at most ``max_bytes`` (the oldest deleted first). A sample larger than the
    whole bound is refused (:class:`OutputError`), as is one the disk refuses: what is stored stays."""

    def __init__(self, root: str | Path, max_bytes: int) -> None:
        if int(max_bytes) <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes!r}")
        self.root, self.max_bytes = Path(root), int(max_bytes)
        self._lock = threading.Lock()
        self._samples: deque[tuple[Path, int]] = deque()  # oldest first
        self._bytes = 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create the samples folder {self.root}: {exc}") from exc
        self._load()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._samples)

    def list(self) -> list[Path]:
        """Every stored sample's folder, oldest first."""
        with self._lock:
            return [folder for folder, _ in self._samples]

    def write(self, sample_id: str, jpeg: bytes, meta: dict) -> Path:
        """One sample, its frame then ``sample.json`` (each atomically); then the bound applied."""
        text = json.dumps(meta, indent=1).encode("utf-8")
        size = len(jpeg) + len(text)
        if size > self.max_bytes:
            raise OutputError(f"sample {sample_id} ({size} bytes) is larger than the store's bound "
                              f"({self.max_bytes} bytes) in {self.root}")
        folder = self.root / sample_id
        try:
            folder.mkdir(parents=True, exist_ok=False)
            atomic_write_bytes(folder / SAMPLE_FRAME_NAME, jpeg)
            atomic_write_bytes(folder / SAMPLE_META_NAME, text)
        except OSError as exc:
            remove_record(folder, SAMPLE_META_NAME)
            raise OutputError(f"cannot write sample {sample_id} in {self.root}: {exc}") from exc
        with self._lock:
            self._samples.append((folder, size))
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._samples) > 1:
                old, old_size = self._samples.popleft()
                self._bytes -= old_size
                remove_record(old, SAMPLE_META_NAME)
        return folder

    def _load(self) -> None:
        """What an earlier run stored (a folder without a whole ``sample.json`` is partial: removed)."""
        for entry in sorted(self.root.iterdir()):
            meta = entry / SAMPLE_META_NAME
            if not entry.is_dir() or not EVENT_ID.match(entry.name):
                if entry.name.startswith("."):
                    remove_record(entry, SAMPLE_META_NAME)
                continue
            try:
                json.loads(meta.read_bytes())
                size = meta.stat().st_size + (entry / SAMPLE_FRAME_NAME).stat().st_size
            except (OSError, ValueError):
                log.warning("sample store %s: removing %s (partial)", self.root, entry.name)
                remove_record(entry, SAMPLE_META_NAME)
                continue
            self._samples.append((entry, size))
            self._bytes += size


@dataclass
class _Kept:
    frame: np.ndarray
    meta: dict


class StreamSampler:
    """The sampling rules of one stream: which frames to keep, their rate limits, the store's thread."""

    def __init__(self, rules: tuple[SamplingRule, ...], store: SampleStore, *, stream: str = "",
                 per_minute: int = 6, quality: int = 90, seed: int | None = None) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute must be >= 1, not {per_minute!r}")
        self.rules, self.store, self.stream = rules, store, stream
        self.per_minute, self.quality = int(per_minute), int(quality)
        #: the pipeline's name (the agent's) and its model's version, as every sample states them
        self.pipeline, self.model_version = "", ""
        #: the model now serving the stream (``engine.model``: its path and sha256), read when a frame is kept
        self.model_of: Callable[[], Any] | None = None
        self._listeners: tuple[Callable[[dict], Any], ...] = ()
        self._random = random.Random(seed)
        self._recent: dict[str, deque[float]] = {}
        self._requested = 0
        self._request_id = ""  # the command that asked for the frames requested (sample.json's command_id)
        self._drift: dict[str, tuple[Counter, deque[Counter]]] = {}
        self._baseline_frames: dict[str, int] = {}
        self._drift_sums: dict[str, Counter] = {}
        self._analytics: list[AnalyticsEvent] = []
        self._lock = threading.Condition()
        self._queue: deque[_Kept] = deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.counts_ = Counter({"kept": 0, "written": 0, "rate_limited": 0, "dropped": 0, "failed": 0})
        #: the newest write error, for a status line or an event (None: none yet)
        self.last_error: str | None = None

    def request(self, frames: int, command_id: str = "") -> None:
        """Keep the next ``frames`` frames whatever they show (rate limits do not apply: they were asked for);
        ``command_id``: the command that asks, named in each of those samples."""
        if frames < 0:
            raise ValueError(f"frames must be >= 0, not {frames}")
        self._requested, self._request_id = int(frames), command_id

    def add_listener(self, listener: Callable[[dict], Any]) -> None:
        """Call ``listener(info)`` on the store's thread for each sample written (``{"sample_id", "folder",
        "stream", "rule"}``) or refused by the disk (``{"error", "stream", "rule"}``)."""
        self._listeners = (*self._listeners, listener)

    def on_analytics(self, event: AnalyticsEvent) -> None:
        """The analytics listener (a line crossed, a zone entered), checked with the frame's result."""
        self._analytics.append(event)

    # -- the inference thread ---------------------------------------------------------------------
    def check(self, result: Any, frame: np.ndarray | None, frame_id: int, timestamp: float) -> str | None:
        """Which rule keeps this frame (None: none): the frame copied and handed to the store's thread."""
        rule = self._which(result, frame_id)
        if rule is None or frame is None:
            return None
        with self._lock:
            if len(self._queue) >= QUEUE_SAMPLES:  # a frame dropped here uses up no allowance, no request
                self.counts_["dropped"] += 1
                return None
            self._take(rule)
            meta = self._describe(result, frame, rule, frame_id, timestamp)
            self._queue.append(_Kept(frame.copy(), meta))  # the buffer goes back to the ring: a copy
            self.counts_["kept"] += 1
            self._lock.notify()
        self._ensure_thread()
        return rule

    def _describe(self, result: Any, frame: np.ndarray, rule: str, frame_id: int, timestamp: float) -> dict:
        """``sample.json`` but for the id and the hash (the store's thread adds them)."""
        width, height = int(frame.shape[1]), int(frame.shape[0])
        model = self.model_of() if self.model_of is not None else None
        asked = {"command_id": self._request_id} if rule == REQUEST_RULE and self._request_id else {}
        return {"version": SAMPLE_VERSION, "width": width, "height": height, "captured_at": round(time.time(), 6),
                "pipeline": self.pipeline, "stream": self.stream, "rule": rule,
                "model": {"name": Path(model.path).name if model is not None else "",
                          "sha256": (model.sha256 or "") if model is not None else "", "version": self.model_version},
                "detections": labelled_boxes(result, width, height), "frame_id": int(frame_id),
                "source_time": round(float(timestamp), 6), "output": _output_dict(result), **asked}

    def _which(self, result: Any, frame_id: int) -> str | None:
        fired, self._analytics = self._analytics, []
        if self._requested > 0:
            return REQUEST_RULE
        for rule in self.rules:
            if self._fires(rule, result, fired) and self._allowed(rule.text):
                return rule.text
        return None

    def _fires(self, rule: SamplingRule, result: Any, fired: list[AnalyticsEvent]) -> bool:
        if rule.kind == "uncertain":
            return rule.band_hit(result)
        if rule.kind == "random":
            return self._random.random() < rule.low
        if rule.kind == REQUEST_RULE:
            return False  # only what request() asks for
        if rule.kind == "drift":
            return self._drifted(rule, result)
        event = rule.event
        assert event is not None
        if event.kind == DETECTION:
            return any(float(getattr(i, "score", 0.0)) >= event.min_score and event.takes(str(getattr(i, "label", "")))
                       for i in scored_items(result))
        return any(event.matches(e) for e in fired)

    def _drifted(self, rule: SamplingRule, result: Any) -> bool:
        """The first ``frames`` frames' labels are the baseline; the last ``frames`` frames' are compared to it."""
        baseline, window = self._drift.setdefault(rule.text, (Counter(), deque()))
        # a frame without a scored item counts as "" (nothing seen): an empty scene is an output too
        labels = Counter(str(getattr(i, "label", "")) for i in scored_items(result)) or Counter({"": 1})
        if self._baseline_frames.get(rule.text, 0) < rule.frames:
            self._baseline_frames[rule.text] = self._baseline_frames.get(rule.text, 0) + 1
            baseline.update(labels)
            return False
        recent = self._drift_sums.setdefault(rule.text, Counter())
        window.append(labels)
        recent.update(labels)  # a running sum: a few dictionary updates per frame, not a window's worth
        if len(window) > rule.frames:
            recent.subtract(window.popleft())
        if len(window) < rule.frames:
            return False
        distance = total_variation(baseline, +recent)
        return distance is not None and distance > rule.low

    def _allowed(self, text: str) -> bool:
        """Whether rule ``text`` kept fewer than ``per_minute`` samples in the last minute (taken: :meth:`_take`)."""
        recent = self._recent.setdefault(text, deque())
        now = time.monotonic()
        while recent and now - recent[0] > 60.0:
            recent.popleft()
        if len(recent) >= self.per_minute:
            self.counts_["rate_limited"] += 1
            return False
        return True

    def _take(self, text: str) -> None:
        """A sample kept under ``text``: one of its allowance, or one frame of a request."""
        if text == REQUEST_RULE and self._requested > 0:
            self._requested -= 1
        else:
            self._recent.setdefault(text, deque()).append(time.monotonic())

    # -- the store's thread -----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                name = f"edgeinfer-sample-store-{self.stream or 'main'}"
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if not self._queue:
                    return
                kept = self._queue.popleft()
            self._write(kept)

    def _write(self, kept: _Kept) -> None:
        import cv2

        sample_id = new_event_id(kept.meta["frame_id"])
        where = {"stream": self.stream, "rule": kept.meta["rule"]}
        try:
            ok, data = cv2.imencode(".jpg", kept.frame, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
            if not ok:
                raise OutputError(f"frame {kept.meta['frame_id']} could not be JPEG-encoded")
            meta = {"sample_id": sample_id, "phash": perceptual_hash(kept.frame), **kept.meta}
            folder = self.store.write(sample_id, data.tobytes(), meta)
            self.counts_["written"] += 1
            self._tell({"sample_id": sample_id, "folder": str(folder), **where})
        except OutputError as exc:  # a full or read-only disk: said, counted; what is stored stays
            self.counts_["failed"] += 1
            self.last_error = str(exc)
            log.error("%s", exc)
            self._tell({"error": str(exc), **where})

    def _tell(self, info: dict) -> None:
        for listener in self._listeners:
            try:
                listener(info)
            except Exception:  # a listener's fault is its own: the store goes on
                log.exception("sample listener failed")

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the store's thread; idempotent."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def counts(self) -> dict[str, int]:
        """kept (handed to the store), written, rate_limited, dropped (queue full), failed (the disk refused)."""
        return dict(self.counts_)


def labelled_boxes(result: Any, width: int, height: int) -> list[dict]:
    """The model's output as a dataset's labels (``forms/samples.py``): each detection's label, score and box (and a
    pose model's keypoints, a segmentation model's mask outline, an oriented box), or a classifier's top-1 as a box
    of the whole frame; other tasks (semantic masks) none."""
    items = scored_items(result)
    if items and not hasattr(items[0], "box"):
        return [{"label": str(items[0].label), "score": round(float(items[0].score), 6),
                 "box": [0.0, 0.0, float(width), float(height)]}]
    labelled = []
    for d in items:
        entry = {"label": str(d.label), "score": round(float(d.score), 6),
                 "box": [round(min(max(float(v), 0.0), limit), 1) for v, limit in zip(d.box, (width, height) * 2)]}
        if getattr(d, "keypoints", ()):
            entry["keypoints"] = keypoint_rows(d.keypoints[:MAX_KEYPOINTS], width, height)
        entry.update(d.shapes() if hasattr(d, "shapes") else {})  # a mask's outline, an oriented box's angle
        labelled.append(entry)
    return labelled


def perceptual_hash(frame: np.ndarray) -> str:
    """The frame's 64-bit pHash as 16 hex digits (imagehash's method: the 8x8 lowest frequencies of a 32x32 grey
    copy's DCT above their median), for the fleet's de-duplication of a static scene. A few lines of OpenCV rather
    than a dependency: imagehash would bring Pillow and SciPy onto the device for one function."""
    import cv2
    import numpy as np

    grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY) if frame.ndim == 3 and frame.shape[2] == 3 else frame
    small = cv2.resize(np.ascontiguousarray(grey), (32, 32), interpolation=cv2.INTER_AREA).astype(np.float32)
    low = cv2.dct(small)[:8, :8]
    return np.packbits(low > np.median(low)).tobytes().hex()  # 64 bits, the first the most significant


def _output_dict(result: Any) -> Any:
    """The model's output as JSON (``result.to_dict()``; a classifier's list item by item)."""
    if isinstance(result, list):
        return [item.to_dict() for item in result if hasattr(item, "to_dict")]
    return result.to_dict() if hasattr(result, "to_dict") else None


def sampler_from_options(options: Any, stream: str = "", folder: Any = None) -> StreamSampler | None:
    """The stream's :class:`StreamSampler` from ``sample``, ``samples_dir``, ``samples_max_mb`` and
    ``samples_per_minute`` (None when sampling is off: no rules, or no folder)."""
    folder = folder if folder is not None else options.samples_dir
    if not options.sample or folder is None:
        return None
    rules = tuple(SamplingRule.parse(text) for text in options.sample)
    store = SampleStore(folder, int(options.samples_max_mb * 1024 * 1024))
    return StreamSampler(rules, store, stream=stream, per_minute=options.samples_per_minute)
