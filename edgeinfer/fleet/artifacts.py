"""Content-addressed artifact storage (by sha256) and serving with HTTP Range requests."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .._fs import copy_atomically, sha256_file

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class ArtifactStore:
    """Model files kept once per sha256 under ``root``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"not a sha256: {sha256!r}")
        return self.root / sha256[:2] / sha256

    def put(self, source: str | os.PathLike) -> tuple[str, int]:
        """Copy ``source`` into the store (atomically); return (sha256, size)."""
        digest = sha256_file(source)
        target = self.path_for(digest)
        if not target.exists():  # two uploads of one artifact each write their own temporary file
            copy_atomically(source, target)
        return digest, target.stat().st_size

    def get(self, sha256: str) -> Path | None:
        try:
            path = self.path_for(sha256)
        except ValueError:
            return None
        return path if path.is_file() else None


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """(start, end inclusive) for a single-range header; None for no/ignored header; 'invalid' for 416."""
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if not match:
        return None  # multi-range or another unit: serve the whole file (allowed by RFC 9110)
    first, last = match.groups()
    if first == "" and last == "":
        return "invalid"
    if first == "":
        length = int(last)
        if length == 0:
            return "invalid"
        return max(0, size - length), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        return "invalid"
    return start, end


def send_file(handler, path: Path, *, head: bool = False, content_type: str = "application/octet-stream") -> None:
    """Answer ``handler`` (a BaseHTTPRequestHandler) with ``path``, honouring a Range header."""
    size = path.stat().st_size
    wanted = parse_range(handler.headers.get("Range"), size)
    if wanted == "invalid":
        handler.send_response(416)
        handler.send_header("Content-Range", f"bytes */{size}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return
    start, end = wanted if isinstance(wanted, tuple) else (0, size - 1)
    handler.send_response(206 if isinstance(wanted, tuple) else 200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Accept-Ranges", "bytes")
    handler.send_header("Content-Length", str(end - start + 1))
    if isinstance(wanted, tuple):
        handler.send_header("Content-Range", f"bytes {start}-{end}/{size}")
    handler.end_headers()
    if head:
        return
    with open(path, "rb") as fh:
        fh.seek(start)
        remaining = end - start + 1
        while remaining > 0:
            chunk = fh.read(min(1 << 16, remaining))
            if not chunk:
                break
            handler.wfile.write(chunk)
            remaining -= len(chunk)
