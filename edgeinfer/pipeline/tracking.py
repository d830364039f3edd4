"""Multi-object tracking: track ids on detections, from a maintained ByteTrack (docs/analytics.md).

:class:`Tracker` is edgeinfer's small face of a tracking library: ``update(detections, frame_id)``
returns the same detections with ``track_id`` set on those that belong to a *confirmed* track. The
library today is Roboflow's ``trackers`` (its ``ByteTrackTracker``, Apache-2.0; the extra
``edgeinfer[tracking]``), imported on first use; another backend fits behind the same three methods.

Confirmation: a track gets an id only after it was matched in ``min_hits`` consecutive frames
(ByteTrack's activation rule); before that its detections carry ``track_id=None`` and nothing
counts them. ``min_hits=1`` gives every new detection an id at once — the setting behind counters
that report 97 crossings for 7 (tentative tracks on detector noise).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..util.optional import import_optional
from .postprocess import Detection, Detections

DEFAULT_MIN_HITS = 3


class Tracker:
    """ByteTrack through the ``trackers`` library; one instance per stream (it keeps the tracks).

    ``lost_frames``: how many frames a confirmed track survives without a detection (re-found within
    them it keeps its id: a box flickering off for a frame or two). ``match_iou``: least IoU between
    a track's predicted box and a detection to match them. ``high_score``: detections at or above it
    are matched first and may start tracks; lower ones (give the pipeline a lower
    ``score_threshold`` to get them) only keep existing tracks alive — ByteTrack's second stage.
    ``frame_rate`` scales the motion model; frame ids are turned into times with it, so frames a
    pipeline dropped are a gap, not a step.
    """

    def __init__(self, *, min_hits: int = DEFAULT_MIN_HITS, lost_frames: int = 30, match_iou: float = 0.1,
                 high_score: float = 0.6, frame_rate: float = 30.0) -> None:
        if not isinstance(min_hits, int) or min_hits < 1:
            raise ValueError(f"min_hits must be an integer >= 1, not {min_hits!r}")
        if not isinstance(lost_frames, int) or lost_frames < 0:
            raise ValueError(f"lost_frames must be an integer >= 0, not {lost_frames!r}")
        if not 0.0 < match_iou <= 1.0:
            raise ValueError(f"match_iou must be in (0, 1], not {match_iou!r}")
        if not 0.0 <= high_score <= 1.0:
            raise ValueError(f"high_score must be in [0, 1], not {high_score!r}")
        if not frame_rate > 0:
            raise ValueError(f"frame_rate must be > 0, not {frame_rate!r}")
        self.min_hits = min_hits
        self.lost_frames = lost_frames
        self.match_iou = match_iou
        self.high_score = high_score
        self.frame_rate = float(frame_rate)
        self._backend: Any = None
        self._sv: Any = None
        self._np: Any = None
        #: ids of the confirmed tracks seen so far
        self.confirmed_ids: set[int] = set()

    # -- the backend -------------------------------------------------------------------------
    def _load(self) -> None:
        trackers = import_optional("trackers", "tracking", "tracking (edgeinfer.pipeline.tracking)")
        self._sv = import_optional("supervision", "tracking", "tracking (edgeinfer.pipeline.tracking)")
        import numpy as np

        self._np = np
        # lost_track_buffer is in 30 fps frames in the library; ours is in frames at frame_rate
        self._backend = trackers.ByteTrackTracker(
            lost_track_buffer=max(0, round(self.lost_frames * 30.0 / self.frame_rate)),
            frame_rate=self.frame_rate,
            track_activation_threshold=self.high_score,
            minimum_consecutive_frames=self.min_hits,
            minimum_iou_threshold=self.match_iou,
            high_conf_det_threshold=self.high_score,
        )

    def reset(self) -> None:
        """Forget every track (a new scene, a stream restarted); ids start again from 0."""
        self._backend = None
        self.confirmed_ids = set()

    def update(self, detections: Detections, frame_id: int) -> Detections:
        """The frame's detections, each with ``track_id`` set when it belongs to a confirmed track.

        Frames must come in increasing ``frame_id`` order; a gap (dropped frames) is a gap in time.
        Detections that no track claims keep ``track_id=None``; the order is the input's.
        """
        if self._backend is None:
            self._load()
        np = self._np
        n = len(detections)
        boxes = np.array([d.box for d in detections], dtype=np.float32).reshape(n, 4)
        scores = np.array([d.score for d in detections], dtype=np.float32)
        sv_detections = self._sv.Detections(xyxy=boxes, confidence=scores,
                                            data={"index": np.arange(n, dtype=np.int64)})
        tracked = self._backend.update(sv_detections, timestamp=frame_id / self.frame_rate)
        ids: list[int | None] = [None] * n
        if not n or not len(tracked):  # the library answers an empty frame without our index column
            return Detections(tuple(_with_track(d, None) for d in detections))
        for index, track_id in zip(tracked.data["index"].tolist(), tracked.tracker_id.tolist()):
            if track_id >= 0:
                ids[index] = int(track_id)
                self.confirmed_ids.add(int(track_id))
        return Detections(tuple(_with_track(d, t) for d, t in zip(detections, ids)))


def _with_track(detection: Detection, track_id: int | None) -> Detection:
    if detection.track_id == track_id:
        return detection
    return dataclasses.replace(detection, track_id=track_id)  # keypoints, mask and angle kept
