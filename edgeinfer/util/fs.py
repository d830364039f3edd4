"""Files that are either whole or absent: one atomic-write helper, sha256 of a file, and where caches go.

Every file edgeinfer writes for later (model slots, their state file, downloaded artifacts, engine
caches, optimised models, charts, clips) goes through :func:`atomic_path`: the data is written to a
hidden temporary file beside the target, flushed to disk, renamed over the target (atomic on
POSIX), and the folder is flushed so the rename itself survives a power cut. A reader sees the old
file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

#: bytes read at a time when hashing
HASH_CHUNK = 1 << 20
#: where edgeinfer keeps what it can make again (built TensorRT engines, the delegate probe's choices)
CACHE_DIR_ENV = "EDGEINFER_CACHE_DIR"
#: numbers the temporary files of this process, so two threads writing one target never share one
_temp_numbers = itertools.count()


def default_cache_dir() -> Path:
    """``$EDGEINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgeinfer``, else ``~/.cache/edgeinfer``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeinfer"


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename in it) to disk; a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_durably(temp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Flush ``temp`` to disk, rename it over ``final`` and flush the folder."""
    with open(temp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temp, final)
    fsync_dir(Path(final).parent)


def temp_path_for(final: str | os.PathLike) -> Path:
    """A hidden temporary name beside ``final``, unique to this call, keeping its suffix (writers such
    as OpenCV's pick the container by it)."""
    final = Path(final)
    return final.with_name(f".{final.stem}.{os.getpid()}-{next(_temp_numbers)}.tmp{final.suffix}")


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, *, temp: str | os.PathLike | None = None) -> Iterator[Path]:
    """A temporary path to write ``final``'s content to; on success it replaces ``final`` durably.

    On an exception the temporary file is removed and ``final`` is left as it was. The folder is
    created if needed. ``temp`` names the temporary file when a writer decides it (OpenVINO writes
    an IR's .bin beside its .xml, under the .xml's temporary stem).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(temp) if temp is not None else temp_path_for(final)
    try:
        yield temp
        replace_durably(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically and durably; ``mode`` (e.g. 0o600 for a secret) is the file's
    from its creation, so its content is never readable by others, not even half-written."""
    with atomic_path(path) as temp:
        if mode is None:
            temp.write_bytes(data)
            return
        with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as out:
            out.write(data)
        os.chmod(temp, mode)  # the umask may have taken bits off what os.open was asked for


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically and durably."""
    atomic_write_bytes(path, text.encode("utf-8"))


def copy_atomically(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy ``source`` to ``target`` atomically and durably, without loading it into memory."""
    import shutil

    with atomic_path(target) as temp:
        shutil.copyfile(source, temp)


def sha256_file(path: str | os.PathLike, *extra: str | os.PathLike) -> str:
    """sha256 of a file (and of further files appended, for OpenVINO IR's .xml + .bin)."""
    digest = hashlib.sha256()
    for part in (path, *extra):
        with open(part, "rb") as handle:
            for chunk in iter(lambda h=handle: h.read(HASH_CHUNK), b""):
                digest.update(chunk)
    return digest.hexdigest()


def remove_record(folder: str | os.PathLike, marker: str) -> None:
    """Delete a record's folder (an event's evidence, a sample) whose ``marker`` file, written last,
    makes it whole: the marker goes first, so a crash midway leaves a partial folder, never a listed one."""
    import shutil

    folder = Path(folder)
    with contextlib.suppress(OSError):
        (folder / marker).unlink()
    if folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            folder.unlink()
