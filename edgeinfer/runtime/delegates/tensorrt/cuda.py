"""The few CUDA runtime calls the TensorRT engine needs, through ``ctypes`` (``libcudart``).

Reaching libcudart with ctypes means no extra Python package is needed: JetPack ships the
library, and on x86-64 pip TensorRT installs the ``nvidia-cuda-runtime`` wheel that holds it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

from ....errors import CudaError, DelegateUnavailable

if TYPE_CHECKING:
    from ....device.host import Host

CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so.10.2")
# cudaDeviceAttr values (CUDA runtime API, driver_types.h)
ATTR_INTEGRATED = 18
ATTR_CC_MAJOR = 75
ATTR_CC_MINOR = 76
HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped
DEVICE_MAP_HOST = 8  # cudaDeviceMapHost
HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
CUDA_ERROR_NAMES = {35: "cudaErrorInsufficientDriver", 100: "cudaErrorNoDevice", 999: "cudaErrorUnknown",
                    3: "cudaErrorInitializationError", 34: "cudaErrorStubLibrary"}


def _cudart_candidates() -> list[str]:
    import ctypes.util
    import importlib.util

    names = [n for n in (ctypes.util.find_library("cudart"),) if n] + list(CUDART_NAMES)
    try:  # the nvidia-cuda-runtime-cu12 wheel that pip TensorRT installs
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            names += sorted(str(p) for p in Path(folder, "lib").glob("libcudart.so*"))
    return list(dict.fromkeys(names))


class CudaRuntime:
    """libcudart opened with ctypes: each method is one CUDA runtime call; a failing call raises CudaError."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self._lib = lib
        self.path = path
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        lib.cudaGetErrorName.argtypes = [ctypes.c_int]
        for name in ("cudaMemcpyAsync",):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_void_p]
        lib.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_uint]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for name in ("cudaFreeHost", "cudaFree", "cudaStreamSynchronize", "cudaStreamDestroy"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]

    @classmethod
    def load(cls) -> CudaRuntime:
        """Open libcudart; DelegateUnavailable says which names were tried."""
        errors = []
        for name in _cudart_candidates():
            try:
                return cls(ctypes.CDLL(name), name)
            except OSError as exc:
                errors.append(str(exc))
        raise DelegateUnavailable(
            "tensorrt", f"the CUDA runtime library (libcudart) was not found ({'; '.join(errors[:2])}) — install the "
            "CUDA runtime (JetPack ships it; on x86-64 the NVIDIA driver + pip install nvidia-cuda-runtime-cu12)",
        )

    def check(self, code: int, call: str) -> None:
        """Raise CudaError, with CUDA's name for ``code``, if ``call`` returned an error."""
        if code != 0:
            name = self._lib.cudaGetErrorName(code)
            raise CudaError(call, code, name.decode() if name else CUDA_ERROR_NAMES.get(code, "?"))

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self.check(self._lib.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount")
        return count.value

    def set_device(self, index: int) -> None:
        # Mapped pinned memory needs cudaDeviceMapHost before the context exists; once it exists
        # the call fails harmlessly (and on UVA systems mapping is on anyway).
        self._lib.cudaSetDeviceFlags(DEVICE_MAP_HOST)
        self.check(self._lib.cudaSetDevice(index), f"cudaSetDevice({index})")

    def attribute(self, attribute: int, index: int) -> int:
        """A ``cudaDeviceAttr`` of GPU ``index``."""
        value = ctypes.c_int(0)
        self.check(self._lib.cudaDeviceGetAttribute(ctypes.byref(value), attribute, index), "cudaDeviceGetAttribute")
        return value.value

    def compute_capability(self, index: int) -> str:
        """``"8.7"`` for an Orin: what a built engine is specific to."""
        return f"{self.attribute(ATTR_CC_MAJOR, index)}.{self.attribute(ATTR_CC_MINOR, index)}"

    def is_integrated(self, index: int) -> bool:
        """Whether GPU ``index`` shares memory with the CPU (Jetson), so pinned host memory can be mapped."""
        return self.attribute(ATTR_INTEGRATED, index) == 1

    def device_name(self, index: int) -> str:
        # cudaDeviceProp starts with char name[256] in every CUDA release; the buffer is larger
        # than the whole struct of any release so far.
        props = ctypes.create_string_buffer(16384)
        self.check(self._lib.cudaGetDeviceProperties(props, index), "cudaGetDeviceProperties")
        return props.raw[:256].split(b"\0", 1)[0].decode("utf-8", "replace").strip()

    def host_alloc(self, nbytes: int, *, mapped: bool) -> int:
        pointer = ctypes.c_void_p()
        flags = HOST_ALLOC_MAPPED if mapped else 0
        self.check(self._lib.cudaHostAlloc(ctypes.byref(pointer), max(nbytes, 1), flags), "cudaHostAlloc")
        return int(pointer.value)

    def device_pointer(self, host_pointer: int) -> int:
        pointer = ctypes.c_void_p()
        self.check(self._lib.cudaHostGetDevicePointer(ctypes.byref(pointer), ctypes.c_void_p(host_pointer), 0),
                   "cudaHostGetDevicePointer")
        return int(pointer.value)

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self.check(self._lib.cudaMalloc(ctypes.byref(pointer), max(nbytes, 1)), "cudaMalloc")
        return int(pointer.value)

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        self.check(self._lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind), "cudaMemcpy")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self.check(self._lib.cudaMemcpyAsync(dst, src, nbytes, kind, stream), "cudaMemcpyAsync")

    def stream_create(self) -> int:
        stream = ctypes.c_void_p()
        self.check(self._lib.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
        return int(stream.value or 0)

    def synchronize(self, stream: int) -> None:
        self.check(self._lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def free_host(self, pointer: int) -> None:
        self._lib.cudaFreeHost(pointer)

    def free(self, pointer: int) -> None:
        self._lib.cudaFree(pointer)

    def stream_destroy(self, stream: int) -> None:
        self._lib.cudaStreamDestroy(stream)


def cuda_problem() -> str | None:
    """Why no CUDA GPU can be used from this process, or None."""
    try:
        cuda = CudaRuntime.load()
    except DelegateUnavailable as exc:
        return exc.reason
    try:
        count = cuda.device_count()
    except (CudaError, AttributeError) as exc:
        return f"no CUDA GPU visible ({exc}) — check the NVIDIA driver (nvidia-smi) and /dev/nvidia*"
    return None if count > 0 else "no CUDA GPU visible (cudaGetDeviceCount returned 0)"


def nvidia_gpu_problem(host: Host) -> str | None:
    """Why a detected root (not the live system) shows no NVIDIA GPU, or None."""
    if not (host.exists("/dev/nvidia0") or host.exists("/dev/nvhost-ctrl-gpu") or host.tegra_release):
        return f"no NVIDIA GPU under {host.root} (no /dev/nvidia0, /dev/nvhost-ctrl-gpu or /etc/nv_tegra_release)"
    return None
