"""Files that are either whole or absent: one atomic-write helper, sha256 of a file, and where caches go.

Every file edgeinfer writes for later (model slots, their state file, downloaded artifacts, engine
caches, optimised models, charts, clips) goes through :func:`atomic_path`: the data is written to a
hidden temporary file beside the target, flushed to disk, renamed over the target (atomic on
POSIX), and the folder is flushed so the rename itself survives a power cut. A reader sees the old
file or the new one, never half of one. :func:`atomic_write_files` writes several small files of one folder
(a device's identity) the same way, with one flush of the folder for all of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterator, Sequence
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
    return Path(_temp_name(os.fspath(final)))


def _temp_name(final: str) -> str:
    """:func:`temp_path_for` on a string (no pathlib: the identity's writes are many and small)."""
    folder, name = os.path.split(final)
    stem, dot, suffix = name.rpartition(".")
    stem, suffix = (stem, dot + suffix) if stem and suffix else (name, "")  # pathlib's stem and suffix
    return os.path.join(folder, f".{stem}.{os.getpid()}-{next(_temp_numbers)}.tmp{suffix}")


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
    folder, name = os.path.split(os.fspath(path))
    atomic_write_files(folder or ".", [(name, data, mode)])


def atomic_write_files(folder: str | os.PathLike, files: Sequence[tuple[str, bytes, int | None]]) -> None:
    """Write ``files`` ((name, data, mode) in ``folder``, created if needed) atomically and durably, with one flush
    of the folder: each is written to its temporary file and flushed to disk, then all are renamed over their
    targets, in order, then the folder is flushed. After a power cut each file is whole, old or new — but which
    renames reached the disk before the folder's flush is not said, so a file whose presence vouches for others
    (written last) goes in a call of its own, after theirs. ``mode`` None: the umask's (as ``open()``); else that
    mode from the file's creation (a key is never readable by others, not even half-written)."""
    # plain os calls on strings, no pathlib or context managers: a simulator writes thousands of identities
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    temps: list[str] = []
    try:
        for name, data, mode in files:
            temp = _temp_name(os.path.join(folder, name))
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else mode)
            temps.append(temp)
            try:
                if mode is not None:
                    os.fchmod(fd, mode)  # the umask may have taken bits off what os.open was asked for
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        for (name, _, _), temp in zip(files, temps):
            os.replace(temp, os.path.join(folder, name))
        temps.clear()
    finally:
        for temp in temps:  # a write failed: the targets are as they were, and no temporary is left
            with contextlib.suppress(OSError):
                os.unlink(temp)
    fsync_dir(folder)


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
