"""The edgeinfer exception tree.

Environment and runtime failures raise an :class:`EdgeInferError` subclass with a message that
says what to do. A caller's wrong argument stays a plain ``ValueError`` / ``TypeError``, except
where it is data the program received at run time (a frame of the wrong shape), which raises
:class:`InputMismatch` — both an ``EdgeInferError`` and a ``ValueError``.

    EdgeInferError
    ├── ModelError                    something about a model file
    │   ├── ModelNotFound             the path does not exist / is not a file
    │   ├── ModelFormatError          not a model we know, or corrupt / truncated
    │   │   └── FlatbufferError       a .tflite's flatbuffer points outside the file (read by runtime._tflite_schema)
    │   ├── ModelLoadError            a runtime refused a well-formed model
    │   │   └── UnsupportedOperator   the model needs an op this runtime lacks (custom op, Edge TPU op)
    │   ├── UnsizedInput              an image input has a dynamic size and nothing states one; ``.input``
    │   ├── LayoutMismatch            (also ValueError) the outputs have no layout edgeinfer can decode (for
    │   │                             this task / this --decoder); the message names each output and layout
    │   └── AnchorOptionsError        (also ValueError) the SSD anchors a model's metadata states (``anchors:``)
    │                                 cannot be generated; ``.key`` names the option (``anchors.strides``)
    ├── PluginError                   (also ValueError) an installed plug-in (an ``edgeinfer.decoders`` entry
    │                                 point) does not import or is not what its group takes; names the plug-in,
    │                                 its entry point and its distribution
    ├── DelegateError
    │   ├── DelegateUnavailable       one delegate cannot run here; ``.reason`` says why
    │   └── NoDelegateAvailable       nothing can run this model; ``.reasons`` maps name -> reason
    ├── InferenceError                invoke() failed inside the runtime
    │   ├── DelegateFailed            the accelerator failed or hung while running (device lost, driver
    │   │                             error, no answer); a pipeline fails over to its next delegate
    │   └── InputMismatch             (also ValueError) wrong shape / dtype for an input
    ├── ImageError                    an image file cannot be read or decoded
    ├── LabelsError                   a labels file cannot be read
    ├── ProfileError                  a device profile is malformed (names the file and key)
    ├── CaptureError                  a frame source failed to open or died
    │   └── NotMjpeg                  an HTTP stream opened, but is not MJPEG (OpenCV reads it instead)
    ├── ConfigError                   a config file is malformed (names the key)
    │   └── ConfigTooLarge            a configuration document is larger than the fleet lets a device take
    ├── ProtocolError                 an MQTT message does not match its schema
    ├── DownloadError                 an artifact download kept failing (network, server)
    ├── UpdateRejected                a model update was refused; ``.reason`` says why
    ├── CommandRejected               a command's signature, device or expiry is not acceptable; ``.reason``
    ├── AuthError                     a fleet API request without a usable token (401) or role (403); ``.status``
    ├── FleetRequestError             the fleet manager refused a request; ``.status`` is its HTTP status
    ├── UploadRefused                 the fleet manager refused evidence for good (401/403/409/413); ``.status``
    ├── ProvisioningRefused           the fleet manager refuses a device's provisioning or renewal request (a claim
    │                                 unknown, expired, revoked or used up; a bad CSR; a serial taken); ``.status``
    ├── RevisionConflict              a fleet configuration layer was saved on a revision that is not its newest
    │                                 (someone saved since it was read: 409)
    ├── OutputError                   a result file cannot be written (path, permissions, disk)
    ├── DatasetError                  (also ValueError) a labelled dataset or label file cannot be read, or its
    │                                 class names are not the model's: names the fault; nothing was stored
    ├── EvaluationRejected            ``deploy --require-eval``: the candidate scores worse than the current model
    ├── OptimizeError                 a model cannot be optimised (no calibration images, ...)
    │   └── AccuracyRejected          the optimised model disagrees with the original too often
    ├── BenchmarkError                a benchmark worker process failed
    ├── CudaError                     (also RuntimeError) a CUDA runtime call failed; the tensorrt delegate
    │                                 maps it to DelegateUnavailable (loading) or InferenceError (invoke)
    ├── ClosedError                   (also RuntimeError) an engine, pipeline, source, spool or link was
    │                                 used after its close(): create a new one
    └── MissingDependency             (also ImportError) an optional package is not installed
"""

from __future__ import annotations

from collections.abc import Mapping


class EdgeInferError(Exception):
    """Base class of every error edgeinfer raises on purpose."""


class ModelError(EdgeInferError):
    """A model file cannot be used."""


class ModelNotFound(ModelError, FileNotFoundError):
    """The model path does not exist or is not a regular file."""


class ModelFormatError(ModelError):
    """The file is not a model format edgeinfer knows, or it is corrupt or truncated."""


class FlatbufferError(ModelFormatError):
    """A TFLite flatbuffer is cut or inconsistent: an offset lies outside the file, a table is missing."""


class ModelLoadError(ModelError):
    """A runtime refused to load a well-formed model."""


class UnsupportedOperator(ModelLoadError):
    """The model needs an operator the chosen runtime does not provide."""

    def __init__(self, message: str, operators: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.operators = operators


class UnsizedInput(ModelError):
    """An image input's height or width is dynamic and neither the model's metadata nor a metadata.yaml beside it
    states a size: no engine can allocate its buffers. ``input`` is the input's name."""

    def __init__(self, message: str, input_name: str = "") -> None:
        super().__init__(message)
        self.input = input_name


class LayoutMismatch(ModelError, ValueError):
    """A model's outputs are not arranged as a decoder needs (edgeinfer.pipeline.decoders); the message says why."""


class AnchorOptionsError(ModelError, ValueError):
    """The SSD anchor scheme a model's metadata states (``anchors:`` in metadata.yaml) is not one edgeinfer can
    generate: ``key`` names the option that is wrong (``anchors.strides``)."""

    def __init__(self, message: str, key: str = "anchors") -> None:
        super().__init__(message)
        self.key = key


class PluginError(EdgeInferError, ValueError):
    """An installed plug-in cannot be used: its entry point does not import, or names something that is not what its
    group takes (a decoder plug-in's must be a ``Layout`` of the entry point's name). The message names the plug-in,
    the entry point (``group: name = module:attribute``) and what went wrong; the built-ins keep working."""


class DelegateError(EdgeInferError):
    """Base of delegate selection and loading failures."""


class DelegateUnavailable(DelegateError):
    """A delegate cannot run on this machine; ``reason`` says why in words a person can act on."""

    def __init__(self, delegate: str, reason: str) -> None:
        super().__init__(f"delegate {delegate!r} is unavailable: {reason}")
        self.delegate = delegate
        self.reason = reason


class NoDelegateAvailable(DelegateError):
    """No candidate delegate can run the model; ``reasons`` maps each candidate to its reason."""

    def __init__(self, model: str, reasons: Mapping[str, str]) -> None:
        listing = "; ".join(f"{name}: {why}" for name, why in reasons.items())
        super().__init__(f"no delegate can run {model} — {listing}")
        self.reasons = dict(reasons)


class InferenceError(EdgeInferError):
    """The runtime failed while running the model."""


class DelegateFailed(InferenceError):
    """A delegate failed while running: its device was lost, its driver erred, or an invoke hung.

    ``delegate`` names it, ``reason`` says what happened, ``hung`` is True when the invoke never
    returned within the watchdog's bound. The vendor errors that mean "the device is gone" (libedgetpu's
    USB transfer errors, CUDA's device errors, OpenVINO's device-lost codes) are mapped to this.
    """

    def __init__(self, delegate: str, reason: str, *, hung: bool = False) -> None:
        super().__init__(f"delegate {delegate!r} failed while running: {reason}")
        self.delegate = delegate
        self.reason = reason
        self.hung = hung


class InputMismatch(InferenceError, ValueError):
    """Data given for an input tensor has the wrong shape or dtype."""


class ImageError(EdgeInferError):
    """An image file is missing or cannot be decoded."""


class LabelsError(EdgeInferError):
    """A labels file is missing or unreadable."""


class ProfileError(EdgeInferError):
    """A device profile is malformed; the message names the file and the key."""


class CaptureError(EdgeInferError):
    """A frame source failed to open or stopped delivering frames."""


class NotMjpeg(CaptureError):
    """The container opened, but its video is not MJPEG (the caller can use an OpenCV source)."""


class ConfigError(EdgeInferError):
    """A configuration file is malformed; the message names the key."""


class ConfigTooLarge(ConfigError):
    """A configuration document is over its size bound (the fleet manager answers 413)."""


class ProtocolError(EdgeInferError):
    """A message does not match its protocol schema."""


class DownloadError(EdgeInferError):
    """An artifact download could not complete after its retries."""


class UpdateRejected(EdgeInferError):
    """A model update was refused; ``reason`` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"update rejected ({reason}){': ' + detail if detail else ''}")
        self.reason = reason
        self.detail = detail


class CommandRejected(EdgeInferError):
    """A signed command was refused before it ran; ``reason`` is a short machine-readable code.

    The codes: ``unsigned``, ``bad_signature``, ``wrong_device``, ``no_expiry``, ``expired``,
    ``expiry_too_far`` (from :meth:`~edgeinfer.updates.signing.VerifyKey.verify_command`) and
    ``no_fleet_key`` (the agent pins no key to check with).
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"command rejected ({reason}){': ' + detail if detail else ''}")
        self.reason = reason
        self.detail = detail


class AuthError(EdgeInferError):
    """A fleet API request without a usable token (``status`` 401) or with too little role (403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ProvisioningRefused(EdgeInferError):
    """A device's provisioning request (a claim and a CSR) is refused; ``status`` is the HTTP status the fleet
    manager answers it with (400 a bad request, 401 an unknown claim, 403 a claim that does not admit it, 409 its
    serial taken by another key)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class FleetRequestError(EdgeInferError):
    """The fleet manager answered with an error; ``status`` is its HTTP status (401, 403, 404, 409...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RevisionConflict(EdgeInferError):
    """A configuration layer was saved against a revision that is not its newest: another save came first (409)."""


class UploadRefused(EdgeInferError):
    """The fleet manager refused an upload with a status a retry will not change (401, 403, 409, 413...)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class OutputError(EdgeInferError):
    """A result file (optimised model, chart, report) cannot be written where the user asked."""


class DatasetError(EdgeInferError, ValueError):
    """A labelled dataset or an imported label file (COCO JSON, YOLO txt, class folders) cannot be read — malformed,
    no images, a label naming no stored sample — or its class names are not the model's; nothing was stored."""


class EvaluationRejected(EdgeInferError):
    """A candidate model scores worse than the current one on the same labelled frames; nothing was deployed."""


class OptimizeError(EdgeInferError):
    """A model cannot be optimised: unusable calibration data, a conversion the toolkit refused."""


class AccuracyRejected(OptimizeError):
    """The optimised model's top-1 agreement with the original is below the threshold; nothing was written.

    ``report`` is the full :class:`~edgeinfer.tools.optimize.OptimizeReport` (sizes, accuracy, latency).
    """

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


class BenchmarkError(EdgeInferError):
    """A benchmark could not run (a worker process died, no delegate could be measured)."""


class CudaError(EdgeInferError, RuntimeError):
    """A CUDA runtime call returned an error code; ``code`` and ``name`` are CUDA's (e.g. 100, cudaErrorNoDevice)."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: error {code} ({name})")
        self.code = code
        self.name = name


class ClosedError(EdgeInferError, RuntimeError):
    """An object that owns a runtime, a thread, a device, a file or a socket was used after ``close()``."""


class MissingDependency(EdgeInferError, ImportError):
    """An optional Python package is not installed; the message names the pip extra to install."""
