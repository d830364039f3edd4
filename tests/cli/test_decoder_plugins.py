"""Decoders users add (the ``edgeinfer.decoders`` entry-point group): the example plug-in in examples/decoder_plugin,
pip-installed, read by ``run``, ``bench``, ``evaluate`` and ``optimize`` on a real DeepLab model and photo; broken
plug-ins are typed errors naming them while the built-ins go on working.

``class-regions`` turns DeepLab's class map into one detection (box and mask) per region: on the dog photo it must
find the dog where the photo's own trimap says the dog is."""

from __future__ import annotations

import json
import shutil
import subprocess

import cv2
import numpy as np
import pytest
from support.assets import LABELS, MODELS
from support.decoder_plugin import DOG, DOG_TRIMAP, NAME, install_broken, install_example, plugin_env
from support.processes import edgeinfer_cmd

DEEPLAB = MODELS / "deeplabv3_mnv2_dm05_pascal_quant.tflite"
PASCAL = LABELS / "pascal_voc_segmentation_labels.txt"
SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
POSE = MODELS / "yolo11n-pose.onnx"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = install_example(tmp_path_factory.mktemp("plugin"))
    install_broken(site)
    return site


def _edgeinfer(site, *args, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd(*map(str, args)), capture_output=True, text=True, env=plugin_env(site),
                          timeout=timeout)


def _dog_box() -> tuple[float, float, float, float]:
    trimap = cv2.imread(str(DOG_TRIMAP), cv2.IMREAD_GRAYSCALE)
    ys, xs = np.nonzero(trimap == 0)
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def _iou(a, b) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def test_run_reads_deeplab_with_the_installed_plugin_and_finds_the_dog_with_its_mask(site):
    result = _edgeinfer(site, "run", DEEPLAB, "-s", DOG, "--decoder", NAME, "--labels", PASCAL, "--json",
                        "--max-frames", "1", "--delegate", "xnnpack", "--no-probe")
    assert result.returncode == 0, result.stderr
    [frame] = [line for line in map(json.loads, result.stdout.splitlines()) if line["type"] == "result"]
    [dog] = [d for d in frame["result"] if d["label"] == "dog"]
    assert _iou(dog["box"], _dog_box()) > 0.8, dog["box"]
    # its mask comes out as the outline of the dog, inside its box
    [outline, *_] = dog["polygons"]
    xs, ys = [x for x, _ in outline], [y for _, y in outline]
    assert len(outline) >= 8 and min(xs) >= dog["box"][0] and max(ys) <= dog["box"][3]
    trimap = cv2.imread(str(DOG_TRIMAP), cv2.IMREAD_GRAYSCALE)
    drawn = np.zeros_like(trimap)
    cv2.fillPoly(drawn, [np.array(outline, np.int32)], 1)
    sure = trimap != 2
    inside = (drawn == 1) & sure
    assert (inside & (trimap == 0)).sum() / max(inside.sum(), 1) > 0.9


def test_the_plugins_are_listed_where_the_decoders_are_and_an_unknown_name_lists_them(site):
    helped = _edgeinfer(site, "run", "--help")
    listed = helped.stdout.split("--decoder [", 1)[1].split("]", 1)[0].split("|")
    assert helped.returncode == 0 and {"tflite-ssd", "semantic", NAME, "gone", "not-a-layout"} <= set(listed)
    unknown = _edgeinfer(site, "run", DEEPLAB, "-s", DOG, "--decoder", "class-region")
    assert unknown.returncode == 2 and "installed plug-ins: " in unknown.stderr and NAME in unknown.stderr


@pytest.mark.parametrize(("name", "words"), [
    ("gone", "does not load: ModuleNotFoundError: No module named 'no_such_decoder_module'"),
    ("not-a-layout", "is a function, not an edgeinfer.pipeline.decoders.Layout"),
])
def test_a_broken_plugin_is_an_error_naming_it_and_its_entry_point_and_the_built_ins_go_on(site, name, words):
    targets = {"gone": "no_such_decoder_module:LAYOUT", "not-a-layout": "os.path:join"}
    broken = _edgeinfer(site, "run", SSD, "-s", DOG, "--decoder", name, "--max-frames", "1", "--delegate", "xnnpack",
                        "--no-probe")
    assert broken.returncode == 1 and "Traceback" not in broken.stderr, broken.stderr
    line = broken.stderr.strip().splitlines()[-1]
    assert line.startswith(f"edgeinfer: error: decoder plug-in {name!r} (entry point edgeinfer.decoders: {name} = "
                           f"{targets[name]}, from broken-decoders 0.1) "), line
    assert words in line
    # beside it, a built-in named and a layout chosen from the outputs still read the model
    for chosen in (("--decoder", "tflite-ssd"), ()):
        fine = _edgeinfer(site, "run", SSD, "-s", DOG, *chosen, "--json", "--max-frames", "1", "--delegate",
                          "xnnpack", "--no-probe")
        assert fine.returncode == 0, fine.stderr
        assert any(line["type"] == "result" for line in map(json.loads, fine.stdout.splitlines()))


def test_bench_runs_the_pipeline_with_the_plugin(site):
    result = _edgeinfer(site, "bench", DEEPLAB, "--delegate", "xnnpack", "--source", DOG, "--decoder", NAME,
                        "--seconds", "0.3", "--rounds", "1", "--threads", "1", "--json", "-q", timeout=300)
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)["pipeline"]
    assert (row["layout"], row["task"]) == (NAME, "segment") and row["frames"] > 0


def test_evaluate_scores_the_plugins_boxes(site, tmp_path):
    dataset = tmp_path / "dogs"
    (dataset / "images").mkdir(parents=True)
    (dataset / "labels").mkdir()
    shutil.copy(DOG, dataset / "images" / DOG.name)
    height, width = cv2.imread(str(DOG)).shape[:2]
    x1, y1, x2, y2 = _dog_box()
    (dataset / "labels" / f"{DOG.stem}.txt").write_text(
        f"0 {(x1 + x2) / 2 / width} {(y1 + y2) / 2 / height} {(x2 - x1) / width} {(y2 - y1) / height}\n")
    (dataset / "data.yaml").write_text("names: [dog]\n")
    result = _edgeinfer(site, "evaluate", DEEPLAB, "--dataset", dataset, "--decoder", NAME, "--labels", PASCAL,
                        "--eval-delegate", "xnnpack", "--json", "-q")
    assert result.returncode == 0, result.stderr
    scores = json.loads(result.stdout)
    assert scores["layout"] == NAME and scores["map50"] == pytest.approx(1.0)


def test_optimize_reads_the_model_with_the_named_plugin(site, tmp_path):
    # the plug-in decodes class maps: a pose model's outputs are none, and optimize says so in the plug-in's words
    result = _edgeinfer(site, "optimize", POSE, "--fp16", "--validation", DOG.parent, "-o", tmp_path / "out.onnx",
                        "--decoder", NAME, "--bench-seconds", "0")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"decoder {NAME!r} does not fit" in result.stderr and "needs a 1xHxW integer class map" in result.stderr


def test_what_the_plugin_gives_is_what_the_samples_and_the_evidence_carry(site, tmp_path):
    """The dog's mask outline in the run's JSON is the one its sample and its event's evidence keep."""
    result = _edgeinfer(site, "run", DEEPLAB, "-s", DOG, "--decoder", NAME, "--labels", PASCAL, "--json",
                        "--max-frames", "1", "--delegate", "xnnpack", "--no-probe", "--sample", "random:1",
                        "--samples-dir", tmp_path / "samples", "--event", "detection:0.5/dog", "--evidence-dir",
                        tmp_path / "evidence")
    assert result.returncode == 0, result.stderr
    [frame] = [line for line in map(json.loads, result.stdout.splitlines()) if line["type"] == "result"]
    [dog] = [d for d in frame["result"] if d["label"] == "dog"]
    assert 8 <= sum(len(p) for p in dog["polygons"]) <= 256
    [sample] = [json.loads(p.read_text()) for p in (tmp_path / "samples").rglob("sample.json")]
    [kept] = [d for d in sample["detections"] if d["label"] == "dog"]
    assert (kept["box"], kept["polygons"]) == (dog["box"], dog["polygons"])
    [event] = [json.loads(p.read_text())["event"] for p in (tmp_path / "evidence").rglob("event.json")]
    assert (event["label"], event["box"], event["polygons"]) == ("dog", dog["box"], dog["polygons"])
