"""`import edgeinfer` must stay cheap: no vendor runtime, no OpenCV, no threads."""

from __future__ import annotations

import json
import subprocess
import sys

from support.assets import REPO
from support.processes import env_with_repo

HEAVY = ["ai_edge_litert", "tflite_runtime", "onnxruntime", "onnx", "openvino", "tensorrt", "cv2",
         "paho", "pycoral",
         # the fleet manager's: the `edgeinfer fleet` commands import them when they run, not the CLI when it loads
         "fastapi", "starlette", "pydantic", "uvicorn", "sqlalchemy"]


def test_import_leaves_vendor_runtimes_unloaded():
    code = (
        "import sys, json, threading, edgeinfer, edgeinfer.cli; "
        "edgeinfer.EdgeInferError; edgeinfer.TensorSpec; "
        f"print(json.dumps({{'loaded': [m for m in {HEAVY!r} if m in sys.modules], "
        "'threads': threading.active_count()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result == {"loaded": [], "threads": 1}


def test_runtime_is_imported_on_first_use():
    code = (
        "import sys, edgeinfer; from support.assets import MODELS; "
        "e = edgeinfer.load(MODELS / 'mobilenet_v2_1.0_224_quant.onnx', 'onnxruntime'); "
        "print('onnxruntime' in sys.modules, 'ai_edge_litert' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env_with_repo(PYTHONPATH=f"{REPO}:{REPO / 'tests'}"))
    assert out.stdout.split() == ["True", "False"]


def test_the_fleet_commands_load_no_model_pipeline():
    """`edgeinfer fleet ...` (a claim, a device list, a deploy) runs no model: its commands load neither numpy nor the
    pipeline's option parsing (`deploy --require-eval`'s options are declared in cli/fleet_eval.py, and the
    evaluation's own imports wait for it to run) — a fifth of a second of CPU on every call when they did."""
    code = ("import sys, json, edgeinfer.cli.fleet; "
            "print(json.dumps([m for m in ('numpy', 'edgeinfer.pipeline.options', 'edgeinfer.cli.evaluate') "
            "if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
