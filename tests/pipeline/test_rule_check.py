"""Rules checked against the model a pipeline reads (pipeline/rule_check.py): a label the model does not have is
refused with the closest one it has, before any source is opened; a model without labels gets a warning; an
``uncertain`` band that starts below the score threshold is refused on a model whose decoder drops those boxes,
and with the threshold lowered the band really sees the boxes under 0.5 (the real COCO SSD on a shared photo)."""

from __future__ import annotations

import json
import logging

import pytest
from support.assets import IMAGENET_LABELS, IMAGES, LABELS, MOBILENET_TINY, MODELS

from edgeinfer import Pipeline
from edgeinfer._samples import SAMPLE_META_NAME
from edgeinfer.capture import make_test_clip
from edgeinfer.pipeline.multi import MultiPipeline

SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
COCO = LABELS / "coco_labels.txt"
MOVENET = MODELS / "movenet_single_pose_lightning_ptq.tflite"
NO_CAMERA = "/dev/video99"  # never opened: the rules are refused when the model is read, before the source


@pytest.mark.parametrize(("options", "words"), [
    ({"events": ["detection:0.8/persn"]}, "event rule 'detection:0.8/persn': {model} has no label 'persn' — did you "
                                          "mean 'person'?"),
    ({"events": ["line_crossed:door/person,bycicle"], "lines": ["door=0,0,10,10"]},
     "event rule 'line_crossed:door/person,bycicle': {model} has no label 'bycicle' — did you mean 'bicycle'?"),
    ({"capture": ["uncertain:0.5-0.7/kyte"]}, "capture rule 'uncertain:0.5-0.7/kyte': {model} has no label 'kyte' — "
                                              "did you mean 'kite'?"),
    ({"capture": ["event:detection:0.9/dgo"]}, "capture rule 'event:detection:0.9/dgo': {model} has no label 'dgo' — "
                                               "did you mean 'dog'?"),
    ({"events": ["detection/xyzzy"]}, "has no label 'xyzzy' (known: person, bicycle, car"),
], ids=["detection", "line_crossed", "uncertain", "capture-event", "nothing-close"])
def test_a_rule_naming_a_label_the_model_lacks_is_refused_with_the_closest(tmp_path, options, words):
    if "capture" in options:
        options = {**options, "capture_dir": tmp_path / "c"}
    expected = words.format(model=SSD.name)
    with pytest.raises(ValueError) as info:
        Pipeline(SSD, NO_CAMERA, labels=COCO, **options)
    assert expected in str(info.value)
    with pytest.raises(ValueError) as info:  # several streams: the same check, the same words
        MultiPipeline(SSD, {"door": NO_CAMERA, "yard": NO_CAMERA}, labels=COCO, **options)
    assert expected in str(info.value)
    assert not (tmp_path / "c").exists()


def test_labels_the_model_has_are_taken_and_a_model_without_labels_is_a_warning(tmp_path, caplog):
    with Pipeline(SSD, IMAGES, labels=COCO, events=["detection:0.5/person,kite"], max_frames=2) as pipeline:
        assert len(list(pipeline)) == 2 and pipeline.reading.notes == ()
    caplog.set_level(logging.WARNING)
    with Pipeline(SSD, IMAGES, events=["detection:0.5/person", "detection:0.5/0"], max_frames=2) as pipeline:
        list(pipeline)
    [note] = pipeline.reading.notes  # "0" names class 0 of a model without labels: no warning for it
    assert f"{SSD.name} has no labels" in note and "'person' cannot be checked" in note
    assert note in caplog.text


@pytest.fixture(scope="module")
def kites(tmp_path_factory):
    """kite_and_cold.jpg as a clip: the SSD scores a kite at 0.418 and more boxes between 0.3 and 0.5."""
    folder = tmp_path_factory.mktemp("kites")
    return make_test_clip(folder / "kites.avi", [IMAGES / "kite_and_cold.jpg"], frames_per_image=3)


def test_an_uncertain_band_below_the_score_threshold_is_refused_and_lowered_it_sees_those_boxes(kites, tmp_path):
    with pytest.raises(ValueError) as info:
        Pipeline(SSD, kites, labels=COCO, capture=["uncertain:0.3-0.6"], capture_dir=tmp_path / "c")
    assert str(info.value) == (
        "capture rule 'uncertain:0.3-0.6': the band starts below score_threshold 0.5 — the decoder drops every box "
        "scored under 0.5 before any rule sees it, so boxes in [0.3, 0.5) would never be kept; set score_threshold "
        "to 0.3 (results and events then keep those boxes too) or start the band at 0.5")
    with pytest.raises(ValueError, match=r"boxes in \[0.1, 0.2\) would never be kept"):  # wholly below it too
        Pipeline(SSD, kites, labels=COCO, capture=["uncertain:0.1-0.2"], capture_dir=tmp_path / "c",
                 score_threshold=0.25)
    # what the docs say to do: the threshold at the band's low end; the band then keeps boxes scored under 0.5
    with Pipeline(SSD, kites, labels=COCO, capture=["uncertain:0.3-0.6"], capture_dir=tmp_path / "c",
                  score_threshold=0.3, capture_per_minute=1000) as pipeline:
        results = list(pipeline)
    assert results and all(d.score > 0.3 for r in results for d in r.result)  # results at the pipeline's threshold
    kept = [json.loads(meta.read_text()) for meta in (tmp_path / "c").glob(f"*/{SAMPLE_META_NAME}")]
    assert len(kept) == len(results)  # every frame has a box in the band
    under = sorted({round(d["score"], 3) for sample in kept for d in sample["detections"] if d["score"] < 0.5})
    assert under and min(under) >= 0.3, under  # boxes the default threshold would have hidden: kept, and stored
    # a classifier's top-1 and MoveNet's one person are kept whatever they score: there a band sees every score
    with Pipeline(MOBILENET_TINY, IMAGES, labels=IMAGENET_LABELS, capture=["uncertain:0.0-0.3"], max_frames=1,
                  capture_dir=tmp_path / "a") as pipeline:
        assert pipeline.reading.task == "classify" and len(list(pipeline)) == 1
    with Pipeline(MOVENET, IMAGES, capture=["uncertain:0.0-0.3"], capture_dir=tmp_path / "b",
                  max_frames=1) as pipeline:
        assert pipeline.reading.layout.name == "movenet" and len(list(pipeline)) == 1
