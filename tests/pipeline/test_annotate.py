"""The one drawing of what the model sees (live view, --preview, evidence)."""

from __future__ import annotations

import math
from dataclasses import replace

import cv2
import numpy as np
import pytest
from support.assets import IMAGES, MODELS

from edgeinfer import Pipeline
from edgeinfer._samples import COCO_SKELETON, KEYPOINT_VISIBLE
from edgeinfer.pipeline.annotate import COCO_LIMB_COLOURS, LINE_COLOUR, ZONE_COLOUR, Geometry, annotate, colour
from edgeinfer.pipeline.postprocess import Classification, Detection, Detections, InstanceMask, Keypoint

YOLO_POSE = MODELS / "yolo11n-pose.onnx"


def _has(image: np.ndarray, bgr: tuple[int, int, int]) -> np.ndarray:
    return (image == np.array(bgr, np.uint8)).all(axis=-1)


def test_boxes_keypoints_masks_and_rotated_boxes_are_drawn_where_they_are():
    frame = np.zeros((480, 640, 3), np.uint8)
    mask = InstanceMask(300, 300, np.ones((40, 40), bool))
    result = Detections((
        Detection((100, 100, 200, 300), 0.9, 0, "person", 7, (Keypoint("nose", 150, 120, 0.9),)),
        Detection((300, 300, 340, 340), 0.8, 1, "car", None, (), mask),
        Detection((400, 50, 500, 150), 0.7, 2, "ship", None, (), None, (450, 100, 80, 40, 0.5)),
    ))
    drawn = annotate(frame, result)
    assert drawn is not frame and not frame.any()  # the frame itself is untouched
    assert _has(drawn[100:301, 98:103], colour(0)).any()  # the person's left edge
    assert _has(drawn[118:123, 148:153], colour(0)).any()  # its nose
    assert drawn[320, 320].any()  # the car's mask tints its pixels
    assert _has(drawn[50:150, 400:500], colour(2)).any() and not _has(drawn[0:40, 0:40], colour(2)).any()


def test_lines_and_zones_with_their_counts_and_a_width_bound():
    frame = np.full((720, 1280, 3), 90, np.uint8)
    geometry = Geometry({"door": (640, 700, 640, 20)}, {"shop": [(800, 100), (1200, 100), (1200, 500), (800, 500)]})
    counts = {"lines": {"door": {"in": 3, "out": 1}}, "zones": {"shop": {"inside": 2, "entries": 5}}}
    drawn = annotate(frame, [Classification(1, "cat", 0.8)], geometry=geometry, counts=counts, width=640)
    assert drawn.shape == (360, 640, 3)  # scaled to the width first
    assert _has(drawn[20:340, 318:323], LINE_COLOUR).any()  # the line at x = 640 / 2
    assert _has(drawn[48:52, 400:600], ZONE_COLOUR).any()  # the zone's top edge at y = 100 / 2
    assert not _has(annotate(frame, Detections(), width=640), LINE_COLOUR).any()  # no geometry: no lines


@pytest.mark.parametrize("photo", ["squat.bmp", "grace_hopper.bmp"])
def test_a_pose_models_people_get_cocos_limbs_between_their_seen_keypoints(photo):
    """YOLO11n-pose on a real photo: each of COCO's 19 limbs whose two keypoints the model is sure of is drawn in
    its body part's colour along its whole length; a limb with an unsure end is not (Grace Hopper's legs are out
    of the frame, the squat's left ear hidden)."""
    with Pipeline(YOLO_POSE, IMAGES / photo, reduced_decode=False) as pipeline:
        (result,) = [r.result for r in pipeline]
    frame = cv2.imread(str(IMAGES / photo))
    drawn, plain = annotate(frame, result), annotate(frame, Detections(tuple(replace(d, keypoints=()) for d in result)))
    person = result[0]
    assert len(person.keypoints) == 17
    drawn_limbs = hidden_limbs = 0
    for index, (a, b) in enumerate(COCO_SKELETON):
        start, end = person.keypoints[a], person.keypoints[b]
        if math.dist((start.x, start.y), (end.x, end.y)) < 12:
            continue  # too short to look along (an eye to the nose on a small face)
        along = [(round(start.x + t * (end.x - start.x)), round(start.y + t * (end.y - start.y)))
                 for t in np.linspace(0.3, 0.7, 5)]
        coloured = [_has(drawn[y - 1:y + 2, x - 1:x + 2], COCO_LIMB_COLOURS[index]).any() for x, y in along]
        if min(start.score, end.score) >= KEYPOINT_VISIBLE:
            assert sum(coloured) >= 4, (photo, person.keypoints[a].name, person.keypoints[b].name, coloured)
            drawn_limbs += 1
        else:
            assert not any(coloured), (photo, person.keypoints[a].name, person.keypoints[b].name)
            assert all((drawn[y, x] == plain[y, x]).all() for x, y in along)  # nothing else drawn there either
            hidden_limbs += 1
    assert drawn_limbs >= 8 and hidden_limbs >= 1, (drawn_limbs, hidden_limbs)


def test_keypoints_of_another_count_are_points_without_limbs():
    """Six face landmarks (BlazeFace's): points where they are, no line; one under the confidence the dashboard
    and the exports call seen (``KEYPOINT_VISIBLE``) is not drawn either."""
    frame = np.zeros((240, 320, 3), np.uint8)
    points = tuple(Keypoint(f"kp{i}", 60.0 + 40 * i, 120.0, 0.9 if i != 2 else KEYPOINT_VISIBLE - 0.1)
                   for i in range(6))
    drawn = annotate(frame, Detections((Detection((40, 80, 280, 160), 0.9, 0, "face", None, points),)))
    assert all(_has(drawn[119:122, x - 1:x + 2], colour(0)).any() for x in (60, 100, 180, 220, 260))
    assert not _has(drawn[115:126, 135:146], colour(0)).any()  # the unsure third point
    assert not drawn[110:130, 70:90].any()  # nothing between two points
    assert not any(_has(drawn, limb).any() for limb in set(COCO_LIMB_COLOURS))
def _label_pixels(drawn: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """(x, y) of the labels' white text: what changed to white."""
    ys, xs = np.nonzero(_has(drawn, (255, 255, 255)) & ~_has(frame, (255, 255, 255)))
    return np.stack([xs, ys], axis=1)


def test_labels_lie_inside_the_frame_clear_of_the_corners_where_the_editors_handles_are():
    """A zone in the frame's top-right corner and a line down its left edge: each label is whole inside the frame,
    and further from every corner and end than the editor's handles reach (radius: the longer side / 80)."""
    frame = np.full((360, 640, 3), 90, np.uint8)
    corner = [(440, 0), (640, 0), (640, 200), (440, 200)]
    for geometry, ends in ((Geometry({}, {"front door": corner}), corner),
                           (Geometry({"exit": (0, 10, 0, 350)}, {}), [(0, 10), (0, 350)])):
        counts = {"lines": {"exit": {"in": 12, "out": 3}}, "zones": {"front door": {"inside": 1, "entries": 40}}}
        drawn = annotate(frame, None, geometry=geometry, counts=counts)
        text = _label_pixels(drawn, frame)
        assert len(text) > 50  # the label was drawn
        reach = max(frame.shape[:2]) / 80
        nearest = min(np.hypot(*(text - np.array(end)).T).min() for end in ends)
        assert nearest > 2 * reach, (geometry, nearest)
        x1, y1 = text.min(axis=0)
        x2, y2 = text.max(axis=0)
        assert 0 < x1 < x2 < frame.shape[1] - 1 and 0 < y1 < y2 < frame.shape[0] - 1  # not cut at an edge
