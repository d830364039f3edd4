"""``edgeinfer evaluate``: a model scored on labelled field data, and compared with the model the fleet runs.

The library entry points are :func:`evaluate_model` (one model) and :func:`compare_models` (a candidate and a
baseline on the same frames, and whether the candidate is worse by more than a tolerance). docs/datasets.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import DatasetError
from .datasets import FORMATS, Dataset, read_dataset
from .names import match_names

#: the figure a comparison judges, per kind of model
HEADLINE = {"detect": "map50_95", "classify": "accuracy"}
#: the figures a comparison reports deltas of
FIGURES = {"detect": ("map50_95", "map50"), "classify": ("accuracy", "top5")}
#: a pose comparison's keypoint figures (both models scored on keypoints): reported, and the first judged too
KEYPOINT_FIGURES = ("keypoints_map50_95", "keypoints_map50")
#: how much worse (absolute) the candidate's headline figure may be before --require-eval refuses it
DEFAULT_TOLERANCE = 0.01


@dataclass(frozen=True)
class EvaluateOptions:
    """How models are run on a dataset (each model's own reading unless given)."""

    format: str | None = None
    delegate: str | None = None
    labels: str | Path | None = None
    task: str | None = None
    #: the layout the outputs are read as (a built-in decoder's name or an installed plug-in's; None: chosen)
    decoder: str | None = None
    ignore_unknown: bool = False
    #: score on these of the dataset's classes only (None: every class the model knows)
    classes: frozenset[str] | None = None


def evaluate_model(model: str | Path, dataset: str | Path | Dataset, options: EvaluateOptions = EvaluateOptions(),
                   say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``model``'s scores on ``dataset`` (a folder or a read :class:`Dataset`): accuracy and top-5 for a
    classifier, mAP50 / mAP50-95 / per-class AP50 and recall for a detector, and for a pose model on a dataset
    with keypoint labels its keypoints' OKS mAP50-95 / mAP50 (``keypoints_map50_95``, ``keypoints_map50``; None
    when not scored, ``keypoints`` saying why)."""
    from .runner import open_model, run_images
    from .scoring import classification_scores, detection_scores

    data = dataset if isinstance(dataset, Dataset) else read_dataset(dataset, options.format)
    under_test = open_model(model, delegate=options.delegate, labels=options.labels, task=options.task,
                            decoder=options.decoder)
    try:
        if under_test.kind != data.kind:
            raise DatasetError(f"{Path(model).name} reads as a {under_test.kind} model (task "
                                  f"{under_test.reading.task}); the dataset {data.root} is labelled for {data.kind}")
        mapping = match_names(data.names, under_test.names, ignore_unknown=options.ignore_unknown,
                              model_path=Path(model).name)
        if options.classes is not None:
            mapping = {name: cid for name, cid in mapping.items() if name in options.classes}
        if not mapping:
            raise DatasetError(f"none of the dataset's classes is among {Path(model).name}'s")
        outputs = list(run_images(under_test, [s.path for s in data.samples], say))
        kpt_shape = under_test.engine.model.metadata.kpt_shape
    finally:
        under_test.engine.close()
    if data.kind == "classify":
        scores = classification_scores(data.samples, [o.found for o in outputs], mapping)
    else:
        scores = {**detection_scores(data.samples, outputs, mapping),
                  **_keypoints(model, under_test.reading.task, kpt_shape, data, outputs, mapping)}
    ignored = sorted(set(data.names) - set(mapping))
    return {"model": str(model), "dataset": data.source or str(data.root), "format": data.format, "kind": data.kind,
            "task": under_test.reading.task, "layout": under_test.reading.layout.name,
            "ignored_classes": ignored, **scores}


def _keypoints(model: str | Path, task: str, kpt_shape: tuple[int, int] | None, data: Dataset,
               outputs: list[Any], mapping: dict[str, int]) -> dict[str, Any]:
    """The keypoint figures: scored when the dataset has keypoint labels and the model gives keypoints, as many
    as the labels have (else DatasetError naming both counts)."""
    from .scoring import keypoint_scores

    none = {"keypoints_map50_95": None, "keypoints_map50": None}
    if not data.keypoints:
        return {**none, "keypoints": None}
    given = next((len(d.keypoints) for o in outputs for d in o.found if d.keypoints),
                 kpt_shape[0] if kpt_shape else None)
    if task != "pose" or not given:
        return {**none, "keypoints": {"count": data.keypoints, "scored": False,
                                      "why": f"{Path(model).name} gives no keypoints (task {task})"}}
    if given != data.keypoints:
        raise DatasetError(f"{Path(model).name} gives {given} keypoints a detection; the dataset's labels have "
                           f"{data.keypoints}")
    scores = keypoint_scores(data.samples, outputs, mapping, data.keypoints)
    return {"keypoints_map50_95": scores["map50_95"], "keypoints_map50": scores["map50"],
            "keypoints": {**scores, "scored": True}}


def compare_models(candidate: str | Path, baseline: str | Path, dataset: str | Path | Dataset,
                   options: EvaluateOptions = EvaluateOptions(), tolerance: float = DEFAULT_TOLERANCE,
                   say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both models on the same frames (``dataset``: a folder or a read :class:`Dataset`); the deltas (candidate -
    baseline) and whether the candidate is worse than the baseline by more than ``tolerance`` on a ``judged``
    figure (``worse``): the headline figure, and for two pose models on keypoint labels the keypoints' OKS
    mAP50-95 too."""
    # read once: both models see exactly the same frames
    data = dataset if isinstance(dataset, Dataset) else read_dataset(dataset, options.format)
    if options.ignore_unknown and options.classes is None:  # and are judged on the same classes
        shared = _known_classes(candidate, data, options) & _known_classes(baseline, data, options)
        options = dataclasses.replace(options, classes=frozenset(shared))
    ours = evaluate_model(candidate, data, options, say)
    theirs = evaluate_model(baseline, data, options, say)
    headline = HEADLINE[data.kind]
    figures = FIGURES[data.kind]
    judged = [headline]
    if ours.get(KEYPOINT_FIGURES[0]) is not None and theirs.get(KEYPOINT_FIGURES[0]) is not None:
        figures, judged = figures + KEYPOINT_FIGURES, [headline, KEYPOINT_FIGURES[0]]  # two pose models
    deltas = {name: ours[name] - theirs[name] for name in figures}
    return {"candidate": ours, "baseline": theirs, "headline": headline, "judged": judged, "deltas": deltas,
            "tolerance": tolerance, "worse": any(deltas[name] < -tolerance for name in judged)}


def _known_classes(model: str | Path, data: Dataset, options: EvaluateOptions) -> set[str]:
    """The dataset's classes ``model`` knows by name: a model that leaves classes out is not judged on fewer
    classes than the one it is compared with (the headline figure would favour it)."""
    from .runner import open_model

    under_test = open_model(model, delegate=options.delegate, labels=options.labels, task=options.task,
                            decoder=options.decoder)
    try:
        return set(match_names(data.names, under_test.names, ignore_unknown=True))
    finally:
        under_test.engine.close()


__all__ = ["DEFAULT_TOLERANCE", "FORMATS", "EvaluateOptions", "compare_models", "evaluate_model", "read_dataset"]
