"""What a device sends the fleet manager on its own: each event's evidence and each sample, PUT with the
device's credential.

:class:`DeviceUploader` runs thread ``edgeinfer-device-upload``. The pipelines hand it what they wrote (an event's
folder, :meth:`~DeviceUploader.enqueue`; a sample's, :meth:`~DeviceUploader.enqueue_sample`); it sends each
as its :class:`Kind` says — an event's ``snapshot.jpg`` then its clip to
``<manager_url>/api/devices/<device>/events/<event id>/<file>``, a sample as one JSON document (``forms/samples.py``) to
``<manager_url>/api/devices/<device>/samples/<sample id>`` — with HTTP Basic (the device's MQTT user name and
password, as artifact downloads do), and marks the folder ``uploaded`` when the manager has it. Nothing is kept in
memory that the disk does not have: at start it finds every stored folder without the mark (an agent that crashed,
a network that was down) and sends it, oldest first. A network error or a 5xx waits with backoff and tries again;
the manager's 200 for what it already has makes a retry harmless; a refusal (400/401/403/404/413, 409 for other
bytes under the same id) is reported once as an ``evidence_upload_failed`` or ``sample_upload_failed`` event and
the folder is not tried again (marked ``upload_refused``). A store's own bound may delete a folder before it is
sent: skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UploadRefused
from ..forms.evidence import CLIP_NAMES, CONTENT_TYPES, EVENT_ID, EVIDENCE_FILES, SNAPSHOT_NAME
from ..forms.samples import SAMPLE_FRAME_NAME, SAMPLE_META_NAME, upload_document
from ..link.vocabulary import EventKind
from ..pipeline.evidence import META_NAME
from ..util.backoff import EQUAL_JITTER, Backoff
from ..util.fs import atomic_write_bytes

log = logging.getLogger(__name__)

#: the mark of an event whose snapshot and clip the manager has
UPLOADED_MARK = "uploaded"
#: the mark of an event the manager refused (not tried again)
REFUSED_MARK = "upload_refused"
#: what an event's folder may hold, in upload order (the snapshot first: the dashboard shows it while the clip
#: travels; the clip is MP4 or MJPEG)
FILES = tuple((name, CONTENT_TYPES[name]) for name in EVIDENCE_FILES)
#: seconds one request may take (a clip of a few MiB on a slow uplink)
REQUEST_TIMEOUT_S = 60.0
#: folders waiting at most (the oldest beyond it wait for the next start's scan)
MAX_QUEUE = 1000

EmitFn = Callable[..., None]


@dataclass(frozen=True)
class Kind:
    """One kind of folder the device uploads: the file that makes it whole (written last; a store keeps its
    folders at ``*/`` or, a stream's, ``*/*/``), how one is sent, and how a refusal is reported."""

    name: str
    meta_name: str
    send: Callable[[DeviceUploader, Path], bool]
    refused_event: EventKind
    #: the refusal event's key for the folder's id
    id_key: str


class DeviceUploader:
    """Sends each event's evidence and each sample to the fleet manager, in order, surviving cuts and
    restarts."""

    def __init__(self, manager_url: str, device_id: str, *, credentials: tuple[str, str] | None,
                 cafile: str | None = None, emit: EmitFn | None = None,
                 backoff: Backoff | None = None, client_cert: tuple[str, str] | None = None) -> None:
        self.base = manager_url.rstrip("/")
        self.device_id = device_id
        self.http = DeviceHTTP(credentials, cafile, client_cert)
        self._emit = emit
        self._backoff = backoff or Backoff(initial_s=1.0, max_s=60.0, jitter=EQUAL_JITTER)
        self._queue: deque[tuple[str | None, Path, Kind]] = deque()
        self._known: set[Path] = set()
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: folders sent, refused, and retries after a failure
        self.sent = self.refused = self.retries = 0

    # -- feeding -----------------------------------------------------------------------------------
    def enqueue(self, event: dict, pipeline: str | None = None) -> None:
        """An event a pipeline recorded (its ``clip`` path names the folder); ignored without evidence."""
        clip = event.get("clip")
        if clip:
            self._add(pipeline, Path(clip).parent, EVIDENCE)

    def enqueue_sample(self, sample: dict, pipeline: str | None = None) -> None:
        """A sample a pipeline wrote (a sampler's listener's ``info``: its ``folder``); ignored else."""
        folder = sample.get("folder")
        if folder:
            self._add(pipeline, Path(folder), SAMPLES)

    def scan(self, folders: Iterable[tuple[str | None, Path]], kind: Kind | None = None) -> int:
        """Queue every stored folder of ``kind`` (events: the default) under ``folders`` (``(pipeline, store
        folder)``) not yet sent, oldest first; the stream folders of a multi-stream pipeline too. Returns how many
        were queued."""
        kind = kind or EVIDENCE
        found: list[tuple[str, str | None, Path]] = []
        for pipeline, root in folders:
            for meta in [m for pattern in ("*/", "*/*/") for m in sorted(Path(root).glob(pattern + kind.meta_name))]:
                folder = meta.parent
                if EVENT_ID.match(folder.name) and not _marked(folder):
                    found.append((folder.name, pipeline, folder))
        for _name, pipeline, folder in sorted(found, key=lambda item: item[0]):
            self._add(pipeline, folder, kind)
        return len(found)

    def _add(self, pipeline: str | None, folder: Path, kind: Kind) -> None:
        with self._wake:
            if folder in self._known or len(self._queue) >= MAX_QUEUE:
                return
            self._known.add(folder)
            self._queue.append((pipeline, folder, kind))
            self._wake.notify()

    @property
    def pending(self) -> int:
        with self._wake:
            return len(self._queue)

    # -- the thread --------------------------------------------------------------------------------
    def start(self) -> DeviceUploader:
        self._thread = threading.Thread(target=self._run, name="edgeinfer-device-upload", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop sending (what is unsent stays on disk, unmarked: the next start sends it)."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _next(self) -> tuple[str | None, Path, Kind] | None:
        with self._wake:
            while not self._queue and not self._stop.is_set():
                self._wake.wait(1.0)
            return self._queue[0] if self._queue else None

    def _done(self, folder: Path) -> None:
        with self._wake:
            if self._queue and self._queue[0][1] == folder:
                self._queue.popleft()
            self._known.discard(folder)

    def _run(self) -> None:
        import http.client  # here, not at import: an agent that uploads nothing never loads http or email
        import urllib.error

        attempt = 0
        while not self._stop.is_set():
            item = self._next()
            if item is None:
                continue
            pipeline, folder, kind = item
            try:
                if kind.send(self, folder):
                    atomic_write_bytes(folder / UPLOADED_MARK, json.dumps({"at": time.time()}).encode())
                    self.sent += 1
            except UploadRefused as exc:
                self._refused(pipeline, folder, kind, exc)
            except (OSError, http.client.HTTPException, urllib.error.URLError) as exc:
                if not folder.is_dir():  # the store's bound took it meanwhile
                    self._done(folder)
                    continue
                attempt += 1
                self.retries += 1
                delay = self._backoff.delay(attempt)
                log.info("%s %s not sent (%s); again in %.1f s", kind.name, folder.name, exc, delay)
                self._stop.wait(delay)
                continue
            attempt = 0
            self._done(folder)

    def _refused(self, pipeline: str | None, folder: Path, kind: Kind, exc: UploadRefused) -> None:
        self.refused += 1
        with contextlib.suppress(OSError):
            atomic_write_bytes(folder / REFUSED_MARK, json.dumps({"status": exc.status, "error": str(exc)}).encode())
        self._done(folder)
        log.warning("%s %s refused by the fleet manager: %s", kind.name, folder.name, exc)
        if self._emit is not None:
            self._emit(kind.refused_event, "warning",
                       f"the fleet manager refused the {kind.name} {folder.name}: {exc}", pipeline=pipeline,
                       data={kind.id_key: folder.name, "status": exc.status, "error": str(exc)[:500]})

    # -- one folder --------------------------------------------------------------------------------
    def upload(self, folder: Path) -> bool:
        """PUT an event's files (the snapshot first). False when the folder is gone (nothing to send)."""
        if not (folder / META_NAME).is_file():
            return False
        present = [(name, kind) for name, kind in FILES if (folder / name).is_file()]
        if not any(name == SNAPSHOT_NAME for name, _ in present) or not any(n in CLIP_NAMES for n, _ in present):
            return False  # deleted by the store's bound while we were at it
        for name, content_type in present:
            path = folder / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return False
            with open(path, "rb") as body:
                self._put(self.url_of(folder.name, name), body, size, content_type)
        return True

    def upload_sample(self, folder: Path) -> bool:
        """PUT a sample as one JSON document. False when the folder is gone (the store's bound)."""
        try:
            meta = json.loads((folder / SAMPLE_META_NAME).read_bytes())
            jpeg = (folder / SAMPLE_FRAME_NAME).read_bytes()
        except FileNotFoundError:
            return False
        except ValueError as exc:  # a sample.json this agent did not write whole: nothing to retry
            raise UploadRefused(0, f"unreadable {SAMPLE_META_NAME}: {exc}") from None
        body = json.dumps(upload_document(meta, jpeg)).encode("utf-8")
        device = urllib.parse.quote(self.device_id, safe="")
        self._put(f"{self.base}/api/devices/{device}/samples/{folder.name}", body, len(body), "application/json")
        return True

    def url_of(self, event_id: str, name: str) -> str:
        device = urllib.parse.quote(self.device_id, safe="")
        return f"{self.base}/api/devices/{device}/events/{event_id}/{name}"

    def _put(self, url: str, body: Any, size: int, content_type: str) -> None:
        import urllib.error

        headers = {"Content-Type": content_type, "Content-Length": str(size)}
        try:
            self.http.send("PUT", url, body, headers, timeout=REQUEST_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            detail = _detail(exc)
            if exc.code >= 500 or exc.code in (408, 429):
                raise OSError(f"HTTP {exc.code}: {detail}") from None
            raise UploadRefused(exc.code, detail) from None


#: an event's evidence (pipeline/evidence.py), a sample (pipeline/sampling.py)
EVIDENCE = Kind("evidence of event", META_NAME, DeviceUploader.upload, EventKind.EVIDENCE_UPLOAD_FAILED, "event_id")
SAMPLES = Kind("sample", SAMPLE_META_NAME, DeviceUploader.upload_sample, EventKind.SAMPLE_UPLOAD_FAILED,
               "sample_id")


class DeviceHTTP:
    """The device's one HTTP client to the fleet manager: its Basic credential (the MQTT user name and password,
    as artifact downloads use) or its client certificate, and the CA it trusts; urllib, imported at the first
    request. Evidence uploads and the live view's frames go through it.

    A renewal replaces the certificate file (atomically, agent/provisioning.py) while this client lives as long
    as the agent: each request looks at the file (one ``stat``) and loads a changed certificate, so the renewed
    one is presented from the next request on — the old one expires later, and the manager refuses it then."""

    def __init__(self, credentials: tuple[str, str] | None, cafile: str | None = None,
                 client_cert: tuple[str, str] | None = None) -> None:
        self._headers: dict[str, str] = {}
        if credentials is not None:
            from ..updates.download import basic_auth

            self._headers = basic_auth(*credentials)
        self._cafile = cafile
        self._client_cert = client_cert
        self._lock = threading.Lock()
        self._loaded: tuple[int, int, int] | None = None  # the certificate file the context holds (inode, mtime, size)
        self._context = None
        if cafile or client_cert:
            self._context = self._load()

    def _cert_file_now(self) -> tuple[int, int, int] | None:
        if self._client_cert is None:
            return None
        try:
            found = Path(self._client_cert[0]).stat()
        except OSError:
            return None
        return found.st_ino, found.st_mtime_ns, found.st_size

    def _load(self) -> Any:
        from ..updates.download import https_context

        self._loaded = self._cert_file_now()
        return https_context(self._cafile, self._client_cert)

    def _current_context(self) -> Any:
        """The TLS context, its certificate loaded again when the file changed since (a renewal)."""
        if self._client_cert is not None and self._cert_file_now() != self._loaded:
            with self._lock:
                if self._cert_file_now() != self._loaded:
                    self._context = self._load()
                    log.info("presenting the renewed device certificate %s to the fleet manager", self._client_cert[0])
        return self._context

    @classmethod
    def of(cls, config: Any) -> DeviceHTTP:
        """The client of an ``AgentConfig``: the device's MQTT credential and CA also open the fleet manager."""
        mqtt = config.mqtt
        return cls((mqtt.username, mqtt.password or "") if mqtt.username else None, mqtt.ca,
                   (mqtt.cert, mqtt.key) if mqtt.cert and mqtt.key else None)

    def send(self, method: str, url: str, body: Any, headers: dict[str, str], *, timeout: float) -> int:
        """One request with the credential; its status. ``urllib.error.HTTPError`` for a 4xx/5xx answer
        (``OSError`` and ``http.client.HTTPException`` for the network's failures)."""
        import urllib.request

        request = urllib.request.Request(url, data=body, method=method, headers={**self._headers, **headers})
        with urllib.request.urlopen(request, timeout=timeout, context=self._current_context()) as answer:
            answer.read()
            return int(answer.status)


def start_uploader(config: Any, emit: EmitFn | None) -> DeviceUploader | None:
    """The agent's uploader (an ``AgentConfig`` with ``manager_url`` and a pipeline with event rules or capture
    rules), started, with what an earlier run left unsent queued; None when there is nothing to upload."""
    events = [(p.name, Path(p.evidence_dir)) for p in config.pipelines if p.events and p.evidence_dir]
    samples = [(p.name, Path(p.samples_dir)) for p in config.pipelines if p.sample and p.samples_dir]
    if config.manager_url is None or not (events or samples):
        return None
    mqtt = config.mqtt  # the device's credential and CA also open the fleet manager, as for artifacts
    uploader = DeviceUploader(config.manager_url, config.device_id, emit=emit, cafile=mqtt.ca,
                              client_cert=(mqtt.cert, mqtt.key) if mqtt.cert and mqtt.key else None,
                              credentials=(mqtt.username, mqtt.password or "") if mqtt.username else None)
    queued = uploader.scan(events, EVIDENCE) + uploader.scan(samples, SAMPLES)
    if queued:
        log.info("%d event(s) and sample(s) of an earlier run still to upload", queued)
    return uploader.start()


def _marked(folder: Path) -> bool:
    return (folder / UPLOADED_MARK).exists() or (folder / REFUSED_MARK).exists()


def _detail(error: Any) -> str:
    """What the manager's JSON answer to a refused request says (an ``HTTPError``)."""
    try:
        body: Any = json.loads(error.read() or b"{}")
        return str(body.get("error") or body.get("detail") or error.reason)[:300]
    except (ValueError, OSError, AttributeError):
        return str(error.reason)[:300]
