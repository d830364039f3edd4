"""`edgeinfer bench`: the JSON shape, the PNG chart, the table, and bad input — real models, real workers.

Figures are measured, never asserted against a speed; only their internal consistency is checked.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from support.assets import MOBILENET_TINY, MOBILENET_TINY_ONNX, MODELS
from support.optimize import IMAGES, error_line, json_out, leftovers, run_cli
from support.processes import edgeinfer_cmd

from edgeinfer.pipeline.stats import STAGES
from edgeinfer.runtime.timing import SETTLE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One short run over the tiny MobileNet's twins on every delegate, with a chart."""
    folder = tmp_path_factory.mktemp("bench")
    chart = folder / "bench.png"
    result = run_cli("bench", MOBILENET_TINY, MOBILENET_TINY_ONNX, "--all", "--seconds", "0.6", "--rounds", "2",
                     "--threads", "2", "--plot", chart, "--json")
    assert result.returncode == 0, result.stderr
    return json_out(result), chart, result


def test_json_has_one_row_per_delegate_that_reads_each_model(bench):
    report, _, _ = bench
    assert report["version"] == 1
    pairs = {(row["delegate"], row["format"]) for row in report["results"]}
    assert pairs == {("xnnpack", "tflite"), ("onnxruntime", "onnx"), ("openvino", "tflite"), ("openvino", "onnx")}
    skipped = {(s["delegate"], s["model"].rsplit(".", 1)[-1]): s["reason"] for s in report["skipped"]}
    assert "cannot read onnx" in skipped[("xnnpack", "onnx")]
    assert "cannot read tflite" in skipped[("onnxruntime", "tflite")]
    assert not any(delegate in ("xnnpack", "onnxruntime", "openvino") and reason and "cannot read" not in reason
                   for (delegate, _), reason in skipped.items())  # the CPU delegates all run here
    assert all(reason for reason in skipped.values())
    assert report["threads"] == 2 and report["seconds"] == 0.6 and report["rounds"] == 2
    assert report["machine"]["cpu_count"] >= 1


def test_every_row_is_complete_and_consistent(bench):
    report, _, _ = bench
    for row in report["results"]:
        lat = row["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"], row
        assert row["inferences"] >= 10 and row["threads"] == 2
        # one stream: throughput is the inverse of the mean time per timed iteration (give or take the loop)
        assert 0.5 < row["throughput_ips"] * lat["mean"] / 1000 <= 1.05, row
        assert row["cpu_ms_per_inference"] > 0 and row["cpu_utilization"] > 0
        assert 0 < row["cold_start_ms"] < row["process_start_ms"]  # spawn -> first result includes the load
        assert row["cold_start_ms"] >= row["load_ms"]
        assert row["peak_rss_mb"] > row["runtime_rss_mb"] > 0
        if row["delegate"] == "openvino":
            assert row["cold_start_empty_cache_ms"] > 0 and row["cold_start_warm_cache_ms"] > 0
            assert row["description"] == "openvino:CPU"
        else:
            assert row["cold_start_empty_cache_ms"] is None and row["cold_start_warm_cache_ms"] is None


def test_png_chart_is_written_and_valid(bench):
    import cv2
    _, chart, _ = bench
    data = chart.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width >= 800 and height >= 600
    image = cv2.imread(str(chart))
    assert image is not None and image.shape[:2] == (height, width)
    assert image.std() > 10  # not a blank canvas
    assert leftovers(chart.parent) == []


def test_progress_is_visible_on_stderr(bench):
    _, _, result = bench
    assert "cold start 1/4" in result.stderr and "measuring: round 2/2" in result.stderr
    assert "cold start with a model cache" in result.stderr


def test_table_for_people():
    result = run_cli("bench", MOBILENET_TINY, "--delegate", "xnnpack", "--seconds", "0.3", "--rounds", "1", "-q")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "p50 ms" in lines[0] and "cold ms" in lines[0] and "peak MB" in lines[0]
    row = next(line for line in lines if line.startswith(MOBILENET_TINY.name))
    assert "xnnpack" in row and len(row.split()) == 10
    assert result.stderr == ""


# ----------------------------------------------------------------------------------------- errors

def test_missing_and_non_model_files_are_one_line_errors(tmp_path):
    missing = run_cli("bench", tmp_path / "absent.tflite", "--seconds", "0.1", timeout=60)
    assert missing.returncode == 1 and "not found" in error_line(missing)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    wrong = run_cli("bench", text, "--seconds", "0.1", timeout=60)
    assert wrong.returncode == 1 and "not a model" in error_line(wrong)


def test_a_delegate_that_cannot_read_the_model_is_explained():
    result = run_cli("bench", MOBILENET_TINY, "--delegate", "onnxruntime", "--seconds", "0.1", timeout=60)
    assert result.returncode == 1
    assert "cannot read tflite models" in error_line(result)


def test_a_model_no_runtime_can_load_lists_every_reason():
    result = run_cli("bench", MODELS / "model_invoking_error.tflite", "--seconds", "0.1", "-q", timeout=120)
    assert result.returncode == 1
    line = error_line(result)
    assert "xnnpack" in line and "openvino" in line and "fake-op-double" in line


def test_unknown_delegate_and_bad_options_are_usage_errors(tmp_path):
    assert "unknown delegate" in run_cli("bench", MOBILENET_TINY, "--delegate", "bogus", timeout=60).stderr
    assert run_cli("bench", MOBILENET_TINY, "--delegate", "bogus", timeout=60).returncode == 2
    assert run_cli("bench", MOBILENET_TINY, "--seconds", "0", timeout=60).returncode == 2
    assert run_cli("bench", MOBILENET_TINY, "--all", "--delegate", "xnnpack", timeout=60).returncode == 2
    not_png = run_cli("bench", MOBILENET_TINY, "--plot", tmp_path / "chart.jpg", timeout=60)
    assert not_png.returncode == 2 and ".png" in not_png.stderr


def test_unwritable_plot_path_fails_before_measuring(tmp_path):
    result = run_cli("bench", MOBILENET_TINY, "--plot", tmp_path / "no" / "chart.png", timeout=60)
    assert result.returncode == 1
    assert "does not exist" in error_line(result)  # one line: no progress was printed, nothing ran
    folder = run_cli("bench", MOBILENET_TINY, "--plot", tmp_path, timeout=60)
    assert folder.returncode == 1 and "is a folder" in error_line(folder)


def test_missing_matplotlib_is_a_clear_error(tmp_path):
    # stand-in for an environment without the `plot` extra: a matplotlib that cannot be imported
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {**__import__("os").environ}
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env.get('PYTHONPATH', '')}"
    result = subprocess.run(edgeinfer_cmd("bench", str(MOBILENET_TINY), "--plot", str(tmp_path / "c.png")),
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 1
    assert "pip install 'edgeinfer[plot]'" in error_line(result)


def test_source_measures_the_whole_pipeline_per_stage():
    result = run_cli("bench", MOBILENET_TINY, "--delegate", "xnnpack", "--delegate", "openvino", "--source", IMAGES,
                     "--seconds", "0.6", "--rounds", "2", "--json")
    assert result.returncode == 0, result.stderr
    rows = json_out(result)["pipeline"]
    assert [row["delegate"] for row in rows] == ["xnnpack", "openvino"]
    for row in rows:
        # every round times at least one frame past its settle frames, however slow this machine is
        assert row["timed_frames"] >= 2 and row["frames"] == row["timed_frames"] + 2 * SETTLE
        assert row["fps"] > 0 and row["task"] == "classify"
        stages = row["stages"]
        assert set(stages) == set(STAGES)
        for stage in stages.values():
            assert 0 <= stage["min"] <= stage["p50"] <= stage["p95"] <= stage["p99"] <= stage["max"]
        assert stages["latency"]["p50"] >= stages["infer"]["p50"]  # capture to result includes the invoke
    assert "pipeline: round 2/2" in result.stderr
    human = run_cli("bench", MOBILENET_TINY, "--delegate", "xnnpack", "--source", IMAGES, "--seconds", "0.3",
                    "--rounds", "1", "-q")
    assert human.returncode == 0, human.stderr
    assert "pipeline (ms p50/p95)" in human.stdout and "preprocess" in human.stdout


def test_a_yolo_detector_is_benched_as_the_detector_it_says_it_is():
    """No --task: each model runs in the pipeline as the task it is read for (Ultralytics' metadata: detect)."""
    result = run_cli("bench", MODELS / "yolo_fall_detection.onnx", "--delegate", "onnxruntime", "--source", IMAGES,
                     "--seconds", "0.5", "--rounds", "1", "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json_out(result)["pipeline"]
    assert row["task"] == "detect" and row["stages"]["postprocess"]["p50"] > 0
    # a YOLO frame may take longer than the round on a busy machine: the round goes on until one is timed
    assert row["timed_frames"] >= 1 and row["frames"] == row["timed_frames"] + SETTLE


def test_a_bad_source_fails_before_measuring(tmp_path):
    result = run_cli("bench", MOBILENET_TINY, "--source", tmp_path / "no_such_clip.mp4", "--seconds", "0.3",
                     timeout=60)
    assert result.returncode == 1
    assert "not found" in error_line(result)  # one line: nothing was measured


# ----------------------------------------------------------------------------------------- library

def test_percentiles_and_summary():
    from edgeinfer.runtime.timing import percentile, summarize

    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([], 50) != percentile([], 50)  # NaN
    summary = summarize([3.0, 1.0, 2.0])
    assert summary["p50"] == 2.0 and summary["min"] == 1.0 and summary["max"] == 3.0 and summary["mean"] == 2.0


def test_worker_close_is_idempotent_and_refuses_reuse():
    from edgeinfer.errors import ClosedError
    from edgeinfer.tools.bench.client import Worker

    with Worker() as worker:
        reply = worker.request({"op": "stats"}, 60)
        assert reply["ok"] and reply["peak_rss_mb"] > 0
        bad = worker.request({"op": "run", "seconds": 0.1}, 60)  # run before load
        assert bad["ok"] is False
    worker.close()
    with pytest.raises(ClosedError, match="closed"):
        worker.request({"op": "stats"}, 5)
    assert sys.executable  # the worker ran under this interpreter
    json.dumps(reply)
