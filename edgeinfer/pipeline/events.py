"""Event rules and their evidence: a line crossed, a zone entered, a detection above a score (docs/events.md).

A rule is a short text, the same in ``Pipeline(events=[...])``, ``edgeinfer run --event`` and an
agent.yaml pipeline's ``events:`` list::

    line_crossed[:LINE][/LABEL,...]      a confirmed track crosses a line (any, or the one named)
    zone_entered[:ZONE][/LABEL,...]      a confirmed track enters a zone
    detection[:SCORE][/LABEL,...]        a detection (or a classification's top-1) scoring SCORE or more

:class:`StreamEvents` applies the rules to one stream. The inference thread calls :meth:`~StreamEvents.offer`
with each frame before its buffer goes back to the ring (a comparison for most frames; a downscaled copy
for the few the evidence keeps, ``evidence_fps`` a second) and :meth:`~StreamEvents.check` with each
result; analytics events arrive through the :class:`~edgeinfer.pipeline.analytics.StreamAnalytics`
listener. Everything slow — JPEG encoding, the clip's post-roll, the store's writes — happens in one
``edgeinfer-evidence`` thread fed by a bounded queue, so a slow disk drops evidence frames (counted),
never inference frames. A triggered event reaches the listeners (:meth:`~StreamEvents.add_listener`)
once its evidence is written — or at once, when there is no evidence store.

A ``detection`` rule describes a state, not a change: its subject (a track, or a label when there is
no track id) fires it once per ``cooldown_s``. A crossing or an entry is a change, each one an event
(the hysteresis band already keeps flicker from making more). At most ``per_minute`` events a
minute are recorded per stream. What they suppress is counted, never
silently lost: ``counts()`` and the next event's ``suppressed``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .evidence import EvidenceRecorder, EvidenceStore, FrameHistory, new_event_id
from .zones import LINE_CROSSED, ZONE_ENTERED, AnalyticsEvent

if TYPE_CHECKING:
    import numpy as np

    from .annotate import Geometry
    from .record import RecordSource

log = logging.getLogger(__name__)

DETECTION = "detection"
RULE_KINDS = (LINE_CROSSED, ZONE_ENTERED, DETECTION)
_RULE = re.compile(r"\A(?P<kind>[a-z_]+)(?::(?P<arg>[^/]+))?(?:/(?P<labels>[^/]+))?\Z")
#: evidence frames waiting for the evidence thread at most (a slow disk drops them, counted)
QUEUE_FRAMES = 8
#: how often the evidence thread looks for recordings a stalled source left open
_EXPIRE_EVERY_S = 0.5

EventListener = Callable[[dict], Any]


@dataclass(frozen=True)
class EventRule:
    """One parsed rule: its kind, the line or zone it names (None: any), the labels it takes (empty:
    any) and, for ``detection``, the least score."""

    text: str
    kind: str
    name: str | None = None
    labels: frozenset[str] = frozenset()
    min_score: float = 0.0

    @classmethod
    def parse(cls, text: str) -> EventRule:
        """A rule from its text; ValueError saying what is wrong with it."""
        if not isinstance(text, str):
            raise ValueError(f"an event rule is a string, not {type(text).__name__}")
        match = _RULE.match(text.strip())
        if match is None or match["kind"] not in RULE_KINDS:
            forms = ", ".join(f"{kind}[:...][/LABEL,...]" for kind in RULE_KINDS)
            raise ValueError(f"event rule {text!r}: not one of {forms}")
        kind, arg = match["kind"], (match["arg"] or "").strip() or None
        labels = frozenset(part.strip() for part in (match["labels"] or "").split(",") if part.strip())
        if match["labels"] is not None and not labels:
            raise ValueError(f"event rule {text!r}: no label after '/'")
        if kind != DETECTION:
            return cls(text.strip(), kind, arg, labels)
        try:
            score = float(arg) if arg is not None else 0.0
        except ValueError:
            raise ValueError(f"event rule {text!r}: {arg!r} is not a score (0..1)") from None
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"event rule {text!r}: the score must be within 0..1, not {score}")
        return cls(text.strip(), kind, None, labels, score)

    def takes(self, label: str) -> bool:
        return not self.labels or label in self.labels

    def matches(self, event: AnalyticsEvent) -> bool:
        """Whether an analytics event (a line crossed, a zone entered) fires this rule."""
        return (event.kind == self.kind and (self.name is None or event.name == self.name)
                and self.takes(event.label))


def parse_rules(texts: Iterable[str], *, lines: Sequence[str] = (), zones: Sequence[str] = ()) -> tuple[EventRule, ...]:
    """Every rule, checked against the pipeline's line and zone names (a rule on a line the pipeline
    does not have would never fire: ValueError)."""
    rules = tuple(EventRule.parse(text) for text in texts)
    for rule in rules:
        names, what = (lines, "line") if rule.kind == LINE_CROSSED else (zones, "zone")
        if rule.kind == DETECTION:
            continue
        if not names:
            raise ValueError(f"event rule {rule.text!r} needs a {what} (--{what} / {what}s:)")
        if rule.name is not None and rule.name not in names:
            raise ValueError(f"event rule {rule.text!r}: no {what} named {rule.name!r} (there are: {', '.join(names)})")
    return rules


@dataclass
class _Pending:
    """What the evidence thread is handed: a kept frame, or an event to record."""

    frame: np.ndarray | None
    frame_id: int
    timestamp: float
    event: dict | None = None
    #: an event's own frame with what the model saw drawn on it (``frame`` is the same without)
    annotated: np.ndarray | None = None
    #: the frame is the record source's (read by the evidence thread); ``frame``, if any, the detect frame's fallback
    from_record: bool = False
    #: what to draw on the record frame: (result, geometry, counts, highlight, the detect frame's width)
    drawing: tuple[Any, Any, dict, str | None, int] | None = None


class StreamEvents:
    """The rules of one stream, their cooldown and rate limit, and the evidence of what they fire.

    ``store`` None: events carry no evidence and reach the listeners at once.
    """

    def __init__(self, rules: Sequence[EventRule], *, store: EvidenceStore | None = None, stream: str = "",
                 cooldown_s: float = 10.0, per_minute: int = 30, pre_s: float = 2.0, post_s: float = 3.0,
                 fps: float = 5.0, width: int = 640) -> None:
        if not rules:
            raise ValueError("StreamEvents needs at least one rule")
        if cooldown_s < 0 or per_minute < 1:
            raise ValueError(f"cooldown_s must be >= 0 and per_minute >= 1, not {cooldown_s!r}, {per_minute!r}")
        self.rules = tuple(rules)
        self.stream = stream
        self.cooldown_s = float(cooldown_s)
        self.per_minute = int(per_minute)
        self.recorder = (EvidenceRecorder(store, FrameHistory(seconds=pre_s, fps=fps, width=width), post_s=post_s)
                         if store is not None else None)
        self._detection_rules = tuple(r for r in self.rules if r.kind == DETECTION)
        self._last_fired: dict[tuple[int, Any], float] = {}
        self._recent: deque[float] = deque()
        self._listeners: tuple[EventListener, ...] = ()
        self._lock = threading.Lock()
        # kept frames and events in the order they happened (an event's snapshot is the frame before it);
        # frames are bounded (a slow disk drops them), events never dropped
        self._wake = threading.Condition(self._lock)
        self._pending: deque[_Pending] = deque()
        self._pending_frames = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        #: the frame the inference thread is answering (hold/release), the events it fired, and what to draw
        self._at_hand: tuple[np.ndarray, int, float, int | None] | None = None
        self._fired_now: list[dict] = []
        self.drawing: tuple[Geometry, Callable[[], dict]] | None = None
        #: where the evidence's frames come from when not the detect frames (pipeline/record.py)
        self.record: RecordSource | None = None
        #: the source's time of the newest frame offered, and when it came (monotonic): the source's clock now
        self._clock = (0.0, time.monotonic())
        self.triggered = self.suppressed = self.rate_limited = self.frames_dropped = self.delivered = 0
        self._suppressed_since = 0

    # -- listeners --------------------------------------------------------------------------------
    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener(event)`` for each event, once its evidence is written (the evidence thread)."""
        self._listeners = (*self._listeners, listener)

    # -- the inference thread ---------------------------------------------------------------------
    @property
    def wants_results(self) -> bool:
        """Whether :meth:`check` has anything to do (a ``detection`` rule)."""
        return bool(self._detection_rules)

    def offer(self, frame: np.ndarray, frame_id: int, timestamp: float) -> None:
        """A frame, before its buffer is reused (``timestamp``: the source's time): a downscaled copy goes to
        the evidence thread when the evidence keeps it (``fps`` a second); others cost one comparison."""
        recorder = self.recorder
        if recorder is None or self._closed:
            return
        self._clock = (float(timestamp), time.monotonic())
        history = recorder.history
        if not history.due(timestamp):
            return
        with self._lock:
            if self._pending_frames >= QUEUE_FRAMES:
                self.frames_dropped += 1
                return
        from_record = self.record is not None and self.record.serving
        small = None if from_record else history.downscaled(frame)  # a record frame is read by the evidence thread
        with self._lock:
            self._pending.append(_Pending(small, int(frame_id), float(timestamp), from_record=from_record))
            self._pending_frames += 1
            self._wake.notify()
        self._ensure_thread()

    def hold(self, frame: np.ndarray, frame_id: int, timestamp: float, source_width: int | None = None) -> None:
        """The frame whose result comes next (``timestamp``: the source's time; ``source_width``: the width
        the result's boxes are in, when ``frame`` is another size): an event fired on it takes this very
        frame as its snapshot. Nothing is copied unless an event fires (:meth:`release`)."""
        if self.recorder is not None and not self._closed:
            self._at_hand = (frame, int(frame_id), float(timestamp), source_width)

    def release(self, result: Any) -> None:
        """The held frame's result is decided: each event fired on it goes to the evidence thread with a
        downscaled copy of the frame and one with ``result`` drawn on it (the line or zone highlighted)."""
        held, fired = self._at_hand, self._fired_now
        self._at_hand = None
        if held is None or not fired:
            return
        self._fired_now = []
        from .annotate import annotate

        frame, frame_id, timestamp, source_width = held
        recorder = self.recorder
        assert recorder is not None
        plain = recorder.history.downscaled(frame)
        geometry, counts = self.drawing if self.drawing is not None else (None, dict)
        if self.record is not None and self.record.serving:
            # drawn by the evidence thread on the record frame, scaled from this frame's pixels
            counted = counts()
            with self._lock:
                for event in fired:
                    drawing = (result, geometry, counted, event.get("name"), frame.shape[1])
                    self._pending.append(_Pending(plain, frame_id, timestamp, event, from_record=True,
                                                  drawing=drawing))
                self._wake.notify()
            self._ensure_thread()
            return
        for event in fired:
            drawn = annotate(frame, result, geometry=geometry, counts=counts(), width=recorder.history.width,
                             highlight=event.get("name"), source_width=source_width)
            with self._lock:
                self._pending.append(_Pending(plain, frame_id, timestamp, event, drawn))
                self._wake.notify()
        self._ensure_thread()

    @property
    def pending(self) -> int:
        """Frames and events waiting for the evidence thread."""
        with self._lock:
            return len(self._pending)

    def on_analytics(self, event: AnalyticsEvent) -> None:
        """The analytics listener: a line crossed or a zone entered may fire a rule."""
        for index, rule in enumerate(self.rules):
            if rule.kind != DETECTION and rule.matches(event):
                fired = {"kind": event.kind, "name": event.name, "label": event.label, "track_id": event.track_id,
                         "score": None, "direction": event.direction,
                         "box": [round(v, 1) for v in event.box] if event.box is not None else None}
                self._fire(index, rule, fired, event.frame_id, event.timestamp, subject=event.track_id,
                           source_time=event.source_time)

    def check(self, result: Any, frame_id: int, timestamp: float, source_time: float | None = None) -> None:
        """A frame's result (detections, or a classification's top-k) against the ``detection`` rules.
        ``timestamp``: the frame's wall-clock time; ``source_time``: its time in the source's own clock (default:
        the same)."""
        if not self._detection_rules:
            return
        for item in scored_items(result):
            label, score = str(getattr(item, "label", "")), float(getattr(item, "score", 0.0))
            for index, rule in enumerate(self.rules):
                if rule.kind == DETECTION and score >= rule.min_score and rule.takes(label):
                    track_id = getattr(item, "track_id", None)
                    box = getattr(item, "box", None)
                    fired = {"kind": DETECTION, "name": None, "label": label, "track_id": track_id,
                             "score": round(score, 4), "direction": None,
                             "box": [round(float(v), 1) for v in box] if box is not None else None,
                             **detection_shapes(item)}
                    self._fire(index, rule, fired, frame_id, timestamp,
                               subject=track_id if track_id is not None else label, source_time=source_time)

    def _fire(self, index: int, rule: EventRule, fired: dict, frame_id: int, timestamp: float,
              subject: Any, source_time: float | None = None) -> None:
        """``timestamp``: the frame's wall-clock time (the event's time, and the cooldown's clock);
        ``source_time``: the frame in the source's own clock (the evidence's), the same when not given."""
        source_time = float(timestamp if source_time is None else source_time)
        with self._lock:
            key = (index, subject)
            last = self._last_fired.get(key) if rule.kind == DETECTION else None
            if last is not None and 0 <= timestamp - last < self.cooldown_s:
                self.suppressed += 1
                self._suppressed_since += 1
                return
            now = time.monotonic()
            while self._recent and now - self._recent[0] > 60.0:
                self._recent.popleft()
            if len(self._recent) >= self.per_minute:
                self.rate_limited += 1
                self._suppressed_since += 1
                return
            self._recent.append(now)
            if rule.kind == DETECTION:
                self._last_fired[key] = timestamp
            if len(self._last_fired) > 4096:  # subjects long gone: keep the newest half
                for old in sorted(self._last_fired, key=self._last_fired.__getitem__)[:2048]:
                    del self._last_fired[old]
            self.triggered += 1
            suppressed, self._suppressed_since = self._suppressed_since, 0
        event = {"stream": self.stream, "rule": rule.text, **fired, "frame_id": int(frame_id),
                 "timestamp": round(float(timestamp), 6), "source_time": round(source_time, 6),
                 "suppressed": suppressed}
        held = self._at_hand
        if held is not None and held[1] == int(frame_id):
            self._fired_now.append(event)  # goes with its own frame once the result is whole (release)
            return
        if self.recorder is None:
            self._deliver({**event, "event_id": new_event_id(frame_id, timestamp), "snapshot": None, "clip": None,
                           "snapshot_bytes": 0, "clip_bytes": 0, "frames": 0, "duration_s": 0.0})
            return
        with self._lock:
            self._pending.append(_Pending(None, int(frame_id), source_time, event))
            self._wake.notify()
        self._ensure_thread()

    # -- the evidence thread ----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None and not self._closed:
            with self._lock:
                if self._thread is None:
                    name = f"edgeinfer-evidence-{self.stream or 'main'}"
                    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                    self._thread.start()

    def _next(self) -> _Pending | None:
        """The oldest frame or event (None after a while without one, or once closed and drained)."""
        with self._lock:
            if not self._pending and not self._closed:
                self._wake.wait(_EXPIRE_EVERY_S)
            if not self._pending:
                return None
            item = self._pending.popleft()
            if item.event is None:
                self._pending_frames -= 1
            return item

    def _run(self) -> None:
        recorder = self.recorder
        assert recorder is not None
        while True:
            item = self._next()
            if item is None:
                if self._closed:
                    break
            elif item.event is not None:
                self._record(recorder, item)
            else:
                self._keep(recorder, item)
            stamp, at = self._clock  # the source's clock: a file read fast or a stalled camera alike
            recorder.expire(stamp + time.monotonic() - at)
            self._deliver_finished(recorder)
        recorder.flush()
        self._deliver_finished(recorder)

    def _keep(self, recorder: EvidenceRecorder, item: _Pending) -> None:
        frame = self.record.frame_at(item.frame_id) if item.from_record and self.record is not None else item.frame
        if frame is None:  # a damaged record frame, or the record source just lost: this one is missed
            return
        try:
            recorder.add(frame, item.frame_id, item.timestamp)
        except Exception:  # an encoder failure must not end the evidence
            log.exception("evidence frame %d could not be kept", item.frame_id)

    def _record(self, recorder: EvidenceRecorder, item: _Pending) -> None:
        """Start an event's recording, with its own frame (encoded here, off the inference thread) when it came
        with one."""
        own = annotated = None
        try:
            if item.drawing is not None:
                _on_record(item, self.record, recorder.history)
            if item.frame is not None:
                own = recorder.encode(item.frame, item.frame_id, item.timestamp)
            if item.annotated is not None:
                annotated = recorder.history.encode(item.annotated)
        except Exception:  # an encoder failure: the event keeps the nearest kept frame
            log.exception("event frame %d could not be encoded", item.frame_id)
        recorder.trigger(item.event or {}, frame_id=item.frame_id, own=own, annotated=annotated)

    def _deliver_finished(self, recorder: EvidenceRecorder) -> None:
        for summary in recorder.finished():
            event = dict(summary["event"])
            event.update(event_id=summary["event_id"], snapshot=summary["snapshot"],
                         plain_snapshot=summary["plain_snapshot"], clip=summary["clip"],
                         frames=summary["frames"], duration_s=round(max(summary["end"] - summary["start"], 0.0), 3),
                         snapshot_bytes=_size(summary, "snapshot"), clip_bytes=_size(summary, "clip"))
            self._deliver(event)

    def _deliver(self, event: dict) -> None:
        self.delivered += 1
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not stop the events
                log.exception("event listener failed on %s", event.get("event_id"))

    # -- the end ----------------------------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        """Finish every recording with the post-roll it has, write it, tell the listeners; idempotent."""
        with self._lock:
            self._closed = True
            self._wake.notify()
        thread = self._thread
        if thread is None:
            return
        if thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("evidence thread of %s did not finish within %.0f s", self.stream or "the pipeline",
                            timeout)

    def counts(self) -> dict[str, int]:
        """What the rules did: triggered, suppressed by cooldown, rate-limited, evidence frames dropped,
        events delivered, recordings that could not be written."""
        failed = self.recorder.failed if self.recorder is not None else 0
        return {"triggered": self.triggered, "suppressed": self.suppressed, "rate_limited": self.rate_limited,
                "frames_dropped": self.frames_dropped, "delivered": self.delivered, "failed": failed}


def _on_record(item: _Pending, record: RecordSource | None, history: FrameHistory) -> None:
    """An event's frame and its drawing from the record source (the detect frame's copy if it is lost)."""
    from .annotate import annotate

    assert item.drawing is not None
    result, geometry, counts, highlight, source_width = item.drawing
    big = record.frame_at(item.frame_id) if record is not None else None
    base = big if big is not None else item.frame
    if base is None:
        return
    item.annotated = annotate(base, result, geometry=geometry, counts=counts, width=history.width,
                              highlight=highlight, source_width=source_width)
    item.frame = history.downscaled(base) if big is not None else item.frame


def _size(summary: dict, what: str) -> int:
    try:
        return Path(summary[what]).stat().st_size
    except OSError:
        return 0


def detection_shapes(item: Any) -> dict[str, Any]:
    """What a detection carries beyond its box, in the sample form (``forms/samples.py``): a pose model's
    ``keypoints``, a segmentation model's ``polygons``, an oriented box's ``rotated_box`` (none for a class)."""
    from ..forms.samples import MAX_KEYPOINTS
    from .postprocess import keypoint_rows

    shapes = dict(item.shapes()) if hasattr(item, "shapes") else {}
    if getattr(item, "keypoints", ()):
        shapes["keypoints"] = keypoint_rows(item.keypoints[:MAX_KEYPOINTS])
    return shapes


def scored_items(result: Any) -> Sequence[Any]:
    """The items of a result a ``detection`` rule looks at: every detection, or a classification's top-1
    (other tasks: none)."""
    from .postprocess import Classification, Detections

    if isinstance(result, Detections):
        return result.items
    if isinstance(result, list) and result and isinstance(result[0], Classification):
        return result[:1]
    return ()


def rules_from_options(options: Any) -> tuple[EventRule, ...]:
    """The pipeline's ``events`` rules, checked against its own ``lines`` and ``zones`` (ValueError)."""
    from .zones import counter_names

    return parse_rules(options.events, lines=counter_names(options.lines, "line"),
                       zones=counter_names(options.zones, "zone"))


def stream_folder(evidence_dir: Any, stream: str) -> Path | None:
    """A stream's own evidence folder under ``evidence_dir`` (its name made safe for a path), or None."""
    if evidence_dir is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", stream).lstrip("_-")[:64] or "stream"
    return Path(evidence_dir) / safe


def events_from_options(options: Any, stream: str = "", evidence_dir: Any = None) -> StreamEvents | None:
    """The stream's :class:`StreamEvents` from the pipeline options (``events``, ``event_cooldown_s``,
    ``evidence_*``), or None when there are no rules. ``evidence_dir`` overrides ``options.evidence_dir``
    (a multi-stream run gives each stream a folder of its own)."""
    if not options.events:
        return None
    rules = rules_from_options(options)
    folder = evidence_dir if evidence_dir is not None else options.evidence_dir
    store = (EvidenceStore(folder, max_bytes=int(options.evidence_max_mb * 1024 * 1024))
             if folder is not None else None)
    return StreamEvents(rules, store=store, stream=stream, cooldown_s=options.event_cooldown_s,
                        per_minute=options.events_per_minute, pre_s=options.evidence_pre_s,
                        post_s=options.evidence_post_s, fps=options.evidence_fps, width=options.evidence_width)
