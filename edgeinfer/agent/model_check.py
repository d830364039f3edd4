"""Each pipeline's model opened and read as its run reads it, and which pipeline failures are the configuration's.

``edgeinfer agent --check`` validates more than the file: :func:`check_models` opens each pipeline's model the
way the run does — a :class:`~edgeinfer.pipeline.multi.MultiPipeline` of no stream, so the same load, the same
:func:`~edgeinfer.pipeline.tasks.read_run_model` (task, output layout, labels) and the same rule checks
(pipeline/rule_check.py), and no source opened, nothing started, nothing written.

A pipeline whose first start fails for one of these reasons makes the agent exit 78 (EX_CONFIG, which the
systemd unit does not restart on) after reporting it (:func:`is_config_failure`): no restart can mend a model
file that is not there, a rule naming a label the model does not have, or outputs no layout decodes. What the
device may yet mend — a camera not plugged in, an accelerator that does not answer, a runtime not installed —
is not the configuration's: ``--check`` says it could not load the model here (a warning) and the runner
restarts the pipeline with backoff, as ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigError,
    DelegateError,
    EdgeInferError,
    LabelsError,
    LayoutMismatch,
    MissingDependency,
    ModelError,
    ModelFormatError,
    ModelNotFound,
    PluginError,
    UnsizedInput,
)

if TYPE_CHECKING:
    from .config import AgentConfig
    from .pipeline_config import PipelineConfig

log = logging.getLogger(__name__)

#: failures of a pipeline's start that are its configuration's (and plain ValueErrors: an option or a rule the model
#: cannot take — a caller's wrong argument, in errors.py's words)
CONFIG_FAILURES = (ConfigError, ModelNotFound, ModelFormatError, LayoutMismatch, UnsizedInput, LabelsError,
                   PluginError)
#: the words a rule's error starts with → the key of the pipeline entry it is about
_RULE_KEYS = {"event rule": "events", "sampling rule": "sample"}


def is_config_failure(error: BaseException) -> bool:
    """Whether ``error``, raised while a pipeline was built, is its configuration's: no restart can mend it."""
    if isinstance(error, CONFIG_FAILURES):
        return True
    return isinstance(error, ValueError) and not isinstance(error, EdgeInferError)


class FirstStart:
    """A pipeline runner's factory (``factory(config)`` → its run), watching the first start: until one run was
    built, a failure that :func:`is_config_failure` calls the configuration's goes to ``on_config_error`` (the agent
    stops and exits 78) and the runner waits to be stopped instead of restarting; later failures restart as ever.
    Without ``on_config_error`` every failure restarts."""

    def __init__(self, factory: Callable[[Any], Any], on_config_error: Callable[[BaseException], None] | None) -> None:
        self._factory, self._on_config_error = factory, on_config_error
        self.started = False

    def __call__(self, config: Any) -> Any:
        run = self._factory(config)
        self.started = True
        return run

    def hands_over(self, error: BaseException) -> bool:
        """Whether ``error`` is a first start's configuration failure, now handed to ``on_config_error``."""
        if self.started or self._on_config_error is None or not is_config_failure(error):
            return False
        self._on_config_error(error)
        return True


class ConfigErrors:
    """The agent's: the configuration error a pipeline's first start failed with (``error``, the first of them), on
    which it stops (``stop``) and exits 78 rather than restart what no restart mends."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self.error: ConfigError | None = None

    def reporter(self, config: AgentConfig, index: int) -> Callable[[BaseException], None]:
        """The ``on_config_error`` of pipeline ``index``'s runner (its failure is reported before it is called)."""

        def report(error: BaseException) -> None:
            if self.error is None:
                self.error = pipeline_config_error(config, index, error)
                log.error("%s — stopping (exit 78: a configuration error)", self.error)
            self._stop()

        return report


def pipeline_config_error(config: AgentConfig, index: int, error: BaseException) -> ConfigError:
    """``error`` of pipeline ``index`` as the configuration error the agent exits 78 with: ``FILE:
    pipelines[I].KEY: …`` (the key when the error says which: ``model``, ``labels``, ``decoder`` — its plug-in —,
    ``events``, ``sample``)."""
    text = " ".join(str(error).split())
    key = ("model" if isinstance(error, ModelError) else "labels" if isinstance(error, LabelsError)
           else "decoder" if isinstance(error, PluginError)
           else next((k for words, k in _RULE_KEYS.items() if text.startswith(words)), None))
    where = f"pipelines[{index}]" + (f".{key}" if key else "")
    return ConfigError(f"{config.path or 'config'}: {where}: {text}")


def check_model(pipeline: PipelineConfig) -> dict[str, Any]:
    """``pipeline``'s model loaded and read as its run reads it (no source opened), then closed: what was read,
    with the warnings (logged too). Its errors are the run's (see :func:`is_config_failure`); one that stops the
    model from loading here (no delegate, no runtime installed) is a warning instead."""
    from ..pipeline.multi import MultiPipeline

    entry: dict[str, Any] = {"pipeline": pipeline.name, "model": pipeline.model}
    try:
        run = MultiPipeline(pipeline.model, {}, pipeline.options, batch=pipeline.batch if pipeline.sources else None,
                            name=pipeline.name)
    except (DelegateError, MissingDependency) as exc:
        warning = (f"pipeline {pipeline.name}: {pipeline.model} could not be loaded here, so its outputs and rules "
                   f"are not checked: {' '.join(str(exc).split())}")
        log.warning("%s", warning)
        entry["warnings"] = [warning]
        return entry
    try:
        reading, labels, model = run.reading, run.labels, run.engine.model
        assert reading is not None
        entry.update(sha256=model.sha256, task=reading.task, task_from=reading.task_from,
                     layout=reading.layout.name, labels=len(labels) if labels is not None else None,
                     warnings=[f"pipeline {pipeline.name}: {note}" for note in reading.notes])
    finally:
        run.close()
    return entry


def check_models(config: AgentConfig) -> list[dict[str, Any]]:
    """Every pipeline's :func:`check_model`; the first configuration error as a ConfigError naming the file, the
    pipeline and the key."""
    checked = []
    for index, pipeline in enumerate(config.pipelines):
        try:
            checked.append(check_model(pipeline))
        except Exception as exc:
            if is_config_failure(exc):
                raise pipeline_config_error(config, index, exc) from None
            raise
    return checked
