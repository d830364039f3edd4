"""Content-addressed artifact storage (by sha256): copied in, or streamed in from an upload.

Serving, with Range requests, is Starlette's ``FileResponse`` (``api/artifacts.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

from ..util.fs import atomic_write_bytes, copy_atomically, replace_durably, sha256_file, temp_path_for

#: raised (a built-in) when an upload passes its size limit
UploadTooLarge = OverflowError


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

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        """Store ``data`` (a configuration document) once by its sha256 (atomically; readable by this user only: it
        may hold secrets); (sha256, size)."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.path_for(digest)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data, mode=0o600)
        return digest, len(data)

    async def receive(self, chunks: AsyncIterator[bytes], *, expected: int, max_bytes: int) -> tuple[str, int]:
        """Stream an upload of ``expected`` bytes into the store, hashing as it goes; (sha256, size).

        Nothing is kept on failure: ValueError when the body is cut short or longer than announced,
        UploadTooLarge past ``max_bytes``; the temporary file is removed whatever happens.
        """
        temp = temp_path_for(self.root / "upload")
        digest, size = hashlib.sha256(), 0
        try:
            with open(temp, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise UploadTooLarge(f"the upload passed the {max_bytes}-byte limit")
                    if size > expected:
                        raise ValueError(f"the body is longer than its Content-Length ({expected} bytes)")
                    digest.update(chunk)
                    out.write(chunk)
            if size != expected:
                raise ValueError(f"the upload was cut short: {size} of {expected} bytes")
            sha256 = digest.hexdigest()
            target = self.path_for(sha256)
            if target.exists():
                return sha256, size
            target.parent.mkdir(parents=True, exist_ok=True)
            replace_durably(temp, target)
            return sha256, size
        finally:
            temp.unlink(missing_ok=True)

    def get(self, sha256: str) -> Path | None:
        try:
            path = self.path_for(sha256)
        except ValueError:
            return None
        return path if path.is_file() else None
