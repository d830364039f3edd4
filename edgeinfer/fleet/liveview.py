"""The live view: a device's annotated frames, pushed by the device while someone watches, to the dashboard as
MJPEG (``multipart/x-mixed-replace``, one JPEG a part).

The first viewer of a (device, pipeline, stream) on this manager sends the device a signed ``live_view``
command; while viewers stay, a thread (``edgeinfer-fleet-liveview``) re-sends it every :data:`RENEW_S` with
``until`` :data:`WATCH_S` ahead, and marks the key watched until then in the database. The device POSTs each
frame to the ingest route; a frame is stored (the row's newest, overwritten: nothing is recorded) only while
the key is watched — else 410 and the device stops — and handed at once to this manager's viewers. The same
thread polls the watched keys' rows at the highest frame rate allowed, for the frames another manager behind
the load balancer received. A viewer holds at most :data:`QUEUE_FRAMES` frames: a slow one skips frames
(the newest wins), it never holds the others up.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from urllib.parse import quote

from ..link.vocabulary import Command
from .commands import CommandService
from .db import FleetDB
from .db.live import Key
from .live import Loop

log = logging.getLogger(__name__)

#: a viewer's device is asked to send frames this far ahead; it stops by itself that long after the last viewer
WATCH_S = 30.0
#: how often the command is sent again while someone watches
RENEW_S = 10.0
MAX_FPS = 15.0
#: the frames another manager received are looked for at the highest frame rate
POLL_S = 1.0 / MAX_FPS
QUEUE_FRAMES = 2
BOUNDARY = "edgeinfer-live"
MEDIA_TYPE = f"multipart/x-mixed-replace; boundary={BOUNDARY}"
#: the largest frame a device may post
MAX_FRAME_BYTES = 1 << 20
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a baseline or progressive JPEG's frame header; ValueError when it is not a JPEG."""
    if not data.startswith(b"\xff\xd8\xff") or not data.rstrip(b"\0").endswith(b"\xff\xd9"):
        raise ValueError("the body is not a JPEG (FF D8 ... FF D9)")
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if marker in _SOF and i + 9 <= len(data):
            height, width = int.from_bytes(data[i + 5:i + 7], "big"), int.from_bytes(data[i + 7:i + 9], "big")
            if width and height:
                return width, height
        if marker == 0xDA or length < 2:
            break
        i += 2 + length
    raise ValueError("the JPEG has no frame header with its size")


@dataclass(frozen=True)
class ViewRequest:
    """What a viewer asks the device for (the device gets the most any viewer of the key asks)."""

    fps: float = 5.0
    width: int = 640
    max_kbps: int = 2000


@dataclass(frozen=True, eq=False)
class _Viewer:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    wants: ViewRequest


def part(row: dict) -> bytes:
    """One MJPEG part: the JPEG with its capture time and id as part headers (what the bench reads)."""
    head = (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(row['jpeg'])}\r\n"
            f"X-Frame-Time: {row.get('frame_time') or 0:.6f}\r\nX-Frame-Id: {row.get('frame_id') or ''}\r\n"
            f"X-Frame-Size: {row.get('width') or 0}x{row.get('height') or 0}\r\n\r\n")
    return head.encode() + bytes(row["jpeg"]) + b"\r\n"


class LiveView(Loop):
    """Viewers of live frames on this manager, and the device commands and frames that feed them."""

    thread_name = "edgeinfer-fleet-liveview"

    def __init__(self, db: FleetDB, commands: CommandService, public_url: Callable[[], str]) -> None:
        super().__init__()
        self.db = db
        self.commands = commands
        self.public_url = public_url
        self._viewers: dict[Key, set[_Viewer]] = {}
        self._seen: dict[Key, int] = {}
        self._last: dict[Key, bytes] = {}
        self._renewed: dict[Key, float] = {}
        self._lock = threading.Lock()

    @property
    def viewers(self) -> int:
        return sum(len(v) for v in self._viewers.values())

    def frame_url(self, key: Key) -> str:
        """Where the device POSTs the key's frames: this manager's public URL and the ingest route."""
        device, pipeline, stream = (quote(part, safe="") for part in key)
        url = f"{self.public_url().rstrip('/')}/api/devices/{device}/live/{pipeline}/frames"
        return f"{url}?stream={stream}" if stream else url

    # ------------------------------------------------------------------------------- viewers
    async def watch(self, key: Key, wants: ViewRequest) -> AsyncIterator[bytes]:
        """The MJPEG parts of ``key``'s frames as they arrive, until the client goes (the caller's task is
        cancelled then: the viewer is removed)."""
        viewer = _Viewer(asyncio.get_running_loop(), asyncio.Queue(QUEUE_FRAMES), wants)
        with self._lock:
            self._viewers.setdefault(key, set()).add(viewer)
            last = self._last.get(key)
        if last is None:  # the newest frame any manager has (the editor's still while the device starts, or is off)
            row = await asyncio.get_running_loop().run_in_executor(None, self.db.live_frame, key)
            last = part(row) if row is not None else None
        if last is not None:
            viewer.queue.put_nowait(last)
        await asyncio.get_running_loop().run_in_executor(None, self.renew, key)
        self._wake.set()
        try:
            while True:
                yield await viewer.queue.get()
        finally:
            with self._lock:
                viewers = self._viewers.get(key, set())
                viewers.discard(viewer)
                if not viewers:
                    self._viewers.pop(key, None)
                    self._renewed.pop(key, None)

    def _watched_here(self, key: Key) -> bool:
        with self._lock:
            return bool(self._viewers.get(key))

    def renew(self, key: Key) -> None:
        """Mark ``key`` watched for :data:`WATCH_S` and (re-)send the device its ``live_view`` command."""
        with self._lock:
            wanted = [v.wants for v in self._viewers.get(key, ())]
            self._renewed[key] = time.monotonic()
        if not wanted:
            return
        until = time.time() + WATCH_S
        self.db.watch_live(key, until)
        args = {"pipeline": key[1], "stream": key[2], "fps": max(w.fps for w in wanted),
                "width": max(w.width for w in wanted), "max_kbps": max(w.max_kbps for w in wanted),
                "until": round(until, 3), "url": self.frame_url(key)}
        try:
            self.commands.send(key[0], Command.LIVE_VIEW, args)
        except LookupError as exc:  # the device was never heard of: its viewers wait for nothing
            log.warning("live view: %s", exc.args[0])

    # -------------------------------------------------------------------------------- frames
    def receive(self, key: Key, jpeg: bytes, frame_time: float | None, frame_id: str | None,
                source_size: tuple[int, ...] | None = None) -> bool:
        """A device's frame: stored as the key's newest and handed to this manager's viewers while someone
        watches (True); False when nobody does (the device is told 410 and stops). ValueError: not a JPEG.
        ``source_size``: the source's (width, height), the pixels lines and zones are in (the JPEG may be
        scaled down); the JPEG's own size when not given."""
        own_size = jpeg_size(jpeg)  # ValueError for what is no JPEG, whatever size the device says its source has
        width, height = source_size or own_size
        row = {"jpeg": jpeg, "width": width, "height": height, "frame_time": frame_time, "frame_id": frame_id}
        seq = self.db.put_live_frame(key, row)
        if seq is None and self._watched_here(key):  # a viewer here whose watch is not in the database yet
            self.db.watch_live(key, time.time() + WATCH_S)
            seq = self.db.put_live_frame(key, row)
        if seq is None:
            return False
        self._deliver(key, {**row, "seq": seq})
        return True

    def _deliver(self, key: Key, row: dict) -> None:
        with self._lock:
            if row["seq"] <= self._seen.get(key, 0):  # the poll and the ingest race: each frame once
                return
            self._seen[key] = row["seq"]
            data = self._last[key] = part(row)
            viewers = list(self._viewers.get(key, ()))
        for viewer in viewers:
            try:
                viewer.loop.call_soon_threadsafe(_offer, viewer.queue, data)
            except RuntimeError:  # its loop has closed
                pass

    # ------------------------------------------------------------------------------- the thread
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                keys = list(self._viewers)
                seen = {key: self._seen.get(key, 0) for key in keys}
                due = [key for key in keys if time.monotonic() - self._renewed.get(key, 0) >= RENEW_S]
            if not keys:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                for key in due:
                    self.renew(key)
                for row in self.db.newer_live_frames(seen):
                    self._deliver((row["device_id"], row["pipeline"], row["stream"]), row)
            except Exception as exc:  # the database may be restarting: try again next turn
                log.warning("live view: %s", exc)
            self._stop.wait(POLL_S)


def _offer(queue: asyncio.Queue, data: bytes) -> None:
    """On the viewer's loop: queue the frame, dropping the oldest when the viewer is behind."""
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(data)
