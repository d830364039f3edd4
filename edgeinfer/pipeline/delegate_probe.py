"""The delegate probe: the fastest runtime whose answers agree with the reference's, chosen by measurement.

When the choice is free (:func:`edgeinfer.runtime.selection.free_choice`: no delegate and no profile named, not
strict, more than one candidate of the plan can run the model), a run's first engine is chosen so, once per
model, runtime versions and machine (:mod:`edgeinfer.runtime.choice` keeps the choice):

1. the plan's first candidate that loads is the **reference** (what runs without the probe);
2. each other candidate that runs the same model file is loaded and fed the **judgement frames** through
   the pipeline's own preprocessing: the first frame of the run's file source (an image, a folder, a video
   file — read again apart, the run's own source untouched), and a synthetic frame. A live source (camera,
   stream) is never read for it: a camera may not open twice, and its frames belong to the run;
3. each one's answers — what the task's decoder gives, boxes after NMS or the class scores' top-1 — are
   judged against the reference's by :mod:`.agreement`, as ``edgeinfer optimize`` judges an optimised model
   (boxes at score 0.25 after NMS at IoU 0.7: recall, precision, mAP50 and mean IoU each at least 0.8; top-1
   on at least 95 % of the decisive frames). A candidate whose answers differ — a bfloat16 or INT8 path that
   changes them — is never chosen, nor one that could not be judged (the reference finds no box and no
   decisive class on the frames: nothing shows that the other runtime would find the same);
4. the engines are timed in interleaved blocks (:func:`~edgeinfer.runtime.timing.interleaved_latency`): up to
   3 rounds of about 3 invokes each after an untimed one, as many rounds as what is left of the budget holds
   (``$EDGEINFER_DELEGATE_PROBE_BUDGET_S``, 4 s, counted from the reference's load: the other loads, the
   judgement, the timing). Every candidate is loaded, judged and timed once at least — a plan holds a few —
   so a slow model on a busy machine overruns the budget, and the result says by how much; medians compared;
5. the fastest that agrees runs, when its median is at least :data:`MIN_GAIN` under the reference's — else
   the reference (a brief measurement on a machine that may be busy does not switch runtimes for noise).

A choice judged only on the synthetic frame (``judged`` false: it kept the reference) is measured again by the
next run that has a file to take a frame from.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime.choice import (
    Measurement,
    ProbeResult,
    cache_key,
    cached_choice,
    keep_choice,
    probe_budget,
    probe_disabled,
)
from ..runtime.selection import free_choice

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.engine import Engine
    from ..runtime.model import ModelInfo
    from ..runtime.selection import Plan
    from .options import PipelineOptions
    from .tasks import ModelReading

log = logging.getLogger("edgeinfer.pipeline")

#: another runtime replaces the reference only when its median invoke is at least this much shorter
MIN_GAIN = 0.1
#: interleaved rounds at most (fewer when the budget left holds fewer), untimed invokes before each block, and
#: about how many timed invokes a block holds (a faster engine gets more in the same time)
ROUNDS = 3
SETTLE = 1
BLOCK_INVOKES = 3
#: the synthetic judgement frame's size (width, height)
SYNTHETIC_SIZE = (640, 480)


@dataclass(frozen=True)
class JudgementFrames:
    """The frames the answers are compared on, and what they are in words."""

    frames: tuple[np.ndarray, ...]
    names: tuple[str, ...]
    described: str
    #: one of them is a frame of the run's own source (not only the synthetic one)
    real: bool


def synthetic_frame(size: tuple[int, int] = SYNTHETIC_SIZE) -> np.ndarray:
    """A fixed, non-trivial BGR frame: a graded sky over a textured ground, shapes of several colours and sizes
    with hard and soft edges, a little noise. Detectors trained on photographs seldom find an object in it, so
    a detector is judged on it only when a candidate adds boxes; it is the fallback when no frame of the run's
    source can be read."""
    import cv2
    import numpy as np

    width, height = size
    rng = np.random.default_rng(37)
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    sky = np.array([200, 160, 110], np.float32) * (1 - rows) + np.array([120, 140, 150], np.float32) * rows
    frame = np.broadcast_to(sky, (height, width, 3)).copy()
    horizon = height * 3 // 5
    frame[horizon:] = np.array([70, 110, 90], np.float32) + rng.normal(0, 18, (height - horizon, width, 3))
    frame = np.clip(frame, 0, 255).astype(np.uint8)
    for _ in range(12):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        w, h = int(rng.integers(width // 20, width // 4)), int(rng.integers(height // 20, height // 3))
        if rng.random() < 0.5:
            cv2.rectangle(frame, (x, y), (x + w, y + h), colour, -1)
        else:
            cv2.ellipse(frame, (x, y), (w // 2, h // 2), float(rng.integers(0, 180)), 0, 360, colour, -1)
    frame = cv2.GaussianBlur(frame, (3, 3), 0)
    noise = rng.integers(-6, 7, frame.shape, dtype=np.int16)
    return np.clip(frame.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def _file_frame(source: Any) -> tuple[np.ndarray, str] | None:
    """The first frame of ``source`` when it is a file (image, folder, video file), read by a source of its own;
    None for a live source, a synthetic one, or one that does not read."""
    from ..capture import FrameSource, ImageFolderSource, SyntheticSource, open_source

    if isinstance(source, FrameSource):
        if source.live or isinstance(source, SyntheticSource):
            return None
        target = (source.paths[0] if source.paths else source.pattern) if isinstance(source, ImageFolderSource) \
            else getattr(source, "path", None)
        if target is None:
            return None
        text = str(target)
    elif isinstance(source, (str, os.PathLike)) and not isinstance(source, bool):
        text = os.fspath(source).strip()
        if not (Path(text).expanduser().exists() or any(ch in text for ch in "*?[")):
            return None  # a camera index, a URL, a GStreamer pipeline …
    else:
        return None
    try:
        again = open_source(text, open_now=False, reduced=False)
        if again.live or isinstance(again, SyntheticSource):
            return None
        again.open()
        try:
            frame = again.read()
        finally:
            again.close()
    except Exception as exc:  # the run opens its source itself and says what is wrong with it
        log.debug("the delegate probe could not read a frame of %s: %s", text, exc)
        return None
    return (frame, Path(text).name or text) if frame is not None else None


def judgement_frames(sources: Iterable[Any] = (), image: str | os.PathLike | None = None) -> JudgementFrames:
    """The first frame of the first file among ``sources`` (or of ``image``), then the synthetic frame."""
    found = _file_frame(image) if image is not None else None
    for source in () if found is not None else sources:
        found = _file_frame(source)
        if found is not None:
            break
    synthetic = synthetic_frame()
    if found is None:
        return JudgementFrames((synthetic,), ("synthetic",), "a synthetic frame (no file source to take a frame from)",
                               False)
    frame, name = found
    return JudgementFrames((frame, synthetic), (name, "synthetic"), f"the first frame of {name} and a synthetic frame",
                           True)


# ----------------------------------------------------------------------------------------- answers

@dataclass(frozen=True)
class Answers:
    """One engine's answers on the judgement frames: boxes per frame, or class scores per frame."""

    kind: str  # "boxes", "top1" or "" (neither: the probe cannot judge the task's results)
    per_frame: list[Any]
    #: seconds of its last invoke (the timing's first estimate)
    invoke_s: float


def judgement_reading(row: Any, options: PipelineOptions, task: str | None = None,
                      layout: str | None = None) -> ModelReading:
    """How the run reads ``row`` (its task, layout and preprocessing), decoding as the judgement does: the boxes
    down to the ranking floor after NMS at the judgement's IoU, as many as it keeps."""
    from .agreement import AP_SCORE_FLOOR, DEFAULT_NMS_IOU, MAX_BOXES
    from .decoders import DecoderSettings, model_labels
    from .tasks import read_model

    settings = DecoderSettings(top_k=5, score_threshold=AP_SCORE_FLOOR, iou_threshold=DEFAULT_NMS_IOU,
                               max_detections=MAX_BOXES)
    return read_model(row, task=task or options.task, decoder=layout or options.decoder,
                      labels=model_labels(row.model), settings=settings, **options.feed_options())


def answers(engine: Engine, reading: ModelReading, judged: JudgementFrames) -> Answers:
    """Each judgement frame through the pipeline's Preprocessor into ``engine``, invoked, read by ``reading``."""
    from .agreement import Box
    from .binding import size_inputs
    from .engine_worker import BatchRow
    from .postprocess import class_scores

    row = BatchRow(engine, 0)
    kind = "boxes" if reading.gives_boxes else "top1" if reading.task == "classify" else ""
    per_frame: list[Any] = []
    invoke_s = 0.0
    for frame in judged.frames:
        pre = reading.preprocessor(row.inputs[0], (frame.shape[1], frame.shape[0]))
        transform = pre(frame, row.input_view(0))
        for index in size_inputs(reading.decoder):  # D-FINE's orig_target_sizes, as the binding sets them
            row.input_view(index)[...] = (pre.width, pre.height)
        start = time.perf_counter()
        engine.invoke()
        invoke_s = time.perf_counter() - start
        if kind == "boxes":
            per_frame.append([Box(tuple(map(float, d.box)), float(d.score), int(d.class_id))
                              for d in reading.decoder(transform)])
        elif kind == "top1":
            per_frame.append(class_scores(row.output_view(0), row.outputs[0]).tolist())
    return Answers(kind, per_frame, invoke_s)


def _judgeable(reference: Answers) -> bool:
    """Whether the reference's answers give anything to judge another's by: a box at the judgement's score, or a
    decisive top-1, on some frame."""
    from .agreement import DEFAULT_AMBIGUOUS_MARGIN, DEFAULT_SCORE_THRESHOLD, compare_top1

    if reference.kind == "boxes":
        return any(box.score >= DEFAULT_SCORE_THRESHOLD for boxes in reference.per_frame for box in boxes)
    if reference.kind == "top1":
        return any(not compare_top1(scores, scores).ambiguous(DEFAULT_AMBIGUOUS_MARGIN)
                   for scores in reference.per_frame)
    return False


def judge(reference: Answers, candidate: Answers, judged: JudgementFrames) -> tuple[bool | None, str]:
    """Whether ``candidate``'s answers agree with ``reference``'s, by :mod:`.agreement` with its defaults (None:
    they cannot be judged), and the verdict in words."""
    from .agreement import (
        DEFAULT_BOX_MINIMUMS,
        DEFAULT_MIN_AGREEMENT,
        DEFAULT_SCORE_THRESHOLD,
        box_agreement,
        compare_top1,
        figure_text,
        shortfalls,
        top1_agreement,
    )

    if reference.kind == "boxes":
        # the reference's boxes at the operating score (they stand for the truth); the candidate's down to the
        # floor, which rank for mAP50 — as optimize compares (a box above the score is the same after NMS either way)
        truth = [[box for box in boxes if box.score >= DEFAULT_SCORE_THRESHOLD] for boxes in reference.per_frame]
        boxes = box_agreement(list(judged.names), truth, candidate.per_frame, score_threshold=DEFAULT_SCORE_THRESHOLD)
        counted = f"{boxes.matched} of {boxes.reference_boxes} boxes found, {boxes.candidate_boxes} given"
        if not boxes.reference_boxes:
            if boxes.candidate_boxes:
                return False, (f"disagrees: finds {boxes.candidate_boxes} box(es) at score >= "
                               f"{DEFAULT_SCORE_THRESHOLD:g} where the reference finds none")
            return None, f"not judged: the reference finds no box at score >= {DEFAULT_SCORE_THRESHOLD:g}"
        failed = shortfalls(boxes, DEFAULT_BOX_MINIMUMS)
        if failed:
            return False, f"disagrees: {counted}; " + ", ".join(failed.values())
        return True, f"agrees: {counted}, " + ", ".join(figure_text(name, getattr(boxes, name))
                                                        for name in ("map50", "mean_iou"))
    if reference.kind == "top1":
        rows = [compare_top1(a, b) for a, b in zip(reference.per_frame, candidate.per_frame)]
        share, decisive = top1_agreement(rows)
        if share is None:
            return None, "not judged: the reference's top-1 is decisive on no frame"
        hits = round(share * decisive)
        if share < DEFAULT_MIN_AGREEMENT:
            return False, f"disagrees: the top-1 is the reference's on {hits} of {decisive} decisive frame(s)"
        return True, f"agrees: the top-1 is the reference's on {hits} of {decisive} decisive frame(s)"
    return None, "not judged: its results are neither boxes nor class scores"


# ----------------------------------------------------------------------------------------- the probe

class DelegateProbe:
    """The probe of one model under one plan: the cached choice, or the candidates measured now."""

    def __init__(self, the_plan: Plan, info: ModelInfo, options: PipelineOptions, *, threads: int | None = None,
                 batch: int | None = None, env: Mapping[str, str] | None = None, capture_threads: int = 0) -> None:
        from ..runtime.selection import runtime_thread_count

        self.plan, self.info, self.options = the_plan, info, options
        #: what a run without the probe would give the runtime (``selection.load``'s rule): the candidates are
        #: measured at it, and the choice is kept per it
        self.threads = runtime_thread_count(the_plan, threads, capture_threads)
        env = os.environ if env is None else env
        if not options.delegate_probe:
            self.indices, self.skipped = (), "the probe is off (delegate_probe: false, --no-probe)"
        elif probe_disabled(env):
            self.indices, self.skipped = (), "the probe is off ($EDGEINFER_DELEGATE_PROBE)"
        else:
            self.indices, self.skipped = free_choice(the_plan, batch=batch)
        self.budget_s = probe_budget(env)
        self._key: dict[str, Any] | None = None
        self.notes: tuple[str, ...] = ()

    @property
    def wanted(self) -> bool:
        """Whether the choice is the probe's (else the plan's first runs, and ``skipped`` says why)."""
        return bool(self.indices)

    @property
    def key(self) -> dict[str, Any]:
        if self._key is None:
            candidates = [(self.plan.candidates[i].name, self.plan.candidates[i].spec) for i in self.indices]
            host = self.plan.detection.host if self.plan.detection is not None else None
            self._key = cache_key(candidates, self.info, self.threads, host)
        return self._key

    def cached(self) -> ProbeResult | None:
        """The choice kept for this model, runtimes and machine, if any (with a note when the cache does not read)."""
        result, problem = cached_choice(self.key)
        if problem:
            self.notes = (*self.notes, problem)
        return dataclasses.replace(result, notes=self.notes) if result is not None else None

    def load_cached(self, result: ProbeResult) -> Engine | None:
        """The cached choice's engine (its plan says so), or None when it no longer loads (then measure again)."""
        from ..runtime.selection import load_candidate

        index = next((i for i in self.indices if self.plan.candidates[i].spec == result.chosen), None)
        if index is None:
            return None
        try:
            engine = load_candidate(self.plan, index, threads=self.threads)
        except Exception as exc:  # a runtime that broke since: measured again
            log.warning("the delegate probe's cached choice %s does not load (%s): measuring again", result.chosen, exc)
            return None
        engine.fallback_reason = None
        engine.selection = dataclasses.replace(engine.selection, probe=result, fallback_reason=None)
        return engine

    def measure(self, judged: JudgementFrames, *, keep: bool = True) -> tuple[Engine, ProbeResult | None]:
        """Load, judge and time the candidates; the chosen one's engine (the others closed) and the result — None
        when the reference's results could not be read for judging (then it runs, as without the probe)."""
        from ..runtime.selection import load_first

        reference_engine = load_first(self.plan, self.info, threads=self.threads)
        started = time.monotonic()
        final = reference_engine.selection
        assert final is not None and final.selected is not None
        reference = final.selected
        try:
            reading = judgement_reading(_row(reference_engine), self.options)
            reference_answers = answers(reference_engine, reading, judged)
        except Exception as exc:  # the run reads the model itself and says what is wrong with it
            log.info("the delegate probe cannot read %s's results (%s): running on %s", self.info.path, exc,
                     final.candidates[reference].spec)
            return reference_engine, None
        engines: dict[int, Engine] = {reference: reference_engine}
        verdicts: dict[int, tuple[bool | None, str]] = {reference: (None, "the reference")}
        estimates = {reference: reference_answers.invoke_s}
        for index in self.indices:
            candidate = final.candidates[index]
            if index in engines:
                continue
            if not candidate.available:  # it failed to load as the reference's predecessor: not tried again
                verdicts[index] = (None, candidate.reason)
                continue
            engine, verdict, estimate = self._try(final, index, reading, reference_answers, judged)
            verdicts[index] = verdict
            if engine is not None:
                engines[index], estimates[index] = engine, estimate
            log.debug("delegate probe: %s %s", candidate.spec, verdict[1])
        medians, counts = self._time(engines, estimates, started)
        chosen, reason = _choose(reference, verdicts, medians)
        result = ProbeResult(
            chosen=final.candidates[chosen].spec, reference=final.candidates[reference].spec,
            measurements=tuple(Measurement(final.candidates[i].spec, medians.get(i), counts.get(i, 0), verdicts[i][0],
                                           verdicts[i][1]) for i in verdicts),
            reason=reason, judged_on=judged.described, judged=_judgeable(reference_answers), budget_s=self.budget_s,
            spent_s=time.monotonic() - started, measured_at=time.time(), notes=self.notes)
        for index, engine in engines.items():
            if index != chosen:
                engine.close()
        engine = engines[chosen]
        if chosen != reference:  # a choice, not a fallback: the plan's candidates still say what failed to load
            engine.fallback_reason = None
            final = dataclasses.replace(final, fallback_reason=None)
        engine.selection = dataclasses.replace(final, selected=chosen, probe=result)
        if keep:
            problem = keep_choice(self.key, result)
            if problem:
                result = dataclasses.replace(result, notes=(*result.notes, problem))
                engine.selection = dataclasses.replace(engine.selection, probe=result)
        return engine, result

    def _try(self, final: Plan, index: int, reading: ModelReading, reference: Answers,
             judged: JudgementFrames) -> tuple[Engine | None, tuple[bool | None, str], float]:
        """Load candidate ``index`` and judge its answers; its engine (None when it failed) and verdict."""
        from ..runtime.selection import load_candidate

        try:
            engine = load_candidate(final, index, threads=self.threads)
        except Exception as exc:  # any delegate's failure, a plug-in's too: not chosen, and said
            return None, (None, f"failed to load: {_short(exc)}"), 0.0
        try:
            found = answers(engine, judgement_reading(_row(engine), self.options, reading.task, reading.layout.name),
                            judged)
        except Exception as exc:
            engine.close()
            return None, (None, f"failed to run: {_short(exc)}"), 0.0
        return engine, judge(reference, found, judged), found.invoke_s

    def _time(self, engines: dict[int, Engine], estimates: dict[int, float],
              started: float) -> tuple[dict[int, float], dict[int, int]]:
        """Each engine's median invoke in ms over interleaved blocks in what is left of the budget (one block each
        at least), and how many invokes were timed."""
        from ..runtime.timing import interleaved_latency, percentile

        if len(engines) < 2:
            return {}, {}
        left = self.budget_s - (time.monotonic() - started)
        one_each = sum(estimates.values())  # an invoke of every engine, as the judgement timed them
        settle = SETTLE if left >= (1 + SETTLE) * one_each else 0  # over budget already: one timed invoke each
        per_round = (settle + BLOCK_INVOKES) * one_each
        rounds = max(1, min(ROUNDS, int(left // per_round) if per_round > 0 else ROUNDS))
        seconds = min(left - rounds * settle * one_each, rounds * BLOCK_INVOKES * one_each)  # a few, not the budget
        order = list(engines)
        samples = interleaved_latency([engines[i] for i in order], seconds=max(seconds, 1e-3), rounds=rounds,
                                      warmup=0, settle=settle)
        return ({i: round(percentile(s, 50), 3) for i, s in zip(order, samples)},
                {i: len(s) for i, s in zip(order, samples)})


def _row(engine: Engine) -> Any:
    from .engine_worker import BatchRow

    return BatchRow(engine, 0)


def _short(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else " ".join(str(exc).split()) or type(exc).__name__


def _choose(reference: int, verdicts: Mapping[int, tuple[bool | None, str]],
            medians: Mapping[int, float]) -> tuple[int, str]:
    """The fastest candidate that agrees, when it beats the reference by MIN_GAIN; else the reference. Why, in words."""
    if reference not in medians:
        return reference, "the reference: no other candidate loaded"
    agreeing = [i for i, (agrees, _) in verdicts.items() if agrees is True and i in medians]
    if not agreeing:
        return reference, "the reference: no other candidate's answers were shown to agree"
    best = min(agreeing, key=lambda i: medians[i])
    gain = 1 - medians[best] / medians[reference] if medians[reference] > 0 else 0.0
    if gain >= MIN_GAIN:
        return best, f"the fastest whose answers agree, {gain:.0%} faster than the reference"
    return reference, (f"the reference: the fastest that agrees is {gain:.0%} faster, under the {MIN_GAIN:.0%} "
                       "that switches runtimes")


def load_engine(model: str | os.PathLike | ModelInfo, options: PipelineOptions, *, threads: int | None = None,
                batch: int | None = None, sources: Sequence[Any] = (),
                env: Mapping[str, str] | None = None) -> Engine:
    """A run's engine: on the delegate named, else — when the choice is free — on the probe's choice (cached, or
    measured now on the first frame of a file among ``sources``), else on the plan's first (``selection.load``)."""
    from ..runtime.model import ModelInfo, inspect_model
    from ..runtime.selection import load, plan

    env = os.environ if env is None else env
    if options.delegate or (batch is not None and batch > 1) or not options.delegate_probe or probe_disabled(env):
        return load(model, options.delegate, threads=threads, batch=batch, env=env, capture_threads=len(sources))
    info = model if isinstance(model, ModelInfo) else inspect_model(Path(model))
    probe = DelegateProbe(plan(info, None, env=env), info, options, threads=threads, batch=batch, env=env,
                          capture_threads=len(sources))
    if not probe.wanted:
        return load(info, None, threads=threads, batch=batch, env=env, capture_threads=len(sources))
    result = probe.cached()
    judged: JudgementFrames | None = None
    if result is not None and not result.judged:
        judged = judgement_frames(sources)
        if judged.real:  # kept the reference on the synthetic frame alone: a frame of this run's source judges now
            result = None
    if result is not None:
        engine = probe.load_cached(result)
        if engine is not None:
            log.info("%s", result.summary())
            return engine
    engine, measured = probe.measure(judged or judgement_frames(sources))
    if measured is not None:
        log.info("%s", measured.summary())
    return engine


__all__ = ["MIN_GAIN", "Answers", "DelegateProbe", "JudgementFrames", "answers", "judge", "judgement_frames",
           "judgement_reading", "load_engine", "synthetic_frame"]
