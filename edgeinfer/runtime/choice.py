"""A delegate chosen by measurement: what the delegate probe found, and the cache that keeps it per machine.

When nobody named the delegate (no ``--delegate``, no ``$EDGEINFER_DELEGATE``, no profile named) and more
than one candidate of the plan can run a model (:func:`~.selection.free_choice`), a pipeline measures them
once on this machine and runs the fastest whose answers agree with the reference's (the plan's first that
loads). The measurement itself — candidates loaded, fed a frame through the pipeline's own preprocessing,
decoded by the task's decoder, judged, timed — is :mod:`edgeinfer.pipeline.delegate_probe` (decoders sit
above this box). Here: the figures (:class:`Measurement`, :class:`ProbeResult`), the switches, and the
cache.

The cache is one small JSON file, ``delegate-choices.json`` in edgeinfer's cache folder
(``$EDGEINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgeinfer``, else ``~/.cache/edgeinfer``), written
atomically. An entry is found by its whole key (:func:`cache_key`): the model's sha256, edgeinfer's
version, each candidate with its runtime's versions (``Delegate.packages``), the machine (architecture,
CPU model, a digest of its flags, its cores) and the threads — so a new runtime version, another model
or another machine is measured anew. A file that does not read is ignored with a warning (and replaced
by the next choice kept), never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..device.host import Host
    from .model import ModelInfo

log = logging.getLogger(__name__)

#: ``0`` / ``false`` / ``no`` / ``off``: no probe (the plan's first delegate, as ``--no-probe``)
PROBE_ENV = "EDGEINFER_DELEGATE_PROBE"
#: seconds the probe may spend beyond loading the reference (loads, judgement, timing); a positive number
BUDGET_ENV = "EDGEINFER_DELEGATE_PROBE_BUDGET_S"
DEFAULT_BUDGET_S = 4.0
CACHE_FILE = "delegate-choices.json"
CACHE_VERSION = 1
#: entries kept in the file, the newest
MAX_ENTRIES = 64
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Measurement:
    """One candidate as the probe found it: its median invoke, whether its answers agree with the reference's."""

    delegate: str
    #: the median of its timed invokes (None: not timed — it failed, or the budget was spent)
    ms: float | None = None
    invokes: int = 0
    #: True / False: judged; None: the reference itself, or not judged
    agrees: bool | None = None
    #: in words: "the reference", "agrees: …", "disagrees: …", "not judged: …", "failed to load: …"
    verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"delegate": self.delegate, "ms": self.ms, "invokes": self.invokes, "agrees": self.agrees,
                "verdict": self.verdict}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        ms = data.get("ms")
        agrees = data.get("agrees")
        return cls(str(data["delegate"]), None if ms is None else float(ms), int(data.get("invokes") or 0),
                   agrees if agrees in (True, False) else None, str(data.get("verdict") or ""))

    def text(self) -> str:
        """``openvino:CPU 31.0 ms (agrees: …)``."""
        timing = f"{self.ms:.1f} ms" if self.ms is not None else "not timed"
        return f"{self.delegate} {timing} ({self.verdict})" if self.verdict else f"{self.delegate} {timing}"


@dataclass(frozen=True)
class ProbeResult:
    """What the delegate probe measured and chose, as ``run``, the agent and ``edgeinfer device`` say it."""

    chosen: str
    reference: str
    measurements: tuple[Measurement, ...]
    #: why ``chosen``, in words
    reason: str
    #: the frames the answers were compared on, in words
    judged_on: str
    #: whether the reference's answers gave anything to judge by (boxes, a decisive top-1)
    judged: bool
    budget_s: float
    #: seconds the probe took beyond loading the reference
    spent_s: float
    #: when it was measured (unix seconds)
    measured_at: float
    #: read from the cache rather than measured now
    cached: bool = False
    #: what went wrong around it (an unreadable cache file), in words
    notes: tuple[str, ...] = field(default=(), compare=False)

    def measurement(self, delegate: str) -> Measurement | None:
        return next((m for m in self.measurements if m.delegate == delegate), None)

    def summary(self) -> str:
        """One line: the choice, where it came from, each candidate's figures, the budget, the frames."""
        origin = "the probe's cached choice" if self.cached else "chosen by measurement"
        figures = "; ".join(m.text() for m in self.measurements)
        return (f"delegate {self.chosen}, {origin} ({self.reason}): {figures}; probe {self.spent_s:.1f} s of a "
                f"{self.budget_s:g} s budget, judged on {self.judged_on}")

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "reference": self.reference, "cached": self.cached, "reason": self.reason,
                "measurements": [m.to_dict() for m in self.measurements], "judged_on": self.judged_on,
                "judged": self.judged, "budget_s": self.budget_s, "spent_s": round(self.spent_s, 3),
                "measured_at": round(self.measured_at, 3), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        """The cache's form back (KeyError, TypeError or ValueError when it is not one)."""
        return cls(str(data["chosen"]), str(data["reference"]),
                   tuple(Measurement.from_dict(m) for m in data["measurements"]), str(data["reason"]),
                   str(data["judged_on"]), bool(data["judged"]), float(data["budget_s"]), float(data["spent_s"]),
                   float(data["measured_at"]))


# ------------------------------------------------------------------------------------------ when

def probe_disabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``$EDGEINFER_DELEGATE_PROBE`` turns the probe off."""
    env = os.environ if env is None else env
    return env.get(PROBE_ENV, "").strip().lower() in _OFF


def probe_budget(env: Mapping[str, str] | None = None) -> float:
    """The probe's budget in seconds: ``$EDGEINFER_DELEGATE_PROBE_BUDGET_S``, else the default (a value that is
    not a positive number is said and ignored)."""
    env = os.environ if env is None else env
    text = env.get(BUDGET_ENV, "").strip()
    if not text:
        return DEFAULT_BUDGET_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        log.warning("$%s=%r is not a positive number of seconds: the probe takes its default %g s", BUDGET_ENV, text,
                    DEFAULT_BUDGET_S)
        return DEFAULT_BUDGET_S
    return value


# ------------------------------------------------------------------------------------------ cache

def _machine(host: Host | None) -> dict[str, Any]:
    from ..device.host import probe_host

    host = host if host is not None else probe_host("/")
    flags = hashlib.sha256(" ".join(sorted(host.cpu_flags)).encode()).hexdigest()[:16]
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"arch": platform.machine(), "cpu_model": host.cpu_model, "cpu_flags": flags, "cores": os.cpu_count(),
            "usable_cores": usable}


def _runtime_versions(name: str) -> dict[str, str | None]:
    """The versions of the distributions a delegate's runtime comes from; for a plug-in that names none, where it
    is registered (a change of its code under the same name is not seen then: it should name its packages)."""
    from ..util.dist import versions
    from .delegates.registry import delegate_target, get_delegate

    packages = tuple(getattr(get_delegate(name), "packages", ()) or ())
    if packages:
        return dict(versions(packages))
    return {"entry point": delegate_target(name)}


def cache_key(candidates: Sequence[tuple[str, str]], info: ModelInfo, threads: int | None,
              host: Host | None = None) -> dict[str, Any]:
    """Everything a measured choice depends on — ``candidates`` as (delegate name, ``name[:device]``), the
    reference first; ``host``: this machine as detection read it (None: read now) —; a cached choice is used
    only under an equal key."""
    from .._version import __version__

    return {"model_sha256": info.sha256, "edgeinfer": __version__,
            "candidates": [{"delegate": spec, "versions": _runtime_versions(name)} for name, spec in candidates],
            "machine": _machine(host), "threads": threads}


def cache_file() -> Path:
    from ..util.fs import default_cache_dir

    return default_cache_dir() / CACHE_FILE


def _entries(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The cache's entries, and what is wrong with the file when it does not read (then no entries)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], None
    except (OSError, UnicodeDecodeError) as exc:
        return [], f"the delegate probe's cache {path} could not be read ({exc}): ignored"
    try:
        data = json.loads(text)
        entries = data["entries"]
        if data.get("version") != CACHE_VERSION or not isinstance(entries, list) or \
                not all(isinstance(e, dict) and isinstance(e.get("key"), dict) for e in entries):
            raise ValueError(f"not a version {CACHE_VERSION} list of entries")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [], f"the delegate probe's cache {path} is not readable ({type(exc).__name__}: {exc}): ignored"
    return entries, None


def cached_choice(key: Mapping[str, Any]) -> tuple[ProbeResult | None, str | None]:
    """The choice kept under ``key`` (marked cached), and a problem with the cache file in words (also logged)."""
    path = cache_file()
    entries, problem = _entries(path)
    if problem:
        log.warning("%s", problem)
    for entry in entries:
        if entry["key"] == key:
            try:
                return replace(ProbeResult.from_dict(entry["result"]), cached=True), problem
            except (KeyError, TypeError, ValueError) as exc:
                problem = f"the delegate probe's cache {path} holds an entry that does not read ({exc}): ignored"
                log.warning("%s", problem)
                return None, problem
    return None, problem


def keep_choice(key: Mapping[str, Any], result: ProbeResult) -> str | None:
    """Keep ``result`` under ``key`` (replacing an entry of that key; the newest ``MAX_ENTRIES``), atomically; a
    folder that cannot be written is a warning (returned in words), never an error."""
    from ..util.fs import atomic_write_text

    path = cache_file()
    entries, _problem = _entries(path)  # an unreadable file was said when it was read: replaced now
    entries = [e for e in entries if e["key"] != key]
    entries.append({"key": dict(key), "result": replace(result, cached=False, notes=()).to_dict()})
    document = {"version": CACHE_VERSION, "written_at": round(time.time(), 3), "entries": entries[-MAX_ENTRIES:]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(document, indent=1) + "\n")
    except OSError as exc:
        problem = f"the delegate probe's choice could not be kept in {path} ({exc}): it is measured again next time"
        log.warning("%s", problem)
        return problem
    return None


__all__ = ["BUDGET_ENV", "CACHE_FILE", "DEFAULT_BUDGET_S", "PROBE_ENV", "Measurement", "ProbeResult", "cache_file",
           "cache_key", "cached_choice", "keep_choice", "probe_budget", "probe_disabled"]
