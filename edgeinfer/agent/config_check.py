"""What a configuration needs of the device, checked before anything runs it: each pipeline's model opened and read as
its run reads it (agent/model_check.py: its layout, its decoder, its labels, its rules), and each source opened, one
frame read, within :data:`SOURCE_OPEN_TIMEOUT_S`.

``edgeinfer agent --check`` runs :func:`check_configuration` on every pipeline of ``agent.yaml`` (a source that does not
open is a warning there: the running agent may hold the camera); a configuration revision from the fleet runs it on the
pipelines it adds or restarts and on the sources it opens, and is refused when anything fails
(agent/configuration.py), before anything changes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from .._redact import redact
from .model_check import check_model, is_config_failure, pipeline_config_error

if TYPE_CHECKING:
    from ..pipeline.options import PipelineOptions
    from .config import AgentConfig

#: seconds a source has to open and give its first frame (an RTSP camera: its connection and first keyframe)
SOURCE_OPEN_TIMEOUT_S = 10.0


def sources_of(config: AgentConfig, index: int) -> list[tuple[str, Any]]:
    """(key, source) of pipeline ``index``: ``pipelines[i].source``, or each ``pipelines[i].sources[j]``."""
    pipeline = config.pipelines[index]
    if pipeline.sources:
        return [(f"pipelines[{index}].sources[{j}]", s.source) for j, s in enumerate(pipeline.sources)]
    return [(f"pipelines[{index}].source", pipeline.source)]


def _probe(source: Any, options: PipelineOptions, timeout: float, found: dict[str, str | None]) -> None:
    """Open ``source`` as a run would and read one frame; ``found["problem"]`` says why not (None: it did)."""
    from ..capture import open_source

    opened = None
    try:
        opened = open_source(source, size=options.size, fps=options.fps, fourcc=options.fourcc, loop=False,
                             backoff=dataclasses.replace(options.backoff, give_up_s=timeout),
                             reduced=options.decode_reduced)
        found["source"] = opened  # type: ignore[assignment]
        found["problem"] = None if opened.read() is not None else "it gave no frame"
    except Exception as exc:  # CaptureError mostly: what the source says is wrong
        found["problem"] = " ".join(str(exc).split()) or type(exc).__name__
    finally:
        if opened is not None:
            opened.close()


def source_problems(config: AgentConfig, indexes: Iterable[int], *, skip: Collection[Any] = (),
                    timeout: float = SOURCE_OPEN_TIMEOUT_S) -> list[str]:
    """Every source of the pipelines ``indexes`` (but those in ``skip``: open already) opened at once, each on its
    own thread; ``KEY: SOURCE did not open: why`` for each that did not give a frame within ``timeout``."""
    probes = []
    for index in indexes:
        options = config.pipelines[index].options
        for key, source in sources_of(config, index):
            if source in skip:
                continue
            found: dict[str, Any] = {"problem": "still opening"}
            thread = threading.Thread(target=_probe, args=(source, options, timeout, found), daemon=True,
                                      name="edgeinfer-source-check")
            thread.start()
            probes.append((key, source, thread, found))
    deadline = time.monotonic() + timeout
    problems = []
    for key, source, thread, found in probes:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():  # left to finish on its own (a device read cannot be cut short safely)
            if found.get("source") is not None:
                found["source"].interrupt()
            problems.append(redact(f"{key}: {source} did not open within {timeout:g} s"))
        elif found["problem"] is not None:  # the words go to the fleet (an update event, the state): no password
            problems.append(redact(f"{key}: {source} did not open: {found['problem']}"))
    return problems


def check_configuration(config: AgentConfig, indexes: Iterable[int] | None = None, *,
                        skip_sources: Collection[Any] = (), timeout: float = SOURCE_OPEN_TIMEOUT_S) -> dict[str, Any]:
    """The models of the pipelines ``indexes`` (default: all), each read as its run reads it, and their sources
    opened: ``{"models": [what was read, per pipeline], "sources": [problems]}``. ConfigError naming the pipeline and
    the key for a model or rule that cannot work (as ``agent --check`` exits 78 with); a model no delegate of this
    machine loads is a model entry without ``layout``, with the reason in its ``warnings``."""
    chosen = list(range(len(config.pipelines)) if indexes is None else indexes)
    models = []
    for index in chosen:
        try:
            models.append(check_model(config.pipelines[index]))
        except Exception as exc:
            if is_config_failure(exc):
                raise pipeline_config_error(config, index, exc) from None
            raise
    return {"models": models, "sources": source_problems(config, chosen, skip=skip_sources, timeout=timeout)}
