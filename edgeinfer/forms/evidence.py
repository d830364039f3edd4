"""The form of an event's evidence, defined once for the three that handle it: the pipeline records it
(``pipeline/evidence.py``), the agent uploads it (``agent/uploads.py``) and the fleet manager stores
and serves it (``fleet/evidence.py``, the API's paths and their OpenAPI patterns).

A base module, not ``link/``: the pipeline sits below the link in the layers and must name the same files
and ids. Plain constants and one function — no numpy, nothing the fleet manager would not load anyway.
"""

from __future__ import annotations

import os
import re
import time

#: an event's evidence files, and what each is served as: the snapshot (the event's frame with what the model
#: saw drawn on it), the same frame as the camera gave it, and the clip — H.264 in MP4 where the device has an
#: encoder (browsers play it in <video>), else the kept JPEGs back to back (MJPEG)
SNAPSHOT_NAME = "snapshot.jpg"
PLAIN_SNAPSHOT_NAME = "frame.jpg"
CLIP_NAME = "clip.mjpeg"
MP4_CLIP_NAME = "clip.mp4"
CONTENT_TYPES = {SNAPSHOT_NAME: "image/jpeg", PLAIN_SNAPSHOT_NAME: "image/jpeg", CLIP_NAME: "video/x-motion-jpeg",
                 MP4_CLIP_NAME: "video/mp4"}
#: the names an event's clip may have (one of them per event), and every evidence file, in upload order
CLIP_NAMES = (MP4_CLIP_NAME, CLIP_NAME)
#: the fleet manager's database keeps a file's name in 16 characters
EVIDENCE_FILES = (SNAPSHOT_NAME, PLAIN_SNAPSHOT_NAME, MP4_CLIP_NAME, CLIP_NAME)
#: what an event id looks like: UTC time to the millisecond, the frame id, random hex. ASCII digits only
#: (``\d`` would take any Unicode digit), anchored for JSON Schema and ``re.match`` alike.
EVENT_ID_PATTERN = r"^[0-9]{8}T[0-9]{9}Z-[0-9]+-[0-9a-f]{6}$"
EVENT_ID = re.compile(EVENT_ID_PATTERN.replace("$", r"\Z"))
#: the same in words (error messages)
EVENT_ID_FORM = "YYYYmmddTHHMMSSfffZ-<frame>-<6 hex>"


def new_event_id(frame_id: int, now: float | None = None) -> str:
    """``YYYYmmddTHHMMSSmmmZ-<frame id>-<6 hex>``: sorts by time as text, unique by its random part."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}Z"
    return f"{stamp}-{max(int(frame_id), 0)}-{os.urandom(3).hex()}"  # secrets' source, without its hmac/OpenSSL import
