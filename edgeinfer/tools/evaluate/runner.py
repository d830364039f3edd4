"""A model run on a dataset's images as the pipeline runs it: the task, layout, labels and preprocessing read
from the model (:func:`~edgeinfer.pipeline.tasks.read_run_model`), frames through the pipeline's
``Preprocessor`` and the layout's own decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import DatasetError

if TYPE_CHECKING:
    from ...pipeline.labels import Labels
    from ...runtime.engine import Engine

#: detections rank for COCO mAP down to this score (COCOeval ranks everything; a floor keeps NMS cheap)
SCORE_FLOOR = 0.01
#: boxes kept per image: COCOeval's own largest maxDets
MAX_DETECTIONS = 100


@dataclass(frozen=True)
class ModelUnderTest:
    """A loaded model as the pipeline reads it."""

    engine: Engine
    reading: Any
    names: dict[int, str]

    @property
    def kind(self) -> str:
        return "detect" if self.reading.gives_boxes else self.reading.task


@dataclass(frozen=True)
class Output:
    """One image's result: its size and what the decoder gave (Detections or a top-k list)."""

    size: tuple[int, int]
    found: Any


def open_model(model: str | Path, *, delegate: str | None = None, labels: str | Path | None = None,
               task: str | None = None, decoder: str | None = None) -> ModelUnderTest:
    """Load ``model`` and read it as a pipeline does, with a low score floor and top-5 for scoring."""
    from ...pipeline.labels import Labels
    from ...pipeline.options import PipelineOptions
    from ...pipeline.tasks import read_run_model
    from ...runtime.selection import load

    engine = load(model, delegate)
    options = PipelineOptions(task=task, decoder=decoder, score_threshold=SCORE_FLOOR, max_detections=MAX_DETECTIONS,
                              top_k=5)
    try:
        reading, names = read_run_model(engine, options, Labels.load(labels) if labels else None)
    except Exception:
        engine.close()
        raise
    return ModelUnderTest(engine, reading, _names(names, engine))


def _names(labels: Labels | None, engine: Engine) -> dict[int, str]:
    if labels is None:
        return dict(engine.model.metadata.names or {})
    return {i: labels[i] for i in range(len(labels))}


def run_images(model: ModelUnderTest, images: list[Path],
               say: Callable[[str], None] | None = None) -> Iterator[Output]:
    """The model's result on each image, in order."""
    from ...capture.images import read_image
    from ...pipeline.preprocess import Preprocessor
    from ...util.native import captured_native_stderr

    engine, reading = model.engine, model.reading
    preprocessors: dict[tuple[int, int], Preprocessor] = {}
    for number, path in enumerate(images, 1):
        with captured_native_stderr("OpenCV"):  # libjpeg prints "Premature end of JPEG file" itself
            frame = read_image(path)
        size = (frame.shape[1], frame.shape[0])
        if size not in preprocessors:
            preprocessors[size] = reading.preprocessor(engine.inputs[0], size)
        transform = preprocessors[size](frame, engine.input_view(0))
        engine.invoke()
        yield Output(size, _decode(reading, transform, path))
        if say:
            say(f"{Path(engine.model.path).name}: image {number}/{len(images)} ({path.name})")


def _decode(reading: Any, transform: Any, path: Path) -> Any:
    try:
        return reading.decoder(transform)
    except ValueError as exc:  # the decoder's own failure on this frame: name the image
        raise DatasetError(f"decoding the outputs on {path.name} failed: {exc}") from exc

