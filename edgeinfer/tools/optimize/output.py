"""What ``optimize_model`` writes: the output paths, checked before any work, and the provenance in the model.

The files themselves are written through :func:`edgeinfer.util.fs.atomic_path` (see ``optimizer``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ...errors import OutputError
from ...runtime.model import ModelInfo
from ...util.fs import temp_path_for
from ...util.optional import import_optional
from .int8 import float_outputs
from .options import OptimizeOptions

#: the metadata_props key of the provenance stamp (data read by others: keep the string)
METADATA_KEY = "edgeinfer.optimize"


def check_outputs(output: Path, model: Path, export_ir: bool) -> list[Path]:
    """Fail early, before minutes of work, if the output path(s) cannot be written.

    Returns the final paths: the ONNX model, then with ``export_ir`` the IR's .xml and .bin.
    """
    finals = [output]
    if export_ir:
        if output.suffix.lower() in (".xml", ".bin"):
            raise ValueError(f"the output {output} is the ONNX model; give it a .onnx name (the IR goes beside it)")
        finals += [output.with_suffix(".xml"), output.with_suffix(".bin")]
    parent = output.parent
    if not parent.exists():
        raise OutputError(f"cannot write {output}: folder {parent} does not exist — create it first")
    if not parent.is_dir():
        raise OutputError(f"cannot write {output}: {parent} is not a folder")
    for final in finals:
        if final.is_dir():
            raise OutputError(f"cannot write {final}: it is a folder — give a file name")
        if final.exists() and final.resolve() == model.resolve():
            raise OutputError(f"refusing to overwrite the input model {model} — choose another output name")
    _probe_writable(output)
    return finals


def _probe_writable(output: Path) -> None:
    """Create and remove a file beside ``output``: OutputError with the OS's reason if that fails."""
    probe = temp_path_for(output).with_suffix(".probe")
    try:
        with open(probe, "xb"):
            pass
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror or exc} — choose a writable folder") from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def finish_model(path: Path, info: ModelInfo, options: OptimizeOptions, preprocessing: dict[str, Any],
                 calibration: int, notes: list[str]) -> None:
    """Float outputs for INT8 (see float_outputs); record how the model was made in its metadata."""
    onnx = import_optional("onnx", "onnx", "model metadata")
    model = onnx.load(str(path))
    float_tail = options.mode == "int8" and options.float_outputs and not options.quantize_all
    if float_tail and float_outputs(model):
        notes.append("the layers feeding the outputs keep INT8 weights but emit float (8-bit outputs turn "
                     "close scores into ties); --quantize-outputs is faster and coarser")
    stamp = {"mode": options.mode, "source_sha256": info.sha256, "source": Path(info.path).name,
             "calibration_images": calibration, "per_channel": options.per_channel,
             "activations": options.activations if options.mode == "int8" else None,
             "reduce_range": options.reduce_range if options.mode == "int8" else None,
             "float_outputs": float_tail, "quantize_all": options.quantize_all, "preprocessing": preprocessing}
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(stamp, sort_keys=True)
    onnx.save(model, str(path))
