"""The form of a captured sample and the output drift measure, defined once for the device that keeps samples
(``pipeline/sampling.py``) and the fleet that will store them (and that judges canaries by the same drift).

A sample is a folder named like an event id (``_evidence.new_event_id``: sorts by time, never collides) holding
the frame as the camera gave it (full size, JPEG) and ``sample.json`` (the model's output, the rule that kept it,
the model, device/pipeline/stream, times, the frame's size), written last: a folder without it is partial.
Plain constants and two functions — nothing the fleet manager would not load anyway.
"""

from __future__ import annotations

from collections import Counter

#: a sample's files: the frame (full size) and what is known about it (written last)
SAMPLE_FRAME_NAME = "frame.jpg"
SAMPLE_META_NAME = "sample.json"
#: the version of ``sample.json``'s fields
SAMPLE_VERSION = 1
#: the rule a request from the dashboard keeps frames under ("capture the next N frames")
REQUEST_RULE = "request"


def total_variation(first: Counter, second: Counter) -> float | None:
    """Output drift: half the L1 distance between two label histograms, each normalised (0 = the same,
    1 = nothing in common; None when either is empty). The canary analysis and the capture rule both use it."""
    a, b = sum(first.values()), sum(second.values())
    if not a or not b:
        return None
    return 0.5 * sum(abs(first[k] / a - second[k] / b) for k in set(first) | set(second))
