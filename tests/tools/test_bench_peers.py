"""bench/peers.py's own pieces on a few frames, so the benchmark cannot rot: the clips it makes, the plain loop,
``edgeinfer run`` and (where its bench-only environment exists) Ultralytics as real processes, their result lines
read back as boxes, and the agreement it reports. Speed is never asserted: only that each figure was measured."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.assets import REPO

from edgeinfer.pipeline.agreement import Box

BENCH = REPO / "bench" / "peers.py"


def load_peers():
    spec = importlib.util.spec_from_file_location("bench_peers", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_bench(tmp_path: Path, *args: str, timeout: float = 600) -> tuple[dict, str]:
    out = tmp_path / "peers.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(BENCH), "--models", "pose", "--threads", "1", "--rounds", "1",
                             "--frames", "3", "--warmup", "2", "--cache", str(tmp_path), "--json", str(out), *args],
                            capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text()), result.stdout


def assert_measured(case: dict, programs: tuple[str, ...]) -> None:
    assert set(case["programs"]) == set(programs), case
    for name in programs:
        figures = case["programs"][name]
        assert figures["fps"] > 0 and figures["cpu_ms_per_frame"] > 0, (name, figures)
        assert figures["rss_mib"] > 50, (name, figures)  # a Python process with a model loaded
        assert figures["first_result_s"] > 0, (name, figures)


def test_the_plain_loop_and_edgeinfer_run_on_both_codecs_and_their_boxes_agree(tmp_path):
    results, log = run_bench(tmp_path, "--programs", "plain,edgeinfer,chosen,runtime", "--codecs", "h264,mjpeg")
    assert [r["codec"] for r in results] == ["h264", "mjpeg"]
    clips = sorted(p.suffix for p in (tmp_path / "clips").iterdir())
    assert clips == [".avi", ".mp4"], clips
    for case in results:
        assert_measured(case, ("plain", "edgeinfer", "chosen", "runtime"))
        assert case["programs"]["edgeinfer"]["delegates"] == ["onnxruntime"]  # the plain loop's runtime
        assert case["programs"]["chosen"]["delegates"]  # what the run without --delegate ran on, from its summary
        # the ceiling (the runtime alone) is a ratio of its own and a peer of edgeinfer's, never a box reference
        assert set(case["ratios"]) == {"edgeinfer / plain", "chosen / plain", "edgeinfer / runtime",
                                       "runtime / plain"}
        assert set(case["agreement"]) == {"edgeinfer vs plain", "chosen vs plain"}
        ratio = case["ratios"]["edgeinfer / plain"]
        assert ratio["min"] <= ratio["median"] <= ratio["max"] and len(ratio["all"]) == 1
        found = case["agreement"]["edgeinfer vs plain"]  # no Ultralytics here: the plain loop is the reference
        assert found["frames"] == 5 and found["reference_boxes"] >= 5, found  # a person in every frame
        # the same model over the same frames: edgeinfer finds what the plain loop finds (a parser gone wrong
        # reads no box, or boxes elsewhere)
        assert found["recall"] >= 0.9 and found["precision"] >= 0.9 and found["mean_iou"] > 0.8, found
    assert "| yolo11n-pose.onnx, 1 thread, h264 |" in log  # the table


def test_agreement_counts_boxes_missed_and_boxes_added():
    peers = load_peers()
    person, other = Box((0, 0, 100, 200), 0.9, 0), Box((300, 0, 400, 100), 0.8, 0)
    reference = [[person, other], [person]]
    candidate = [[Box((2, 0, 100, 200), 0.7, 0)], [person, Box((300, 0, 400, 100), 0.6, 1)]]  # one missed, one added
    found = peers.agreement(reference, candidate)
    assert (found["reference_boxes"], found["candidate_boxes"]) == (3, 3)
    assert found["recall"] == pytest.approx(2 / 3) and found["precision"] == pytest.approx(2 / 3)
    assert found["frames_differing"] == 2


def test_result_lines_of_each_program_read_as_boxes():
    peers = load_peers()
    edge = {"type": "result", "frame_id": 0, "result": [{"box": [1.0, 2.0, 30.0, 40.0], "score": 0.5, "class_id": 1,
                                                         "label": "Fall"}]}
    peer = {"frame": 0, "boxes": [[1.0, 2.0, 30.0, 40.0, 0.5, 1.0]]}
    expected = [Box((1.0, 2.0, 30.0, 40.0), 0.5, 1)]
    assert peers._boxes("edgeinfer", edge) == expected
    assert peers._boxes("plain", peer) == peers._boxes("ultralytics", peer) == expected


@pytest.mark.slow
def test_ultralytics_runs_on_the_same_file_and_its_boxes_are_the_reference(tmp_path):
    python = load_peers().DEFAULT_ULTRALYTICS_PYTHON
    if not python.exists():
        pytest.skip(f"no bench-only Ultralytics environment at {python} (bench/peers.py --setup-ultralytics makes "
                    "it; EDGEINFER_ULTRALYTICS_PYTHON names another)")
    results, _ = run_bench(tmp_path, "--codecs", "h264", "--ultralytics-python", str(python),
                           "--programs", "plain,edgeinfer,ultralytics,chosen")
    case = results[0]
    assert_measured(case, ("plain", "edgeinfer", "ultralytics", "chosen"))
    assert set(case["ratios"]) == {"edgeinfer / plain", "edgeinfer / ultralytics", "chosen / ultralytics",
                                   "chosen / plain"}
    for label in ("edgeinfer vs ultralytics", "chosen vs ultralytics", "plain vs ultralytics"):
        found = case["agreement"][label]
        assert found["reference_boxes"] >= 5 and found["recall"] >= 0.9 and found["precision"] >= 0.9, (label, found)
