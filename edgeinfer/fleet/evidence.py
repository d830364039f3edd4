"""Events with evidence, the fleet's side: the snapshot and the clip a device uploads for a triggered event,
kept in the fleet database, served back, played, and bounded in bytes.

A device records, per triggered rule, ``snapshot.jpg`` (one JPEG) and ``clip.mjpeg`` (the kept JPEG
frames concatenated: a plain MJPEG stream), named by an event id (:data:`EVENT_ID`), and uploads them
with ``PUT /api/devices/<device>/events/<event id>/<file>`` (``api/events.py``). An upload is
streamed into a temporary file in the manager's data dir while it is hashed — never held in memory
— checked (a JPEG's markers; a body cut short keeps nothing), then written to the database in one
transaction, 1 MiB a row. The database rather than the data dir, because several managers behind
one load balancer must serve what any of them received (docs/fleet.md, *Events with evidence*).

Evidence is immutable: the same bytes again (an agent's retry after a network cut) are answered as
stored; other bytes for a stored file are refused (409). The total is bounded (``total_bytes``):
after each upload, and on the retention pass, the events stored first lose their evidence first.

:class:`JpegFrames` splits a clip into its frames by walking each JPEG's segments (an EXIF thumbnail's
own FF D8 … FF D9 inside APP1, or an FF D9 inside entropy-coded data that is really FF 00 stuffing,
does not end a frame): to count them at upload and to play a clip at its own rate
(``multipart/x-mixed-replace``, which a browser shows in an ``<img>``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..forms.evidence import CLIP_NAME, EVENT_ID, MP4_CLIP_NAME, PLAIN_SNAPSHOT_NAME, SNAPSHOT_NAME
from ..util.fs import temp_path_for
from .artifacts import UploadTooLarge
from .db import FleetDB

log = logging.getLogger(__name__)

#: bytes per evidence_chunks row
CHUNK_BYTES = 1 << 20
MIB = 1 << 20
DEFAULT_SNAPSHOT_BYTES = 4 * MIB
DEFAULT_CLIP_BYTES = 64 * MIB
DEFAULT_TOTAL_BYTES = 2048 * MIB
#: a clip plays at frames / duration_s of its event; this when the event has not said (the agent's default)
DEFAULT_FPS = 5.0
MIN_FPS, MAX_FPS = 0.2, 60.0
BOUNDARY = "edgeinfer-frame"
SOI, EOI = b"\xff\xd8", b"\xff\xd9"
#: the files that are one whole JPEG each
JPEG_FILES = (SNAPSHOT_NAME, PLAIN_SNAPSHOT_NAME)
#: an MP4 starts with its ``ftyp`` box: 4 bytes of size, then the type
MP4_TYPE = b"ftyp"


@dataclass(frozen=True)
class EvidenceLimits:
    """How large one snapshot and one clip may be, and all evidence together (``fleet serve --evidence-*``)."""

    snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES
    clip_bytes: int = DEFAULT_CLIP_BYTES
    total_bytes: int = DEFAULT_TOTAL_BYTES

    def for_file(self, name: str) -> int:
        return self.snapshot_bytes if name in JPEG_FILES else self.clip_bytes


@dataclass(frozen=True)
class Stored:
    """What an upload did: 201 stored, 200 the same bytes were stored already, 409 other bytes are."""

    status: int
    device_id: str
    event_id: str
    file: str
    size: int
    sha256: str

    def answer(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "event_id": self.event_id, "file": self.file, "size": self.size,
                "sha256": self.sha256}


class JpegFrames:
    """Splits concatenated JPEGs (an MJPEG clip) into frames, fed in pieces of any size.

    Each frame is walked by its markers: from SOI, the segments by their lengths up to SOS, then the
    entropy-coded data, where FF 00 is a data byte and FF D0-D7 a restart marker, to the next marker —
    EOI ends the frame, anything else (a progressive JPEG's next tables and scan) is another segment.
    Bytes outside a frame are skipped (``skipped``); a frame whose structure is broken is dropped and the
    search goes on from its next byte (``broken``).
    """

    _SEEK, _HEADER, _SCAN = range(3)

    def __init__(self, max_frame_bytes: int = DEFAULT_CLIP_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.skipped = 0
        self.broken = 0
        self.frames = 0
        self._buf = bytearray()
        self._pos = 0
        self._state = self._SEEK

    @property
    def pending(self) -> int:
        """Bytes of a frame begun and not ended yet (what :meth:`feed` is waiting to complete)."""
        return len(self._buf) if self._state != self._SEEK else 0

    def feed(self, data: bytes) -> list[bytes]:
        """The frames that ``data`` completes, in order."""
        self._buf += data
        out: list[bytes] = []
        while (end := self._advance()) is not None:
            if end < 0:  # broken: drop the frame's first byte and look for the next SOI
                self.broken += 1
                self.skipped += 1
                del self._buf[:1]
            else:
                out.append(bytes(self._buf[:end]))
                del self._buf[:end]
                self.frames += 1
            self._pos, self._state = 0, self._SEEK
        if self._state != self._SEEK and len(self._buf) > self.max_frame_bytes:
            self.broken += 1
            self.skipped += len(self._buf)
            self._buf.clear()
            self._pos, self._state = 0, self._SEEK
        return out

    def _advance(self) -> int | None:
        """Parse on from ``_pos``: a frame's end (>0), -1 for a broken frame, None when more data is needed."""
        buf = self._buf
        pos = self._pos
        while True:
            if self._state == self._SEEK:
                start = buf.find(SOI, pos)
                if start < 0:
                    keep = 1 if buf.endswith(b"\xff") else 0  # perhaps the first half of an SOI
                    self.skipped += len(buf) - keep
                    del buf[:len(buf) - keep]
                    self._pos = 0
                    return None
                self.skipped += start
                del buf[:start]
                pos, self._state = 2, self._HEADER
            elif self._state == self._HEADER:
                if pos + 2 > len(buf):
                    break
                if buf[pos] != 0xFF:
                    return -1
                marker = buf[pos + 1]
                if marker == 0xFF:  # a fill byte before the marker
                    pos += 1
                elif marker == 0xD9:
                    return pos + 2
                elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
                    pos += 2
                elif marker in (0x00, 0xD8):
                    return -1
                else:
                    if pos + 4 > len(buf):
                        break
                    length = (buf[pos + 2] << 8) | buf[pos + 3]
                    if length < 2:
                        return -1
                    if pos + 2 + length > len(buf):
                        break
                    pos += 2 + length
                    if marker == 0xDA:  # start of scan: entropy-coded data follows
                        self._state = self._SCAN
            else:
                found = buf.find(b"\xff", pos)
                if found < 0 or found + 1 >= len(buf):
                    pos = len(buf) if found < 0 else found
                    break
                following = buf[found + 1]
                if following == 0x00 or 0xD0 <= following <= 0xD7:
                    pos = found + 2
                elif following == 0xFF:
                    pos = found + 1
                else:  # a marker ends the scan
                    pos, self._state = found, self._HEADER
        self._pos = pos
        return None


def count_frames(chunks: Iterator[bytes], max_frame_bytes: int = DEFAULT_CLIP_BYTES) -> int:
    splitter = JpegFrames(max_frame_bytes)
    for data in chunks:
        splitter.feed(data)
    return splitter.frames


def playback_fps(data: dict | None, frames: int | None = None) -> float:
    """A clip's rate: its event's frames / duration_s (``data``: the event's data), within MIN_FPS..MAX_FPS."""
    data = data or {}
    count, duration = data.get("frames", frames), data.get("duration_s")
    if isinstance(count, (int, float)) and isinstance(duration, (int, float)) and count > 0 and duration > 0:
        return min(MAX_FPS, max(MIN_FPS, float(count) / float(duration)))
    return DEFAULT_FPS


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as source:
        while data := source.read(CHUNK_BYTES):
            yield data


def flags(files: dict[str, dict] | None, event_id: str | None) -> dict[str, Any]:
    """An event's ``evidence`` object in the API: which files are stored, their sizes, the clip's frames."""
    files = files or {}
    snapshot = files.get(SNAPSHOT_NAME)
    # an event has one clip: MP4 (H.264) where the device could encode it, else MJPEG
    clip_name = next((name for name in (MP4_CLIP_NAME, CLIP_NAME) if name in files), None)
    clip = files.get(clip_name) if clip_name else None
    return {"event_id": event_id, "snapshot": snapshot is not None, "clip": clip is not None,
            "snapshot_bytes": snapshot["size"] if snapshot else None, "clip_bytes": clip["size"] if clip else None,
            "frames": clip["frames"] if clip else None, "plain_snapshot": PLAIN_SNAPSHOT_NAME in files,
            "clip_name": clip_name}


class EvidenceStore:
    """Evidence files in the fleet database ``db`` (``FleetDB``); uploads pass through ``incoming``."""

    def __init__(self, db: FleetDB, incoming: Path, limits: EvidenceLimits = EvidenceLimits()) -> None:
        self.db = db
        self.limits = limits
        self.incoming = Path(incoming)
        self.incoming.mkdir(parents=True, exist_ok=True)
        for leftover in self.incoming.glob(".*.tmp*"):  # an upload a crash interrupted
            leftover.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------ uploads
    async def receive(self, device_id: str, event_id: str, name: str, chunks: AsyncIterator[bytes], *,
                      expected: int) -> Stored:
        """Take an upload of ``expected`` bytes. ValueError (400) when it is not a JPEG of its kind, cut short
        or longer than announced; UploadTooLarge (413) past the file's limit. Nothing is kept then."""
        limit = self.limits.for_file(name)
        if expected > limit:
            raise UploadTooLarge(f"{name} may be {limit} bytes at most, not {expected}")
        temp = temp_path_for(self.incoming / "upload")
        digest, size, tail = hashlib.sha256(), 0, b""
        try:
            with open(temp, "wb") as out:
                async for data in chunks:
                    if not data:
                        continue
                    if size == 0 and name != MP4_CLIP_NAME and (data[0] != 0xFF or data[1:2] not in (b"", SOI[1:])):
                        raise ValueError(f"{name} is not a JPEG: it does not start with FF D8")  # refused at once
                    size += len(data)
                    if size > expected:
                        raise ValueError(f"the body is longer than its Content-Length ({expected} bytes)")
                    digest.update(data)
                    tail = (tail + data[-2:])[-2:]
                    out.write(data)
            if size != expected:
                raise ValueError(f"the upload was cut short: {size} of {expected} bytes")
            with open(temp, "rb") as check:
                head = check.read(8)
            if name == MP4_CLIP_NAME:
                if head[4:8] != MP4_TYPE:
                    raise ValueError(f"{name} is not an MP4: it does not start with an ftyp box")
            elif head[:2] != SOI:
                raise ValueError(f"{name} is not a JPEG: it does not start with FF D8")
            if name in JPEG_FILES and tail != EOI:
                raise ValueError(f"{name} is not a whole JPEG: it does not end with FF D9")
            return await asyncio.to_thread(self._commit, device_id, event_id, name, temp, size, digest.hexdigest())
        finally:
            temp.unlink(missing_ok=True)

    def _commit(self, device_id: str, event_id: str, name: str, temp: Path, size: int, sha256: str) -> Stored:
        frames = None
        if name == CLIP_NAME:
            frames = count_frames(_file_chunks(temp), self.limits.clip_bytes)
            if frames == 0:
                raise ValueError(f"{name} holds no whole JPEG frame")
        row = {"device_id": device_id, "event_id": event_id, "file": name, "size": size, "sha256": sha256,
               "chunks": -(-size // CHUNK_BYTES), "frames": frames}
        outcome, stored = self.db.put_evidence(row, _file_chunks(temp))
        status = {"created": 201, "same": 200, "conflict": 409}[outcome]
        if outcome == "created":
            self.prune(keep=(device_id, event_id))
        return Stored(status, device_id, event_id, name, int(stored["size"]), stored["sha256"])

    def prune(self, *, keep: tuple[str, str] | None = None) -> int:
        """Bound the total: the events stored first lose their evidence first; how many events lost it."""
        deleted = self.db.prune_evidence(self.limits.total_bytes, keep=keep)
        if deleted:
            log.info("evidence retention: deleted the evidence of %d event(s) to stay within %d bytes",
                     len(deleted), self.limits.total_bytes)
        return len(deleted)

    # ------------------------------------------------------------------------------ reading
    def info(self, device_id: str, event_id: str, name: str) -> dict | None:
        return self.db.evidence_file(device_id, event_id, name)

    def chunks(self, info: dict) -> Iterator[bytes]:
        """A stored file's bytes, a chunk (one short query) at a time."""
        for seq in range(int(info["chunks"])):
            data = self.db.evidence_chunk(info["device_id"], info["event_id"], info["file"], seq)
            if data is None:  # deleted by retention while it was being read
                return
            yield data

    def fps(self, info: dict) -> float:
        return playback_fps(self.db.event_data(info["device_id"], info["event_id"]), info.get("frames"))

    async def play(self, info: dict, fps: float) -> AsyncIterator[bytes]:
        """The clip as ``multipart/x-mixed-replace; boundary=BOUNDARY``, one JPEG a part, ``fps`` a second."""
        loop = asyncio.get_running_loop()
        splitter = JpegFrames(self.limits.clip_bytes)
        interval, due = 1.0 / fps, loop.time()
        for seq in range(int(info["chunks"])):
            data = await asyncio.to_thread(self.db.evidence_chunk, info["device_id"], info["event_id"],
                                           info["file"], seq)
            if data is None:
                break
            for frame in splitter.feed(data):
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                due = max(due, loop.time() - interval) + interval
                yield (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(frame)}\r\n\r\n".encode()
                       + frame + b"\r\n")
        yield f"--{BOUNDARY}--\r\n".encode()

    def list_events(self, *, device_id: str | None = None, kind: str | None = None, event_id: str | None = None,
                    limit: int = 100) -> list[dict]:
        """Events newest first, each with its evidence (``GET /api/events``)."""
        return self.with_evidence(self.db.list_events(device_id=device_id, kind=kind, event_id=event_id,
                                                      limit=limit))

    def with_evidence(self, events: list[dict]) -> list[dict]:
        """``events`` (payloads, each with its ``device_id``, or a device's own) with an ``evidence`` object each."""
        keys = {}
        for index, event in enumerate(events):
            data = event.get("data")
            candidate = data.get("event_id") if isinstance(data, dict) else None
            device = event.get("device_id") or event.get("device")
            if isinstance(candidate, str) and EVENT_ID.match(candidate) and isinstance(device, str):
                keys[index] = (device, candidate)
        stored = self.db.evidence_of(list(keys.values())) if keys else {}
        return [{**event, "evidence": flags(stored.get(keys[i]), keys[i][1]) if i in keys else flags(None, None)}
                for i, event in enumerate(events)]
