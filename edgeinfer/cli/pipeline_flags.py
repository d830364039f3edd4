"""A flag that sets a pipeline option (``--score-threshold``, ``--iou``, ``--max-detections``; ``--channels``,
``--pad``) takes the option's own default and bounds, or its choices.

The bounds are declared once, in the option's field of :class:`~edgeinfer.pipeline.options.PipelineOptions`; the
agent.yaml check, the configuration document's schema and a running run's new options check the same metadata with
the same function (``util.config.out_of_bounds``). Here click reads the number, the same function judges it, and a
value out of bounds (NaN too, which click's own ranges let through) is a usage error naming the flag and the option
in the pipeline's words: ``Invalid value for '--iou': iou_threshold must be <= 1, not 1.5``.
"""

from __future__ import annotations

from typing import Any

import click

from ..pipeline.options import PipelineOptions
from ..util.config import out_of_bounds


class _Bounded:
    """A click range (its ``--help`` text) whose number is read as an int or a float and judged by the option's bounds
    alone: one judgement, one wording, for every value out of bounds."""

    option: str
    metadata: Any
    number: click.ParamType

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self.number.convert(value, param, ctx)
        problem = out_of_bounds(self.option, number, self.metadata)
        if problem:
            self.fail(problem, param, ctx)  # type: ignore[attr-defined]
        return number


class _BoundedFloat(_Bounded, click.FloatRange):
    number = click.FLOAT


class _BoundedInt(_Bounded, click.IntRange):
    number = click.INT


def option_type(name: str) -> click.ParamType:
    """The click type of pipeline option ``name`` (an int or float option with a number default): its range in
    ``--help``, judged by its bounds."""
    option = PipelineOptions.option(name)
    if isinstance(option.default, bool) or not isinstance(option.default, (int, float)):
        raise TypeError(f"pipeline option {name!r} is not a number with a default")
    meta = option.metadata
    kind = _BoundedInt if isinstance(option.default, int) else _BoundedFloat
    ranged = kind(meta.get("minimum", meta.get("exclusiveMinimum")), meta.get("maximum", meta.get("exclusiveMaximum")),
                  min_open="exclusiveMinimum" in meta, max_open="exclusiveMaximum" in meta)
    ranged.option, ranged.metadata = name, meta
    return ranged


def option_flag(name: str) -> dict[str, Any]:
    """``click.option`` keyword arguments for a flag that sets pipeline option ``name``: its type and its default."""
    return {"type": option_type(name), "default": PipelineOptions.option(name).default, "show_default": True}


def choice_flag(name: str) -> dict[str, Any]:
    """``click.option`` keyword arguments for a flag that sets pipeline option ``name``, a word among the ``choices``
    its field declares (the ones ``PipelineOptions`` and agent.yaml check): unset, it leaves the option to the model."""
    choices = PipelineOptions.option(name).metadata.get("choices")
    if not choices:
        raise TypeError(f"pipeline option {name!r} declares no choices")
    return {"type": click.Choice(choices, case_sensitive=False), "default": None}
class DecoderName(click.ParamType):
    """``--decoder``: a built-in decoder's name or an installed plug-in's (``edgeinfer.decoders`` entry points), listed
    in ``--help`` as they are installed when it is shown; the plug-in itself is imported when the model is read."""

    name = "decoder"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        from ..pipeline.decoders import decoder_names

        return "[" + "|".join(decoder_names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..pipeline.decoders import decoder_problem

        problem = decoder_problem(value)
        if problem:
            self.fail(problem.removeprefix("decoder "), param, ctx)
        return value


def decoder_flag(help_text: str = "How the outputs are read, for a model whose layout is ambiguous or that a plug-in "
                                  "decodes. Default: chosen from the outputs' shapes and names and the model's "
                                  "metadata (docs/models.md).") -> Any:
    """The ``--decoder`` option every command that reads a model's outputs takes (run, bench, evaluate, optimize)."""
    return click.option("--decoder", type=DecoderName(), default=None, help=help_text)
