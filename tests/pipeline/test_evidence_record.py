"""The detect / record split (issue 29): detection reads the scene at 640x480, the evidence comes from the same
scene at 1280x960 (``record_source``), read in step by frame number. The snapshot is the big frame with the box
and the line drawn at twice the detect coordinates; the clip is 1280x960. A record source that is missing is
refused at the start; one that ends early leaves the evidence to the detect frames, and detection goes on."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
from support import scenes
from support.pipeline import ULTRAFACE

from edgeinfer import Pipeline, open_source
from edgeinfer.errors import CaptureError
from edgeinfer.forms.evidence import PLAIN_SNAPSHOT_NAME
from edgeinfer.pipeline.annotate import colour
from edgeinfer.pipeline.evidence import EvidenceStore

LINE = "door=" + ",".join(str(v) for v in scenes.LINE)
BIG = (1280, 960)
FRAMES = 75  # the first crossing counts at frame 37 (after the line's hold), its post-roll 1 s (30 frames)


def _run(detect, record, folder):
    got: list[dict] = []
    with Pipeline(ULTRAFACE, detect, task="detect", lines=[LINE], line_band=scenes.BAND, events=["line_crossed:door"],
                  evidence_dir=folder, evidence_pre_s=1.0, evidence_post_s=1.0, evidence_width=BIG[0],
                  record_source=record, max_frames=FRAMES) as pipeline:
        pipeline.add_event_listener(got.append)
        results = list(pipeline)
    event = min(got, key=lambda e: e["frame_id"])
    stored = EvidenceStore(folder).get(event["event_id"])
    assert stored is not None
    return event, stored, results


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("record")
    return tmp, scenes.make_scene_clip(tmp / "detect.avi"), scenes.make_scene_clip(tmp / "record.avi", size=BIG)


def test_the_snapshot_and_clip_come_from_the_record_stream_with_the_box_at_its_scale(clips):
    tmp, detect, record = clips
    event, stored, _ = _run(detect, record, tmp / "ev")
    n = event["frame_id"]
    plain = cv2.imread(str(stored.folder / PLAIN_SNAPSHOT_NAME))
    drawn = cv2.imread(str(stored.folder / "snapshot.jpg"))
    assert plain.shape == drawn.shape == (BIG[1], BIG[0], 3)
    # the record stream's frame n (the same moment), not another
    truth = [cv2.resize(scenes.render_frames()[i], BIG) for i in (n - 1, n, n + 1)]
    errors = [np.abs(plain.astype(int) - frame).mean() for frame in truth]
    assert errors[1] < 5 and errors[1] < min(errors[0], errors[2])
    # the box's left edge in its class's colour at 2x the detect coordinates (the box is in detect pixels)
    x1, y1, _, y2 = (round(2 * v) for v in event["box"])
    tint = colour(int(event["label"]))  # Ultraface's labels are its class ids

    def off_tint(image):
        return np.abs(image[y1 + 30:y2 - 30, x1 - 1:x1 + 2].reshape(-1, 3).astype(int) - tint).max(axis=1).mean()

    assert off_tint(drawn) < 25 < 60 < off_tint(plain)
    # the line at x = 640 (320 in the detect frame), drawn on the snapshot only
    assert np.abs(drawn[400:520, 637:644].astype(int) - plain[400:520, 637:644]).mean() > 30
    with open_source(str(stored.clip_path)) as clip:
        first = clip.read()
    assert first is not None and first.shape == (BIG[1], BIG[0], 3)


def test_a_missing_record_source_is_refused_at_the_start(clips):
    tmp, detect, _ = clips
    with pytest.raises(CaptureError):
        Pipeline(ULTRAFACE, detect, task="detect", lines=[LINE], events=["line_crossed:door"],
                 evidence_dir=tmp / "missing", record_source=str(tmp / "no-such.avi"))


def test_a_record_source_that_ends_early_leaves_the_evidence_to_the_detect_frames(clips, caplog):
    tmp, detect, _ = clips
    short = scenes.make_scene_clip(tmp / "short.avi", size=BIG, frames=20)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.pipeline.record"):
        _, stored, results = _run(detect, short, tmp / "ev-short")
    assert len(results) == FRAMES  # detection never stopped
    assert cv2.imread(str(stored.folder / "snapshot.jpg")).shape == (480, 640, 3)  # the detect frame's
    assert any("falls back" in record.getMessage() for record in caplog.records)


def test_run_passes_record_source_to_the_pipeline(clips):
    from click.testing import CliRunner

    from edgeinfer.cli import main as cli

    tmp, detect, record = clips
    args = ["run", str(ULTRAFACE), "--source", str(detect), "--task", "detect", "--line", LINE,
            "--event", "line_crossed:door", "--evidence-dir", str(tmp / "ev-cli"), "--max-frames", str(FRAMES),
            "--json"]
    refused = CliRunner().invoke(cli, [*args[:4], "--record-source", str(record)])
    assert refused.exit_code == 2 and "--record-source goes with --event" in refused.output
    missing = CliRunner().invoke(cli, [*args, "--record-source", str(tmp / "no-such.avi")])
    assert missing.exit_code == 1 and "no-such.avi" in missing.output  # the flag reaches the pipeline
