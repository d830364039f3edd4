"""Resumable, verified downloads of model artifacts (HTTP Range), written atomically.

The bytes land in ``<dest>.part``, which a later call resumes; only a complete file whose sha256
matches is renamed to ``dest``.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DownloadError, UpdateRejected
from ..util.backoff import Backoff
from ..util.fs import replace_durably, sha256_file

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)
CHUNK = 1 << 16
DEFAULT_ATTEMPTS = 8
DEFAULT_TIMEOUT_S = 20.0
#: the longest wait between two tries that made no progress
MAX_RETRY_WAIT_S = 5.0
#: answers that end a download at once, with what they usually mean
REFUSALS = {
    401: " — the device's credential was refused (enrolled? revoked? see `edgeinfer fleet enroll`)",
    403: " — the device's credential may not read artifacts",
    404: " — the fleet manager does not have this artifact",
}


def basic_auth(username: str, password: str) -> dict[str, str]:
    """The Authorization header of HTTP Basic (how a device shows its MQTT credential to the fleet manager)."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    return {"Authorization": f"Basic {token}"}


def https_context(cafile: str | None, client_cert: tuple[str, str] | None = None) -> ssl.SSLContext:
    """A client context that verifies an https fleet manager against ``cafile`` (the fleet's CA) and, with
    ``client_cert`` (certificate and key files), presents the device's certificate. ``ssl`` is imported here: an
    agent on plain MQTT and HTTP never loads OpenSSL (edgeinfer/util/defer.py)."""
    import ssl

    context = ssl.create_default_context(cafile=cafile)
    if client_cert is not None:
        context.load_cert_chain(*client_cert)
    return context


def _announced_total(response, have: int) -> int | None:
    """The artifact's full size as the server states it (Content-Range total or Content-Length)."""
    if response.status == 206:
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def _fetch_into(url: str, part: Path, have: int, size: int, timeout: float,
                progress: Callable[[int], None] | None, headers: dict[str, str],
                context: ssl.SSLContext | None) -> None:
    """Append the bytes from ``have`` on to ``part``; restart from 0 if the server ignores Range."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers=headers | ({"Range": f"bytes={have}-"} if have else {}))
    try:
        response = urllib.request.urlopen(request, timeout=timeout, context=context)
    except urllib.error.HTTPError as exc:
        if exc.code in REFUSALS:  # asking again will not change the answer
            raise DownloadError(f"the server refused the download of {url}: HTTP {exc.code} {exc.reason}"
                                + REFUSALS[exc.code]) from None
        raise
    with response:
        total = _announced_total(response, have)
        if total is not None and total != size:
            raise UpdateRejected("size_mismatch", f"the server's artifact is {total} bytes, the manifest says {size}")
        mode = "ab" if have and response.status == 206 else "wb"
        with open(part, mode) as fh:
            received = have if mode == "ab" else 0
            while True:
                chunk = response.read(CHUNK)
                if not chunk:
                    break
                fh.write(chunk)
                received += len(chunk)
                if progress:
                    progress(received)
            fh.flush()
            os.fsync(fh.fileno())


def _retry_waits(backoff_s: float) -> Backoff | None:
    """Waits of ``backoff_s`` times 2 ** (tries in a row without progress), capped; None: no wait."""
    if backoff_s <= 0:
        return None
    return Backoff(initial_s=min(backoff_s, MAX_RETRY_WAIT_S), max_s=MAX_RETRY_WAIT_S, jitter=0.0)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def download(url: str, dest: str | os.PathLike, *, sha256: str, size: int, attempts: int = DEFAULT_ATTEMPTS,
             timeout: float = DEFAULT_TIMEOUT_S, backoff_s: float = 0.2,
             progress: Callable[[int], None] | None = None, headers: dict[str, str] | None = None,
             context: ssl.SSLContext | None = None) -> Path:
    """Download ``url`` to ``dest``, resuming a partial ``dest.part``; verify size and sha256.

    ``attempts`` counts consecutive tries that made no progress, so a connection cut many times
    still completes as long as each try moves forward; a refusal (401, 403, 404) ends it at once.
    ``headers`` go with every request (credentials: :func:`basic_auth`); ``context`` verifies an
    https server (the fleet's CA). On a verification failure the partial file
    is removed and UpdateRejected ('size_mismatch' / 'sha256_mismatch') is raised; ``dest`` only
    ever appears complete and verified (atomic rename).
    """
    # the HTTP client (http.client, email: ~2 MiB resident) is loaded by the first download, not by the agent
    import http.client
    import urllib.error

    target = Path(dest)
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    waits = _retry_waits(backoff_s)
    failures, last_error = 0, ""
    while True:
        have = _size(part)
        if have > size:  # a stale partial of some other artifact
            part.unlink()
            have = 0
        if have == size:
            break
        try:
            _fetch_into(url, part, have, size, timeout, progress, headers or {}, context)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
            log.info("download of %s interrupted at %d bytes: %s", url, have, last_error)
        now_have = _size(part)
        if now_have == size:
            break
        if now_have > size:
            part.unlink()
            raise UpdateRejected("size_mismatch", f"received more than the manifest's {size} bytes")
        failures = 0 if now_have > have else failures + 1
        if failures >= attempts:
            raise DownloadError(f"download of {url} stalled at {now_have}/{size} bytes after {attempts} tries"
                                f" ({last_error or 'server sent no more data'})")
        if waits is not None:
            time.sleep(waits.delay(failures + 1))  # delay(1) is the first, unmultiplied wait
    actual = sha256_file(part)
    if actual != sha256:
        part.unlink()
        raise UpdateRejected("sha256_mismatch", f"artifact sha256 is {actual}, the manifest says {sha256}")
    replace_durably(part, target)
    return target
