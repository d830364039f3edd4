"""``coral``: LiteRT with the Coral Edge TPU delegate (``libedgetpu.so.1``), device ``usb[:N]`` / ``pci[:N]``.

Written against Coral's documented API (``load_delegate("libedgetpu.so.1", {"device": "usb:0"})``);
not yet run on a TPU — see docs/hardware.md. Without a usable TPU, an ``*_edgetpu.tflite`` model
falls back to its CPU twin (the same file name without ``_edgetpu``, in the same folder) on
``xnnpack``, and ``engine.fallback_reason`` says why — unless the caller asked for strict mode.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import DelegateUnavailable
from ...util.native import captured_native_stderr
from ..engine import Engine
from ..model import ModelFormat, ModelInfo
from .base import Delegate
from .xnnpack import LiteRTEngine, XnnpackDelegate, import_litert, litert_missing_reason, make_interpreter

if TYPE_CHECKING:
    from ...device.host import Host

#: Coral USB Accelerator before (Global Unichip) and after (Google) its firmware is loaded
CORAL_USB_IDS = ("1a6e:089a", "18d1:9302")
#: Coral M.2 / Mini PCIe accelerator (the apex chip)
CORAL_PCI_IDS = ("1ac1:089a",)
EDGETPU_LIBRARY = "libedgetpu.so.1"
#: the file-name pattern of libedgetpu under a root (libedgetpu.so.1 -> libedgetpu.so.1.0)
EDGETPU_LIBRARY_GLOB = "libedgetpu.so.1*"
INSTALL_HINT = ("install libedgetpu1-std from Coral's apt repository (firmware_scripts/setup-pi.sh on a Raspberry Pi; "
                "`edgeinfer doctor` prints the commands)")
_DEVICE = re.compile(r"^(usb|pci)(?::(\d+))?$")
_EDGETPU_SUFFIX = re.compile(r"_edgetpu(?=\.tflite$)")


def parse_device(device: str | None) -> tuple[str | None, int | None]:
    """``"usb:1"`` -> ``("usb", 1)``, ``"pci"`` -> ``("pci", None)``, None -> any TPU."""
    if not device:
        return None, None
    found = _DEVICE.match(device.strip().lower())
    if not found:
        raise ValueError(f"coral device {device!r} is not usb, usb:N, pci or pci:N")
    return found.group(1), (int(found.group(2)) if found.group(2) is not None else None)


def cpu_twin_path(model_path: str | Path) -> Path | None:
    """The CPU build of an Edge TPU model: ``x_edgetpu.tflite`` -> ``x.tflite`` beside it, if it exists."""
    path = Path(model_path)
    twin_name = _EDGETPU_SUFFIX.sub("", path.name)
    if twin_name == path.name:
        return None
    twin = path.with_name(twin_name)
    return twin if twin.is_file() else None


def twin_fallback_reason(model: ModelInfo, twin: str | Path, reason: str, spec: str = "coral") -> str:
    """The sentence recorded on the engine when the CPU twin runs instead of the Edge TPU model."""
    return (f"{spec}: {reason} — running the CPU twin {Path(twin).name} on xnnpack instead of "
            f"{Path(model.path).name}")


def library_problem(host: Host | None = None) -> str | None:
    """Why libedgetpu cannot be used, or None.

    On a live system this is a real ``ctypes`` check: ``find_library`` then ``CDLL``. It must run
    before LiteRT's ``load_delegate``, whose ``Delegate.__del__`` prints a traceback to stderr when
    the library fails to load. For a detected root (tests, ``--root``) the library file is looked
    for under that root instead.
    """
    if host is not None and not host.live:
        if host.find_library(EDGETPU_LIBRARY_GLOB):
            return None
        searched = ", ".join(host.library_dirs()) or "no library directory exists"
        return f"{EDGETPU_LIBRARY} not found under {host.root} (searched {searched}) — {INSTALL_HINT}"
    import ctypes
    import ctypes.util

    found = ctypes.util.find_library("edgetpu")
    try:
        ctypes.CDLL(found or EDGETPU_LIBRARY)
    except OSError as exc:
        if found is None and "No such file" in str(exc):
            return f"{EDGETPU_LIBRARY} not found — {INSTALL_HINT}"
        return f"{found or EDGETPU_LIBRARY} does not load ({exc}) — {INSTALL_HINT}"
    return None


def tpu_problem(device: str | None, host: Host) -> str | None:
    """Why no Edge TPU matching ``device`` is present on ``host``, or None."""
    kind, index = parse_device(device)
    usb = host.usb_devices(CORAL_USB_IDS)
    apex = host.glob("/dev/apex_*")
    ids = " / ".join(CORAL_USB_IDS)
    if kind == "usb":
        if len(usb) > (index or 0):
            return None
        which = f"#{index} " if index else ""
        return (f"no Coral USB Accelerator {which}found (USB id {ids} not in /sys/bus/usb/devices, "
                f"{len(usb)} present) — plug it in, preferably into a USB 3 port")
    if kind == "pci":
        node = f"/dev/apex_{index or 0}"
        if host.exists(node):
            return None
        if host.pci_ids & set(CORAL_PCI_IDS):
            return (f"a Coral PCIe/M.2 accelerator is on the PCI bus but {node} is missing: the gasket/apex driver "
                    "is not loaded — install gasket-dkms (or build github.com/google/gasket-driver) and "
                    "`sudo modprobe apex`")
        return f"no Coral PCIe/M.2 accelerator found ({node} missing, no PCI device {CORAL_PCI_IDS[0]})"
    if usb or apex:
        return None
    return f"no Coral Edge TPU found (no USB device {ids}, no /dev/apex_*)"


#: what libedgetpu says through LiteRT's invoke when the TPU is unplugged, resets or stops answering
#: (its USB driver's transfer errors, "Deadline exceeded", the custom op's failed invoke)
EDGETPU_DEVICE_ERRORS = re.compile(
    r"USB transfer error|LibUsb|Deadline exceeded|EdgeTpuDelegateForCustomOp|edgetpu-custom-op.*failed"
    r"|Failed to (?:open|get) (?:the )?(?:edge ?tpu|device)|apex|No such device", re.IGNORECASE)


class CoralEngine(LiteRTEngine):
    """A LiteRT engine that also owns the Edge TPU delegate; the interpreter is dropped first."""

    device_errors = EDGETPU_DEVICE_ERRORS

    def __init__(self, model: ModelInfo, interpreter, tpu_delegate, *, threads: int | None,
                 device: str | None) -> None:
        self._tpu_delegate = tpu_delegate
        super().__init__(model, interpreter, delegate="coral", threads=threads, device=device)

    def _close(self) -> None:
        super()._close()  # the interpreter uses the delegate, so it goes first
        self._tpu_delegate = None


class CoralDelegate(Delegate):
    """The Coral Edge TPU through LiteRT's external-delegate API."""

    name = "coral"
    formats = frozenset({ModelFormat.EDGETPU_TFLITE})
    extra = "coral"
    packages = ("tflite-runtime", "ai-edge-litert", "pycoral")

    def unavailable_reason(self, device: str | None = None, host: Host | None = None) -> str | None:
        reason = litert_missing_reason()
        if reason:
            return reason
        try:
            parse_device(device)
        except ValueError as exc:
            return str(exc)
        if host is None:
            from ...device.host import probe_host

            host = probe_host("/")
        problems = [p for p in (library_problem(host), tpu_problem(device, host)) if p]
        return "; ".join(problems) or None

    def unsupported_reason(self, model: ModelInfo) -> str | None:
        if model.format is ModelFormat.TFLITE:
            return (f"{Path(model.path).name} is not compiled for the Edge TPU — compile it with edgetpu_compiler "
                    "(a *_edgetpu.tflite), or run it on xnnpack")
        return super().unsupported_reason(model)

    def load(self, model: ModelInfo, *, threads: int | None = None, device: str | None = None,
             cpu_fallback: bool = True) -> Engine:
        """Load on the TPU; with ``cpu_fallback`` an Edge TPU model without a TPU runs its CPU twin."""
        unsupported = self.unsupported_reason(model)
        if unsupported:
            raise DelegateUnavailable(self.name, unsupported)
        parse_device(device)  # a malformed device is the caller's error (ValueError)
        reason = self.unavailable_reason(device)
        if reason is None:
            try:
                return self._load_on_tpu(model, threads=threads, device=device)
            except DelegateUnavailable as exc:
                reason = exc.reason
        if cpu_fallback:
            return load_cpu_twin(model, reason, threads=threads, spec=f"coral:{device}" if device else "coral")
        raise DelegateUnavailable(self.name, reason)

    def _load_on_tpu(self, model: ModelInfo, *, threads: int | None, device: str | None) -> Engine:
        litert = import_litert()
        options = {"device": device} if device else {}
        failure: BaseException | None = None
        with captured_native_stderr("libedgetpu"):
            try:
                tpu_delegate = litert.load_delegate(EDGETPU_LIBRARY, options)
            except (ValueError, OSError, RuntimeError) as exc:
                # Drop the traceback now, while stderr is captured: it holds the half-built
                # Delegate, whose __del__ would otherwise run (and print) later.
                failure = exc.with_traceback(None)
        if failure is not None:
            detail = " ".join(str(failure).split()) or type(failure).__name__
            raise DelegateUnavailable(
                self.name, f"libedgetpu could not open the Edge TPU{' ' + device if device else ''}: {detail} — "
                "check the cable / seating and the device permissions (`edgeinfer doctor` says which)",
            )
        interpreter = make_interpreter(model, threads=threads, delegates=[tpu_delegate])
        return CoralEngine(model, interpreter, tpu_delegate, threads=threads, device=device)


def load_cpu_twin(model: ModelInfo, reason: str, *, threads: int | None = None, spec: str = "coral") -> Engine:
    """Run the CPU twin of an Edge TPU model on xnnpack, recording ``reason`` on the engine."""
    from ..model import inspect_model

    twin = cpu_twin_path(model.path) if model.is_edgetpu else None
    if twin is None:
        expected = _EDGETPU_SUFFIX.sub("", Path(model.path).name)
        raise DelegateUnavailable(
            "coral", f"{reason}; and there is no CPU twin {expected} beside {model.path} to fall back to",
        )
    engine = XnnpackDelegate().load(inspect_model(twin), threads=threads)
    engine.fallback_reason = twin_fallback_reason(model, twin, reason, spec)
    return engine
