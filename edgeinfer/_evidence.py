"""The form of an event's evidence, defined once for the three that handle it: the pipeline records it
(``pipeline/evidence.py``), the agent uploads it (``agent/evidence_upload.py``) and the fleet manager stores
and serves it (``fleet/evidence.py``, the API's paths and their OpenAPI patterns).

A base module, not ``link/``: the pipeline sits below the link in the layers and must name the same files
and ids. Plain constants and one function — no numpy, nothing the fleet manager would not load anyway.
"""

from __future__ import annotations

import os
import re
import time

#: an event's evidence files, and what each is served as
SNAPSHOT_NAME = "snapshot.jpg"
CLIP_NAME = "clip.mjpeg"
CONTENT_TYPES = {SNAPSHOT_NAME: "image/jpeg", CLIP_NAME: "video/x-motion-jpeg"}
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
