"""A test delegate that stands in for an accelerator this machine lacks: real LiteRT underneath, and a
device that fails, hangs or disappears on command.

It is registered the way a third-party delegate is, through the ``edgeinfer.delegates`` entry
point (:func:`install_entry_point` writes a dist-info folder onto a path), and is named ``flaky``.
Its failure is the text libedgetpu gives through LiteRT when a Coral drops off the USB bus, mapped by
the same ``map_litert_errors`` the Coral engine uses — so the pipeline sees what it would see on a Pi.

Commands come from :data:`CONTROL` (in-process) or, in another process, from the file named by
``$EDGEINFER_FLAKY_CONTROL``: ``ok``, ``fail``, ``hang``, ``gone`` (unplugged: loads fail too),
optionally ``after N`` (``fail after 30``: the 31st invoke from the command on fails).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from edgeinfer import Delegate
from edgeinfer.runtime.delegates.coral import EDGETPU_DEVICE_ERRORS
from edgeinfer.runtime.delegates.xnnpack import XnnpackDelegate, map_litert_errors
from edgeinfer.runtime.engine import Engine

CONTROL_ENV = "EDGEINFER_FLAKY_CONTROL"
#: what libedgetpu says through LiteRT's invoke when the USB accelerator is unplugged mid-run
UNPLUGGED_TEXT = ("Node number 3 (EdgeTpuDelegateForCustomOp) failed to invoke.\n"
                  "Not found: USB transfer error 2 [LibUsbDataOutCallback]")
MODES = ("ok", "fail", "hang", "gone")


class FlakyControl:
    """The device's state: what the next invokes do, and counters a test can read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.mode = "ok"
        self.after = 0  # invokes that still succeed before the mode applies
        self.invokes = 0
        self.failures = 0
        self.hangs = 0
        self._file_stamp: tuple[float, int] | None = None

    def set(self, mode: str, after: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(mode)
        with self._changed:
            self.mode, self.after = mode, after
            self._changed.notify_all()

    def _read_file(self) -> None:
        path = os.environ.get(CONTROL_ENV)
        if not path:
            return
        try:
            stat = os.stat(path)
            stamp = (stat.st_mtime, stat.st_size)
            if stamp == self._file_stamp:
                return
            words = Path(path).read_text().split()
        except OSError:
            return
        self._file_stamp = stamp
        mode = words[0] if words and words[0] in MODES else "ok"
        after = int(words[2]) if len(words) == 3 and words[1] == "after" and words[2].isdigit() else 0
        self.set(mode, after)

    def current(self) -> str:
        """The mode for this invoke (counting it)."""
        self._read_file()
        with self._lock:
            self.invokes += 1
            if self.after > 0:
                self.after -= 1
                return "ok"
            return self.mode

    def hang(self) -> None:
        """Block like a native call that never returns, until the device is told to be ``ok`` again."""
        with self._changed:
            self.hangs += 1
        while True:
            self._read_file()
            with self._changed:
                if self.mode != "hang":
                    return
                self._changed.wait(0.05)

    def unplugged(self) -> bool:
        self._read_file()
        return self.mode == "gone"


CONTROL = FlakyControl()


class FlakyEngine(Engine):
    """A real LiteRT engine whose invoke obeys :data:`CONTROL`."""

    delegate = "flaky"

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner.model, threads=inner.threads)
        self._inner = inner
        self._inputs, self._outputs = inner.inputs, inner.outputs
        self._input_arrays = [inner.input_view(i) for i in range(len(inner.inputs))]
        self._output_arrays = [inner.output_view(i) for i in range(len(inner.outputs))]

    def _invoke(self) -> None:
        mode = CONTROL.current()
        if mode in ("fail", "gone"):
            CONTROL.failures += 1
            with map_litert_errors(self.model, "invoke", delegate=self.delegate, device_errors=EDGETPU_DEVICE_ERRORS):
                raise RuntimeError(UNPLUGGED_TEXT)
        if mode == "hang":
            CONTROL.hang()
        self._inner.invoke()

    def _close(self) -> None:
        self._inner.close()


class FlakyDelegate(Delegate):
    """``flaky``: XNNPACK underneath, a device that comes and goes on command."""

    name = "flaky"
    formats = XnnpackDelegate.formats

    def unavailable_reason(self, device=None, host=None):
        return "the test accelerator is unplugged" if CONTROL.unplugged() else None

    def load(self, model, *, threads=None, device=None):
        from edgeinfer.errors import DelegateUnavailable

        if CONTROL.unplugged():
            raise DelegateUnavailable(self.name, "the test accelerator is unplugged")
        return FlakyEngine(XnnpackDelegate().load(model, threads=threads, device=device))


def install_entry_point(site: Path) -> Path:
    """Write the dist-info that registers ``flaky`` in the ``edgeinfer.delegates`` group under ``site``."""
    info = site / "flakydelegate-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flakydelegate\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[edgeinfer.delegates]\nflaky = support.flaky_delegate:FlakyDelegate\n")
    return site
