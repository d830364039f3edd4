"""What each model family is fed, seen in the input tensor the engine ran (docs/pipeline.md, "What each family is
fed"): YOLOX exactly as its own ``preproc`` feeds it, Ultralytics RGB centred in [0, 1]; ``channels`` and ``pad``
given as options, in ``metadata.yaml`` or in agent.yaml, and refused, naming the key, when they are no such word."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.agent import write_config
from support.assets import IMAGES, MODELS
from support.detr_models import planted_onnx, yolox_output
from support.optimize import run_cli

import edgeinfer
from edgeinfer.agent.config import load_config
from edgeinfer.errors import ConfigError, ModelError
from edgeinfer.pipeline.decoders import DecoderSettings
from edgeinfer.pipeline.options import PipelineOptions
from edgeinfer.pipeline.tasks import read_model

#: sha256 (first 32 hex digits) of the float32 CHW tensor YOLOX's own ``yolox.data.data_augment.preproc(
#: cv2.imread(photo), (416, 416))`` returns for each shared photo — made with Megvii-BaseDetection/YOLOX's source
#: (data_augment.py as of b3a80be, 2023-03-01; unchanged since), outside this repository. The photos' sizes make
#: each case: rows of border under the image (cat, kite: 1352x900 -> 416x276, 276.92 truncated), columns of border
#: right of it (grace_hopper, parrot, squat), none (dog_segmentation, upscaled 128 -> 416).
YOLOX_PREPROC_416 = {
    "cat.bmp": "9cd99004be8251c2d31db6c9b5c86573",
    "cat_720p.jpg": "fd99c0875e85cc49fe9cddb84d58f1b6",
    "dog_segmentation.bmp": "e5619861df983d7cca065cb223b80c51",
    "face.jpg": "d23ba305870253fefb65d297a36280db",
    "grace_hopper.bmp": "bf3cc10f5d94b1d346f6d01de7feeae5",
    "kite_and_cold.jpg": "05c42ae9d03fc002ef02b85c3fae08ec",
    "parrot.jpg": "7d5bb667d348c9457cf168667ceec5c4",
    "pets.jpg": "79a48c530c89aa8a41328bc057c5d7fb",
    "squat.bmp": "293e254d750e1439452f4d6e24d7515f",
}
ULTRALYTICS = MODELS / "yolo_fall_detection.onnx"


def _digest(tensor: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tensor, np.float32).tobytes()).hexdigest()[:32]


@pytest.fixture(scope="module")
def yolox_416(tmp_path_factory):
    """A YOLOX-layout model of a 416x416 input (YOLOX-Nano's) as Megvii exports it: one [1, 3549, 85] output of
    raw grids, no metadata. What it answers does not matter here: what it is fed does."""
    folder = tmp_path_factory.mktemp("yolox")
    return planted_onnx(folder / "yolox_nano.onnx", {"output": yolox_output((), decoded=False, size=(416, 416))},
                        size=(416, 416))


def _run(model, image, **options) -> tuple[np.ndarray, object]:
    """The input tensor the pipeline ran the model on for one still image (the engine's own input buffer), and the
    result."""
    with edgeinfer.Pipeline(model, image, reduced_decode=False, delegate="onnxruntime", delegate_probe=False,
                            **options) as pipeline:
        (result,) = [r.result for r in pipeline]
        return np.array(pipeline.engine.input_view(0)[0]), result


def _fed(model, image, **options) -> np.ndarray:
    return _run(model, image, **options)[0]


def test_a_yolox_model_is_fed_what_yolox_preproc_feeds_it_to_the_bit(yolox_416):
    """BGR, 0-255, resized by YOLOX's ratio (the size truncated) into the top-left of a 114 border: the digest of
    every photo's tensor is the one YOLOX's own preproc gives — through a real pipeline for two photos (a border
    below, a border right), through the run's own reading for the rest."""
    for image in ("kite_and_cold.jpg", "parrot.jpg"):
        assert _digest(_fed(yolox_416, IMAGES / image)) == YOLOX_PREPROC_416[image], image
    with edgeinfer.load(yolox_416, "onnxruntime") as engine:
        reading = read_model(engine, task=None, decoder=None, labels=None, settings=DecoderSettings())
        assert (reading.layout.name, reading.channels, reading.pad) == ("yolox", "bgr", "corner")
        assert reading.pad_value == 114
        for image, digest in YOLOX_PREPROC_416.items():
            frame = cv2.imread(str(IMAGES / image))
            reading.preprocessor(engine.inputs[0], (frame.shape[1], frame.shape[0]))(frame, engine.input_view(0))
            assert _digest(engine.input_view(0)[0]) == digest, image


def test_an_ultralytics_model_is_fed_rgb_centred_in_grey_114_over_255(tmp_path):
    """The other family beside it, as before: a 640x320 frame, blue on the left, red on the right, goes into the
    middle rows of the input as RGB / 255, the rows above and below 114 / 255."""
    frame = np.zeros((320, 640, 3), np.uint8)
    frame[:, :320] = (255, 0, 0)  # BGR: blue
    frame[:, 320:] = (0, 0, 255)  # red
    cv2.imwrite(str(tmp_path / "frame.png"), frame)
    tensor = _fed(ULTRALYTICS, tmp_path / "frame.png")
    assert tensor.shape == (3, 640, 640)
    border = np.full(3, 114 / 255, np.float32)
    for rows in (tensor[:, :160], tensor[:, 480:]):
        assert np.allclose(rows.reshape(3, -1).T, border)
    image = tensor[:, 160:480]
    assert np.allclose(image[:, :, :300].reshape(3, -1).T, (0.0, 0.0, 1.0))  # blue is channel 2 of RGB
    assert np.allclose(image[:, :, 340:].reshape(3, -1).T, (1.0, 0.0, 0.0))  # red is channel 0


def _yolox_in(folder, yolox_416, metadata: str | None = None):
    """The YOLOX model copied into ``folder``, with ``metadata`` as the metadata.yaml beside it."""
    model = folder / "model.onnx"
    shutil.copy(yolox_416, model)
    if metadata is not None:
        (folder / "metadata.yaml").write_text(metadata)
    return model


def _centred_rgb(frame: np.ndarray, size: int = 416) -> np.ndarray:
    """What a centred letterbox of RGB 0-255 pixels makes of ``frame`` (the model's square input)."""
    height, width = frame.shape[:2]
    scale = min(size / width, size / height)
    w, h = round(width * scale), round(height * scale)
    canvas = np.full((size, size, 3), 114, np.uint8)
    x0, y0 = (size - w) // 2, (size - h) // 2
    canvas[y0:y0 + h, x0:x0 + w] = cv2.resize(frame, (w, h), interpolation=cv2.INTER_LINEAR)
    return canvas[:, :, ::-1].transpose(2, 0, 1).astype(np.float32)


def test_options_and_metadata_yaml_say_what_a_model_is_fed(tmp_path, yolox_416):
    """--channels rgb --pad centre on the YOLOX model feeds RGB centred; so does a metadata.yaml saying it; an
    option given wins over the metadata."""
    frame = cv2.imread(str(IMAGES / "kite_and_cold.jpg"))
    expected = _centred_rgb(frame)
    assert np.array_equal(_fed(yolox_416, IMAGES / "kite_and_cold.jpg", channels="rgb", pad="centre"), expected)
    stated = _yolox_in(tmp_path, yolox_416, "channels: RGB\npad: centre\n")
    assert np.array_equal(_fed(stated, IMAGES / "kite_and_cold.jpg"), expected)
    overridden = _fed(stated, IMAGES / "kite_and_cold.jpg", channels="bgr", pad="corner")
    assert _digest(overridden) == YOLOX_PREPROC_416["kite_and_cold.jpg"]


@pytest.mark.parametrize(("key", "value"), [("channels", "brg"), ("pad", "middle")])
def test_a_feed_word_that_is_none_is_refused_naming_its_key(tmp_path, yolox_416, key, value):
    """The option (Pipeline, agent.yaml, the CLI) and the metadata.yaml key: one set of choices, one message."""
    with pytest.raises(ValueError, match=rf"^{key} must be one of .*, not '{value}'"):
        PipelineOptions(**{key: value})
    config = write_config(tmp_path / "agent.yaml", device_id="cam-01", pipelines=[
        {"model": str(yolox_416), "source": str(IMAGES / "cat.bmp"), key: value}])
    with pytest.raises(ConfigError, match=rf"pipelines\[0\]\.{key}: must be one of .*got '{value}'"):
        load_config(config)
    model = _yolox_in(tmp_path, yolox_416, f"{key}: {value}\n")
    with pytest.raises(ModelError, match=rf"metadata '{key}' = '{value}' is not one of .*metadata\.yaml"):
        edgeinfer.Pipeline(model, IMAGES / "cat.bmp", delegate="onnxruntime", delegate_probe=False)
    # the option stands for the word the metadata got wrong
    with edgeinfer.Pipeline(model, IMAGES / "cat.bmp", delegate="onnxruntime", delegate_probe=False,
                            **{key: {"channels": "bgr", "pad": "corner"}[key]}) as pipeline:
        assert len(list(pipeline)) == 1
    done = run_cli("run", model, "--source", IMAGES / "cat.bmp", f"--{key}", value)
    assert done.returncode == 2 and f"Invalid value for '--{key}'" in done.stderr
    told = run_cli("info", model)
    assert told.returncode == 0, told.stderr
    assert f"refused: metadata '{key}' = '{value}' is not one of" in told.stdout


def test_info_prints_what_a_run_feeds_the_model(tmp_path, yolox_416):
    told = run_cli("info", yolox_416)
    assert told.returncode == 0, told.stderr
    assert ("fed      letterbox (the image top-left, the border bottom-right, grey 114), BGR, (pixel - 0) / 1, "
            "NCHW (yolox's)") in told.stdout
    feed = json.loads(run_cli("info", ULTRALYTICS, "--json").stdout)["feed"]
    assert feed == {"decoder": "yolo", "task": "detect", "resize": "letterbox", "channels": "rgb", "pad": "centre",
                    "pad_value": 114, "mean": [0.0, 0.0, 0.0], "std": [255.0, 255.0, 255.0], "quantized": None,
                    "input_layout": "NCHW", "refused": {}}
    stated = _yolox_in(tmp_path, yolox_416, "channels: rgb\n")
    assert "fed      letterbox (the image top-left, the border bottom-right, grey 114), RGB" in \
        run_cli("info", stated).stdout


YOLOX_DATA = Path(__file__).resolve().parents[1] / "data" / "yolox"  # Apache-2.0: tests/data/yolox/README.md
YOLOX_NANO = YOLOX_DATA / "yolox_nano.onnx"
YOLOX_REFERENCE = YOLOX_DATA / "yolox_nano_yolox.json"
YOLOX_SHA256 = "695e750a5d5754bb5a8d5325643b59282191a7e7a564e435a415fd3c578eab14"


def test_a_trained_yolox_finds_what_yolox_own_demo_finds():
    """YOLOX-Nano as Megvii's exporter leaves it (raw grids, no metadata), no option but the demo's thresholds: its
    input is YOLOX's preproc's to the bit and every object YOLOX's demo found is found — its class, its box to a
    hundredth of a pixel, its score to 1e-5 (the reference's rounding)."""
    from edgeinfer.pipeline.decoders.base import box_iou

    assert hashlib.sha256(YOLOX_NANO.read_bytes()).hexdigest() == YOLOX_SHA256  # the file README.md describes
    reference = json.loads(YOLOX_REFERENCE.read_text())
    for image, expected in reference["detections"].items():
        tensor, found = _run(YOLOX_NANO, IMAGES / image, score_threshold=0.1, iou_threshold=0.45)
        assert hashlib.sha256(tensor.tobytes()).hexdigest() == reference["input_sha256"][image], image
        for want in expected:
            same = [d for d in found if d.class_id == want["class_id"]]
            assert same, (image, want)
            ious = box_iou(np.array(want["box_xyxy_px"], np.float32), np.array([d.box for d in same], np.float32))
            got = same[int(ious.argmax())]
            assert np.abs(np.subtract(got.box, want["box_xyxy_px"])).max() < 0.01, (image, want, got)
            assert got.score == pytest.approx(want["score"], abs=1e-5), (image, want, got)
