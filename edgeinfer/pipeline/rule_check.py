"""The pipeline's rules checked against the model it reads: the labels they name and the scores they watch.

An event rule (``detection:0.8/person``, ``line_crossed:door/car``; pipeline/events.py) or a capture rule
(``uncertain:0.3-0.6/person``, ``event:detection:0.9/dog``; pipeline/sampling.py) is parsed and checked on its own
when the options are made; what it means for *this* model is known only once the model is read
(:func:`~.tasks.read_run_model`, which calls :func:`check_rules`): so ``Pipeline(...)``, ``edgeinfer run``, the
agent's start and ``edgeinfer agent --check`` all refuse the same rules with the same words, before any source is
opened:

- a label the model does not have would never match: ValueError, with the closest of the model's labels
  ("did you mean 'person'?"). A model without labels names its classes by number (``0``, ``1``, ...): a label
  that is not a number cannot be checked — a warning, not an error (the labels may come with a later model);
- an ``uncertain`` band that starts below ``score_threshold`` on a model whose results are boxes: the decoder
  drops every box scored under the threshold before any rule sees it, so that part of the band would never
  keep a frame — ValueError saying so (docs/datasets.md, "Bands and the score threshold": why this is refused
  rather than decoded at a lower threshold for the rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._config import suggestion

if TYPE_CHECKING:
    from .labels import Labels

#: a model's labels listed in an error at most (ImageNet has 1000)
_LISTED = 40


def named_labels(options: Any) -> list[tuple[str, str]]:
    """(rule as written, label) for every label an event or capture rule of ``options`` names, in order.
    The rules' modules are imported only when there are rules (a pipeline without them loads neither)."""
    named: list[tuple[str, str]] = []
    if options.events:
        from .events import EventRule

        for text in options.events:
            named += [(f"event rule {text.strip()!r}", label) for label in sorted(EventRule.parse(text).labels)]
    if options.capture:
        from .sampling import CaptureRule

        for text in options.capture:
            rule = CaptureRule.parse(text)
            labels = rule.event.labels if rule.event is not None else rule.labels
            named += [(f"capture rule {rule.text!r}", label) for label in sorted(labels)]
    return named


def check_rules(options: Any, labels: Labels | None, model: str | Path, *, thresholded_boxes: bool) -> tuple[str, ...]:
    """ValueError for a rule of ``options`` that cannot work with ``model`` read with ``labels`` (the module says
    which; ``thresholded_boxes``: its results are boxes its decoder drops under ``score_threshold``); the warnings
    about what could not be checked."""
    name = Path(str(model)).name
    warnings: list[str] = []
    known = labels.names() if labels is not None and len(labels) else None
    for rule, label in named_labels(options):
        if known is None:
            if not label.isdigit():  # without labels a class is named by its number: "3" can match
                warnings.append(f"{rule}: {name} has no labels (its classes are named 0, 1, ...): label {label!r} "
                                "cannot be checked and matches nothing unless the model is given labels "
                                "(labels: FILE / --labels)")
        elif label not in known:
            raise ValueError(f"{rule}: {name} has no label {label!r}{suggestion(label, known, limit=_LISTED)}")
    if options.capture and thresholded_boxes:
        _check_bands(options, float(options.score_threshold))
    return tuple(warnings)


def _check_bands(options: Any, threshold: float) -> None:
    from .sampling import CaptureRule

    for text in options.capture:
        rule = CaptureRule.parse(text)
        if rule.kind == "uncertain" and rule.low < threshold:
            raise ValueError(
                f"capture rule {rule.text!r}: the band starts below score_threshold {threshold:g} — the decoder "
                f"drops every box scored under {threshold:g} before any rule sees it, so boxes in "
                f"[{rule.low:g}, {min(threshold, rule.high):g}) would never be kept; set score_threshold to "
                f"{rule.low:g} (results and events then keep those boxes too) or start the band at {threshold:g}")
