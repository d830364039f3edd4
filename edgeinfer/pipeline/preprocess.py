"""Frame → model input, written straight into the engine's input view.

A :class:`Preprocessor` is built once per (model input, source frame size). It preallocates every
scratch buffer it needs, so calling it per frame allocates nothing: OpenCV writes into our
buffers through ``dst=`` and numpy through ``out=``. It returns the :class:`Transform` that maps
model-input pixels back to source pixels (for detection boxes and keypoints).

A float NCHW input (YOLO, DETR and most ONNX exports) takes the fused path: the frame is resized into
a uint8 canvas of the input's size whose letterbox border was painted once, split into its three
planes, and each plane written into its channel of the input by one ``cv2.addWeighted`` — the
channel order, ``(pixel - mean) / std`` and the layout change in that one pass, at about the cost of
a copy (1.3 ms for a 1280x720 frame into 640x640 where the numpy path took 7.5 and a plain OpenCV +
numpy loop 10: docs/benchmarks.md, "Preprocessing").

What is fed is a model family's contract (docs/pipeline.md, "What each family is fed"): the channel order
(``channels``: ``rgb`` or ``bgr``), the resize, where a letterbox's border goes (``pad``: ``centre``, or
``corner``: the image at the top-left and the whole border bottom-right, YOLOX's ``preproc``) and its grey
(``pad_value``), and ``(pixel - mean) / std``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import InputMismatch
from ..runtime.metadata import CHANNEL_ORDERS, PAD_PLACES

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.model import TensorSpec

ResizeMode = Literal["stretch", "letterbox", "crop"]
RESIZE_MODES = ("stretch", "letterbox", "crop")
#: float inputs with no stated normalisation get (pixel - 127.5) / 127.5, i.e. [-1, 1]
DEFAULT_FLOAT_MEAN = 127.5
DEFAULT_FLOAT_STD = 127.5
#: the letterbox's grey where the model's family or metadata states none (Ultralytics' and YOLOX's)
LETTERBOX_PAD = 114
__all__ = ["CHANNEL_ORDERS", "DEFAULT_FLOAT_MEAN", "DEFAULT_FLOAT_STD", "LETTERBOX_PAD", "PAD_PLACES", "RESIZE_MODES",
           "Preprocessor", "Transform", "input_geometry"]


@dataclass(frozen=True)
class Transform:
    """How a source frame was mapped into the model input: ``model = source * scale + pad``."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    source_width: int
    source_height: int

    def for_source_size(self, width: int, height: int) -> Transform:
        """The same mapping for a source whose frames were shrunk to ``source_width`` x ``source_height``
        from ``width`` x ``height`` (reduced-scale decoding): coordinates come out in the full frame."""
        if (width, height) == (self.source_width, self.source_height):
            return self
        return Transform(self.scale_x * self.source_width / width, self.scale_y * self.source_height / height,
                         self.pad_x, self.pad_y, width, height)

    def to_source(self, x: float, y: float) -> tuple[float, float]:
        """Model-input pixel coordinates -> source pixel coordinates (clipped to the frame)."""
        sx = (x - self.pad_x) / self.scale_x
        sy = (y - self.pad_y) / self.scale_y
        return (min(max(sx, 0.0), float(self.source_width)), min(max(sy, 0.0), float(self.source_height)))


def input_geometry(spec: TensorSpec) -> tuple[int, int, int, str]:
    """(height, width, channels, layout) of an image input; ValueError if it is not one."""
    shape = spec.shape
    layout = spec.layout
    if len(shape) != 4 or layout not in ("NHWC", "NCHW"):
        raise ValueError(f"input {spec.name!r} with shape {shape} is not an image tensor (NHWC / NCHW)")
    if layout == "NHWC":
        return shape[1], shape[2], shape[3], layout
    return shape[2], shape[3], shape[1], layout


class Preprocessor:
    """Resize / letterbox (centred or in the corner) / centre-crop, BGR→RGB or not, normalise, quantise, NHWC/NCHW
    into ``dst``."""

    def __init__(
        self,
        spec: TensorSpec,
        source_size: tuple[int, int],
        *,
        resize: ResizeMode = "stretch",
        channels: str = "rgb",
        mean: float | tuple[float, ...] | None = None,
        std: float | tuple[float, ...] | None = None,
        interpolation: str = "linear",
        pad: str = "centre",
        pad_value: int = LETTERBOX_PAD,
    ) -> None:
        import cv2
        import numpy as np

        if resize not in RESIZE_MODES:
            raise ValueError(f"resize must be one of {RESIZE_MODES}, not {resize!r}")
        if channels not in CHANNEL_ORDERS:
            raise ValueError(f"channels must be one of {', '.join(CHANNEL_ORDERS)}, not {channels!r}")
        if pad not in PAD_PLACES:
            raise ValueError(f"pad must be one of {', '.join(PAD_PLACES)}, not {pad!r}")
        if isinstance(pad_value, bool) or not isinstance(pad_value, int) or not 0 <= pad_value <= 255:
            raise ValueError(f"pad_value must be a pixel value in 0..255, not {pad_value!r}")
        self.spec = spec
        self.channels, self.pad, self.pad_value = channels, pad, pad_value
        self.height, self.width, self.channels, self.layout = input_geometry(spec)
        if self.channels != 3:
            raise ValueError(f"input {spec.name!r} has {self.channels} channels; only 3-channel images are supported")
        self.source_width, self.source_height = source_size
        self.resize_mode = resize
        self._cv2 = cv2
        self._interp = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST}[interpolation]
        self._color = cv2.COLOR_BGR2RGB if channels == "rgb" else None  # OpenCV's frames are BGR
        self.transform, self._region, self._crop = self._plan()
        rh, rw = self._region[3] - self._region[1], self._region[2] - self._region[0]
        self._resized = np.empty((rh, rw, 3), np.uint8)
        self._colored = np.empty((rh, rw, 3), np.uint8) if self._color is not None else self._resized
        self._float_plan = self._plan_values(mean, std)
        self._fused = self._plan_fused()
        if self._float_plan is not None and self._fused is None:
            self._numpy_buffers()

    # -- planning ------------------------------------------------------------------------
    def _plan(self):
        """Transform, target region (x0, y0, x1, y1) in the input, and source crop (x0, y0, x1, y1)."""
        sw, sh, w, h = self.source_width, self.source_height, self.width, self.height
        if self.resize_mode == "stretch":
            return Transform(w / sw, h / sh, 0.0, 0.0, sw, sh), (0, 0, w, h), (0, 0, sw, sh)
        if self.resize_mode == "letterbox":
            scale = min(w / sw, h / sh)
            if self.pad == "corner":
                # YOLOX's preproc to the pixel: the size truncated, the image at the top-left, and boxes mapped
                # back by the ratio itself (its demo divides them by it)
                rw, rh = max(1, int(sw * scale)), max(1, int(sh * scale))
                return Transform(scale, scale, 0.0, 0.0, sw, sh), (0, 0, rw, rh), (0, 0, sw, sh)
            rw, rh = max(1, round(sw * scale)), max(1, round(sh * scale))
            x0, y0 = (w - rw) // 2, (h - rh) // 2
            return Transform(rw / sw, rh / sh, x0, y0, sw, sh), (x0, y0, x0 + rw, y0 + rh), (0, 0, sw, sh)
        scale = max(w / sw, h / sh)  # centre crop: cover, then cut the overflow from the source
        cw, ch = min(sw, round(w / scale)), min(sh, round(h / scale))
        cx0, cy0 = (sw - cw) // 2, (sh - ch) // 2
        transform = Transform(w / cw, h / ch, -cx0 * w / cw, -cy0 * h / ch, sw, sh)
        return transform, (0, 0, w, h), (cx0, cy0, cx0 + cw, cy0 + ch)

    def _plan_values(self, mean, std):
        """None when the input takes raw uint8 pixels; else (mean, 1/std, scale, zero_point, lo, hi)."""
        import numpy as np

        spec = self.spec
        dtype = np.dtype(spec.dtype)
        if dtype == np.uint8 and mean is None and std is None:
            return None  # the TF/Coral convention: uint8 models take pixels as they are
        if mean is None:
            mean = 128.0 if dtype.kind in "iu" else DEFAULT_FLOAT_MEAN
        if std is None:
            std = 128.0 if dtype.kind in "iu" else DEFAULT_FLOAT_STD
        mean_arr = np.asarray(mean, np.float32).reshape(-1)
        inv_std = (1.0 / np.asarray(std, np.float32)).reshape(-1)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            scale = spec.scale or (1.0 / 128.0 if dtype == np.int8 else 1.0)
            zero = spec.zero_point if spec.zero_point is not None else 0
            return mean_arr, inv_std, scale, zero, info.min, info.max
        return mean_arr, inv_std, None, None, None, None

    def _numpy_buffers(self) -> None:
        """The float buffers of the numpy path (the fused one needs none)."""
        import numpy as np

        rh, rw = self._resized.shape[:2]
        self._real = np.empty((self.height, self.width, 3), np.float32)
        self._work = np.empty((rh, rw, 3), np.float32)
        # the letterbox's grey as the model sees it, normalised and quantised like the pixels
        self._pad = self._values(np.full((1, 1, 3), self.pad_value, np.float32))

    def _plan_fused(self) -> _FusedPlan | None:
        """The one-pass plan for a float32 NCHW input; None for the others (uint8 pixels go straight in,
        quantised and NHWC inputs take the numpy path)."""
        import numpy as np

        if self._float_plan is None or self.layout != "NCHW" or np.dtype(self.spec.dtype) != np.float32:
            return None
        mean, inv_std = (np.broadcast_to(v, (3,)).astype(np.float64) for v in self._float_plan[:2])
        canvas = np.full((self.height, self.width, 3), self.pad_value, np.uint8)
        x0, y0, x1, y1 = self._region
        planes = [np.empty((self.height, self.width), np.uint8) for _ in range(3)]
        # output channel c reads plane 2 - c (BGR -> RGB) or c, scaled by 1/std and shifted by -mean/std
        sources = [planes[2 - c] if self._color is not None else planes[c] for c in range(3)]
        return _FusedPlan(self._cv2, self._interp, canvas, canvas[y0:y1, x0:x1], self._resized, planes, sources,
                          tuple(inv_std), tuple(-mean * inv_std))

    def _values(self, pixels: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``(pixels - mean) / std``, quantised when the input is an integer tensor, into ``out``."""
        import numpy as np

        mean, inv_std, scale, zero, lo, hi = self._float_plan  # type: ignore[misc]
        work = np.empty(pixels.shape, np.float32) if out is None else out
        np.subtract(pixels, mean, out=work, casting="unsafe")
        np.multiply(work, inv_std, out=work)
        if scale is not None:  # quantise: q = real / scale + zero_point
            np.multiply(work, 1.0 / scale, out=work)
            np.add(work, zero, out=work)
            np.rint(work, out=work)
            np.clip(work, lo, hi, out=work)
        return work

    # -- per frame -----------------------------------------------------------------------
    def __call__(self, frame: np.ndarray, dst: np.ndarray) -> Transform:
        """Write ``frame`` (HxWx3 BGR uint8) into ``dst`` (the engine's input view)."""
        import numpy as np

        cv2 = self._cv2
        if frame.shape[:2] != (self.source_height, self.source_width) or frame.dtype != np.uint8:
            raise InputMismatch(
                f"frame is {frame.shape} {frame.dtype}, the preprocessor was built for "
                f"{self.source_height}x{self.source_width}x3 uint8 — build a new one for this size"
            )
        cx0, cy0, cx1, cy1 = self._crop
        source = frame if self._crop == (0, 0, self.source_width, self.source_height) else frame[cy0:cy1, cx0:cx1]
        image = dst[0]  # HxWx3 for NHWC, 3xHxW for NCHW
        if self._fused is not None:
            if image.flags.c_contiguous:
                self._fused.write(source, image)
                return self.transform
            self._fused = None  # an input view OpenCV cannot write whole channels of: the numpy path from now on
            self._numpy_buffers()
        size = (self._resized.shape[1], self._resized.shape[0])
        cv2.resize(source, size, dst=self._resized, interpolation=self._interp)
        if self._color is not None:
            cv2.cvtColor(self._resized, self._color, dst=self._colored)
        pixels = self._colored
        x0, y0, x1, y1 = self._region
        full = (x0, y0, x1, y1) == (0, 0, self.width, self.height)
        if self._float_plan is None:  # uint8 pixels straight in
            if self.layout == "NHWC" and full:
                np.copyto(image, pixels)
            else:
                if not full:
                    image.fill(self.pad_value)
                target = image[y0:y1, x0:x1] if self.layout == "NHWC" else image[:, y0:y1, x0:x1].transpose(1, 2, 0)
                np.copyto(target, pixels)
            return self.transform
        work = self._values(pixels, self._work)
        real = self._real
        if not full:
            real[...] = self._pad
            real[y0:y1, x0:x1] = work
            work = real
        target = image if self.layout == "NHWC" else image.transpose(1, 2, 0)
        np.copyto(target, work, casting="unsafe")
        return self.transform


@dataclass
class _FusedPlan:
    """A float32 NCHW input's buffers and per-channel coefficients (:meth:`Preprocessor._plan_fused`)."""

    cv2: Any
    interpolation: int
    canvas: np.ndarray  # HxWx3 uint8, the letterbox border painted once
    region: np.ndarray  # the canvas's view the frame goes into (between the borders)
    resized: np.ndarray  # the frame resized, when the region is no contiguous block (a pillarbox)
    planes: list[np.ndarray]  # the canvas split into B, G, R
    sources: list[np.ndarray]  # the plane each output channel reads
    alpha: tuple[float, ...]  # 1 / std per output channel
    beta: tuple[float, ...]  # -mean / std per output channel

    def write(self, source: np.ndarray, image: np.ndarray) -> None:
        """Resize ``source`` into the canvas, then each channel of ``image`` (3xHxW float32) in one pass."""
        cv2, size = self.cv2, (self.region.shape[1], self.region.shape[0])
        if self.region.flags.c_contiguous:  # whole rows of the canvas: OpenCV resizes straight into them
            cv2.resize(source, size, dst=self.region, interpolation=self.interpolation)
        else:  # a pillarbox: resized apart, then copied between the side borders
            cv2.resize(source, size, dst=self.resized, interpolation=self.interpolation)
            self.region[...] = self.resized
        cv2.split(self.canvas, self.planes)
        for channel, plane in enumerate(self.sources):
            cv2.addWeighted(plane, self.alpha[channel], plane, 0.0, self.beta[channel], dst=image[channel],
                            dtype=cv2.CV_32F)
