"""Delegate selection: which delegate runs a model on this device, and why the others do not.

Candidates come from, in order of precedence:

1. the caller's explicit delegate (``load(model, "openvino:GPU")``, ``--delegate``), or its own fallback order
   (``"coral,xnnpack"``);
2. ``$EDGEINFER_DELEGATE``;
3. the device profile's ``delegates`` list (the profile is detected from the root filesystem,
   named by the caller, or forced with ``$EDGEINFER_PROFILE``);
4. a built-in order per model format when no profile matches.

Each candidate is assessed: does its runtime exist here, is its hardware present (read from the
detected root), does it read the model's format? When the choice is free (3. detected, or 4.) and more
than one candidate can run the model, a pipeline measures them and takes the fastest whose answers agree
with the first's (the delegate probe: :mod:`.choice`, :mod:`edgeinfer.pipeline.delegate_probe`); ``load``
itself takes the first. The first candidate that reads the model's
format is the *intended* one; when a later one is chosen instead, that is a **fallback** and its
reason is recorded on the engine (``engine.fallback_reason``) and in the plan. ``strict=True``
(or ``$EDGEINFER_STRICT=1``) turns every fallback into an error. A candidate that does not read
the model's format is filtered out without counting as a fallback.

An Edge TPU model (``*_edgetpu.tflite``) on a device whose candidates include ``coral`` falls back,
when no TPU is usable, to its CPU twin (the same name without ``_edgetpu``) on the CPU
candidates that follow.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DelegateUnavailable, ModelLoadError, NoDelegateAvailable, ProfileError
from .delegates.registry import DEFAULT_ORDER, delegate_names, get_delegate, split_delegate
from .model import ModelFormat, ModelInfo, inspect_model

if TYPE_CHECKING:
    from ..device.detect import DeviceMatch
    from ..device.host import Host
    from ..device.profiles import Profile
    from .choice import ProbeResult
    from .engine import Engine

DELEGATE_ENV = "EDGEINFER_DELEGATE"
STRICT_ENV = "EDGEINFER_STRICT"
READY = "ready"


@dataclass(frozen=True)
class Candidate:
    """One delegate (and device) considered for a model, with whether it can run it here and why."""

    name: str
    device: str | None = None
    available: bool = False
    reason: str = ""
    #: the model file this candidate would load (the CPU twin for an Edge TPU model's fallback)
    model: str | None = None
    #: False when the delegate does not read the model's format (filtered, not a fallback)
    compatible: bool = True
    #: False for registered delegates that are not in the plan's order (listed for information)
    in_plan: bool = True

    @property
    def spec(self) -> str:
        """``name`` or ``name:device``."""
        return f"{self.name}:{self.device}" if self.device else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "spec": self.spec, "available": self.available,
                "reason": self.reason, "model": self.model, "in_plan": self.in_plan}


@dataclass(frozen=True)
class Plan:
    """The candidates in order, which one is selected, and why any earlier one was passed over."""

    source: str  # "explicit", "$EDGEINFER_DELEGATE", "profile <name>", "default"
    candidates: tuple[Candidate, ...]
    selected: int | None
    profile: str | None = None
    model: str | None = None
    strict: bool = False
    threads: int | None = None
    fallback_reason: str | None = None
    #: registered delegates outside the order, assessed for `edgeinfer device` (in_plan=False)
    others: tuple[Candidate, ...] = ()
    #: the device match the plan was made for (None: a delegate was named, and no profile or root)
    detection: DeviceMatch | None = field(default=None, compare=False, repr=False)
    #: the profile was named (the caller, ``$EDGEINFER_PROFILE``) rather than detected: its order decides
    profile_named: bool = False
    #: what the delegate probe measured and chose (runtime/choice.py), when it chose this plan's candidate
    probe: ProbeResult | None = field(default=None, compare=False)

    @property
    def chosen(self) -> Candidate | None:
        """The selected candidate, or None when nothing can run the model."""
        return None if self.selected is None else self.candidates[self.selected]

    @property
    def intended(self) -> int | None:
        """Index of the first candidate that reads the model's format (what runs when nothing falls back)."""
        return next((i for i, c in enumerate(self.candidates) if c.compatible), None)

    @property
    def is_fallback(self) -> bool:
        return self.selected is not None and self.selected != self.intended

    def reasons(self) -> dict[str, str]:
        """``spec -> reason`` of every candidate that cannot run (for NoDelegateAvailable)."""
        return {c.spec: c.reason for c in self.candidates if not c.available}

    def to_dict(self) -> dict[str, Any]:
        """The ``edgeinfer device --json`` object."""
        chosen = self.chosen
        return {
            "profile": self.profile,
            "delegates": [c.to_dict() for c in (*self.candidates, *self.others)],
            "selected": chosen.name if chosen else None,
            "selected_device": chosen.device if chosen else None,
            "selected_model": chosen.model if chosen else None,
            "fallback_reason": self.fallback_reason,
            "source": self.source, "model": self.model, "strict": self.strict, "threads": self.threads,
            "detection": self.detection.to_dict() if self.detection else None,
            "probe": self.probe.to_dict() if self.probe else None,
        }


def _env_flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _accepts_host(delegate: Any) -> bool:
    try:
        return "host" in inspect.signature(delegate.unavailable_reason).parameters
    except (TypeError, ValueError):
        return False


def unavailable_reason(delegate: Any, device: str | None, host: Host | None) -> str | None:
    """A delegate's availability, with the detected host when the delegate takes one; never raises."""
    try:
        if host is not None and _accepts_host(delegate):
            return delegate.unavailable_reason(device, host=host)
        return delegate.unavailable_reason(device)
    except Exception as exc:  # a third-party delegate's bug must not break selection
        return f"its availability check failed: {type(exc).__name__}: {exc}"


def _assess(spec: str, info: ModelInfo | None, host: Host | None, twin: ModelInfo | None, *,
            unknown_is_error: bool, in_plan: bool = True) -> Candidate:
    name, device = split_delegate(spec)
    try:
        delegate = get_delegate(name)
    except ValueError:
        if unknown_is_error:
            raise
        return Candidate(name, device, False, f"no delegate named {name!r} is installed (registered: "
                         f"{', '.join(delegate_names())})", in_plan=in_plan)
    except Exception as exc:  # a third-party entry point that fails to import
        return Candidate(name, device, False, f"delegate {name!r} failed to load its module: {exc}", in_plan=in_plan)
    target = info
    if info is not None:
        unsupported = delegate.unsupported_reason(info)
        if unsupported and twin is not None and name != "coral" and delegate.unsupported_reason(twin) is None:
            target, unsupported = twin, None
        if unsupported:
            return Candidate(name, device, False, unsupported, info.path, compatible=False, in_plan=in_plan)
    reason = unavailable_reason(delegate, device, host)
    path = target.path if target else None
    if reason:
        return Candidate(name, device, False, reason, path, in_plan=in_plan)
    note = f" (runs the CPU twin {Path(twin.path).name})" if twin is not None and target is twin else ""
    return Candidate(name, device, True, READY + note, path, in_plan=in_plan)


def _fallback_reason(plan_candidates: tuple[Candidate, ...], selected: int, intended: int | None,
                     info: ModelInfo | None) -> str | None:
    if intended is None or selected == intended:
        return None
    skipped = [c for c in plan_candidates[:selected] if c.compatible and not c.available]
    chosen = plan_candidates[selected]
    if info is not None and info.is_edgetpu and chosen.model and chosen.model != info.path:
        from .delegates.coral import twin_fallback_reason

        first = skipped[0] if skipped else plan_candidates[intended]
        text = twin_fallback_reason(info, chosen.model, first.reason, first.spec)
        if chosen.name != "xnnpack":
            text = text.replace("on xnnpack", f"on {chosen.spec}")
        rest = [f"{c.spec}: {c.reason}" for c in skipped[1:]]
        return "; ".join([text, *rest])
    return "; ".join(f"{c.spec}: {c.reason}" for c in skipped) or None


def _profile_and_host(profile: Profile | str | None, root: str | os.PathLike | None,
                      profile_dirs: Iterable[str | os.PathLike], env: Mapping[str, str],
                      ) -> tuple[Profile | None, DeviceMatch | None]:
    from ..device.detect import DeviceMatch, detect
    from ..device.host import probe_host
    from ..device.profiles import load_profiles

    root = root or "/"
    if profile is None:
        detection = detect(root, profile_dirs=profile_dirs, env=env)
        return detection.profile, detection
    if isinstance(profile, str):
        known = load_profiles(profile_dirs, env=env)
        if profile not in known:
            raise ProfileError(f"no device profile named {profile!r} (known: {', '.join(sorted(known))})")
        profile = known[profile]
    return profile, DeviceMatch.named(profile, probe_host(root), "named by the caller")


def plan(model: str | os.PathLike | ModelInfo | None = None, delegate: str | None = None, *,
         profile: Profile | str | None = None, root: str | os.PathLike | None = None, strict: bool | None = None,
         profile_dirs: Iterable[str | os.PathLike] = (), env: Mapping[str, str] | None = None,
         include_others: bool = False) -> Plan:
    """Assess every candidate for ``model`` (or for any model, when None) without loading anything."""
    env = os.environ if env is None else env
    strict = _env_flag(env.get(STRICT_ENV)) if strict is None else strict
    info = model if isinstance(model, ModelInfo) or model is None else inspect_model(model)
    specs, source = _named_delegate(delegate, env)
    chosen_profile: Profile | None = None
    detection: DeviceMatch | None = None
    if specs is None or profile is not None or root is not None:
        chosen_profile, detection = _profile_and_host(profile, root, profile_dirs, env)
    if specs is None:
        specs, source = _profile_order(chosen_profile, info)
    host = detection.host if detection else None
    explicit = source in ("explicit", f"${DELEGATE_ENV}")
    twin = _edgetpu_twin(info, specs)
    if twin is not None and explicit and len(specs) == 1:
        specs.append("xnnpack")  # "coral" asked for by name still falls back to the twin, on the CPU
    try:
        candidates = tuple(_assess(s, info, host, twin, unknown_is_error=explicit) for s in specs)
    except ValueError as exc:
        if source == "explicit":
            raise
        raise ValueError(f"${DELEGATE_ENV}={specs[0]!r}: {exc}") from None
    others: tuple[Candidate, ...] = ()
    if include_others:
        listed = {split_delegate(s)[0] for s in specs}
        others = tuple(_assess(n, info, host, twin, unknown_is_error=False, in_plan=False)
                       for n in delegate_names() if n not in listed)
    selected = next((i for i, c in enumerate(candidates) if c.available), None)
    intended = next((i for i, c in enumerate(candidates) if c.compatible), None)
    return Plan(
        source=source, candidates=candidates, selected=selected,
        profile=chosen_profile.name if chosen_profile else None, model=info.path if info else None,
        strict=strict, threads=chosen_profile.threads if chosen_profile else None,
        fallback_reason=_fallback_reason(candidates, selected, intended, info) if selected is not None else None,
        others=others, detection=detection,
        profile_named=source.startswith("profile ") and (profile is not None or _profile_forced(env)),
    )


def _profile_forced(env: Mapping[str, str]) -> bool:
    from ..device.profiles import PROFILE_ENV

    return bool(env.get(PROFILE_ENV, "").strip())


def free_choice(plan: Plan, *, batch: int | None = None) -> tuple[tuple[int, ...], str | None]:
    """The candidates the probe measures, the plan's selected one (the reference) first — or none, and why the
    choice is not the probe's: a delegate named, a profile named, strict mode, a batch, a single candidate."""
    if plan.source == "explicit":
        return (), "a delegate was named"
    if plan.source == f"${DELEGATE_ENV}":
        return (), f"${DELEGATE_ENV} names the delegate"
    if plan.profile_named:
        return (), f"the device profile {plan.profile} was named: its order decides"
    if plan.strict:
        return (), "strict mode: the profile's first delegate or an error"
    if batch is not None and batch > 1:
        return (), f"a batch of {batch} frames per invoke"
    if plan.selected is None:
        return (), "nothing can run the model here"
    reference = plan.candidates[plan.selected]
    others = tuple(i for i, c in enumerate(plan.candidates)
                   if c.available and c.model == reference.model and i != plan.selected)
    if not others:
        return (), f"only {reference.spec} can run the model here"
    return (plan.selected, *others), None


def _named_delegate(delegate: str | None, env: Mapping[str, str]) -> tuple[list[str] | None, str]:
    """The delegates the caller or ``$EDGEINFER_DELEGATE`` names (one, or a fallback order separated by commas),
    with where they came from; (None, "") if none."""
    if delegate and delegate.strip(" ,"):
        return _spec_list(delegate), "explicit"
    if env.get(DELEGATE_ENV, "").strip(" ,"):
        return _spec_list(env[DELEGATE_ENV]), f"${DELEGATE_ENV}"
    return None, ""


def _spec_list(text: str) -> list[str]:
    """``"coral,xnnpack"`` -> ``["coral", "xnnpack"]``: a caller's own fallback order."""
    return [spec.strip() for spec in text.split(",") if spec.strip()]


def _profile_order(profile: Profile | None, info: ModelInfo | None) -> tuple[list[str], str]:
    """The profile's delegate order, else the built-in order for the model's format."""
    if profile is not None:
        return list(profile.delegates), f"profile {profile.name}"
    fmt = info.format if info else ModelFormat.TFLITE
    return list(DEFAULT_ORDER.get(fmt, ())), "default"


def _edgetpu_twin(info: ModelInfo | None, specs: list[str]) -> ModelInfo | None:
    """The CPU twin of an Edge TPU model, when ``coral`` is among the candidates and the twin exists."""
    if info is None or not info.is_edgetpu or "coral" not in [split_delegate(s)[0] for s in specs]:
        return None
    from .delegates.coral import cpu_twin_path

    twin_path = cpu_twin_path(info.path)
    return inspect_model(twin_path) if twin_path else None


def _load_candidate(candidate: Candidate, info: ModelInfo, threads: int | None, *, cpu_fallback: bool = False,
                    batch: int | None = None) -> Engine:
    delegate = get_delegate(candidate.name)
    if batch is not None and batch > 1:
        if "batch" not in inspect.signature(delegate.load).parameters:
            raise DelegateUnavailable(candidate.name, f"it cannot run a batch of {batch} frames per invoke "
                                      "(openvino can)")
        return delegate.load(info, threads=threads, device=candidate.device, batch=batch)  # type: ignore[call-arg]
    if candidate.name == "coral":  # the twin is a candidate of its own in the plan, unless there is none
        return delegate.load(info, threads=threads, device=candidate.device, cpu_fallback=cpu_fallback)
    return delegate.load(info, threads=threads, device=candidate.device)


def load_candidate(the_plan: Plan, index: int, *, threads: int | None = None) -> Engine:
    """Load candidate ``index`` of ``the_plan`` — a run-time failover to it, or a probe of it.

    Raises what the delegate raises (DelegateUnavailable, ModelLoadError); the engine's
    ``selection`` is the plan with this candidate selected.
    """
    candidate = the_plan.candidates[index]
    path = candidate.model or the_plan.model
    if path is None:
        raise ValueError("the plan names no model file")
    engine = _load_candidate(candidate, inspect_model(path), threads if threads is not None else the_plan.threads)
    engine.selection = replace(the_plan, selected=index)
    return engine


def _short(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, DelegateUnavailable) else " ".join(str(exc).split())


def load(model: str | os.PathLike | ModelInfo, delegate: str | None = None, *, threads: int | None = None,
         profile: Profile | str | None = None, root: str | os.PathLike | None = None, strict: bool | None = None,
         profile_dirs: Iterable[str | os.PathLike] = (), env: Mapping[str, str] | None = None,
         batch: int | None = None, capture_threads: int = 0) -> Engine:
    """Load ``model`` on ``delegate`` (``name`` or ``name:device``), or on the best delegate for this device.

    ``threads`` unset: the device's thread plan beside ``capture_threads`` busy pipeline threads
    (``device/cores.py``). ``batch`` > 1 asks for that many frames per invoke (a multi-stream pipeline); only delegates
    whose ``load`` takes ``batch`` can (openvino), the others are passed over with that reason.

    With no delegate: ``$EDGEINFER_DELEGATE``, else the device profile's order (detected from
    ``root``, default ``/``), filtered by availability and the model's format; the module docstring
    has the rules. The engine's ``fallback_reason`` says why earlier candidates were passed over
    and its ``selection`` is the final plan (load failures included); ``strict=True`` turns a
    fallback into an error. NoDelegateAvailable lists every candidate's reason when none works.
    """
    env = os.environ if env is None else env
    info = model if isinstance(model, ModelInfo) else inspect_model(Path(model))
    the_plan = plan(info, delegate, profile=profile, root=root, strict=strict, profile_dirs=profile_dirs, env=env)
    from ..device.cores import runtime_threads

    threads = runtime_threads(threads, the_plan.threads, root=root or "/", capture_threads=capture_threads).threads
    if the_plan.source == "explicit" and len(the_plan.candidates) == 1:
        return _load_the_named_one(the_plan, info, threads, batch)
    if the_plan.intended is None:
        raise NoDelegateAvailable(info.path, the_plan.reasons() or {"(none)": f"no delegate reads {info.format.value} "
                                                                    "models"})
    return _load_first_that_works(the_plan, info, threads, batch)


def _load_the_named_one(the_plan: Plan, info: ModelInfo, threads: int | None, batch: int | None = None) -> Engine:
    """One delegate asked for by name: its own typed error (UnsupportedOperator, DelegateUnavailable)."""
    only = the_plan.candidates[0]
    chosen = _load_candidate(only, info, threads, cpu_fallback=not the_plan.strict, batch=batch)
    chosen.selection = replace(the_plan, candidates=(replace(only, available=True, reason=READY),), selected=0,
                               fallback_reason=None)
    return chosen


def load_first(the_plan: Plan, info: ModelInfo, *, threads: int | None = None) -> Engine:
    """Load ``the_plan``'s available candidates in order, as :func:`load` does when no delegate is named (the
    delegate probe's reference); the engine's ``selection`` is the final plan."""
    if the_plan.intended is None:
        raise NoDelegateAvailable(info.path, the_plan.reasons() or {"(none)": f"no delegate reads {info.format.value} "
                                                                    "models"})
    return _load_first_that_works(the_plan, info, runtime_thread_count(the_plan, threads))


def runtime_thread_count(the_plan: Plan, threads: int | None = None, capture_threads: int = 0) -> int:
    """The threads ``load`` gives the runtime under ``the_plan`` on this machine: ``threads``, else the profile's,
    else the thread plan's beside ``capture_threads`` (``device/cores.py``)."""
    from ..device.cores import runtime_threads

    return runtime_threads(threads, the_plan.threads, capture_threads=capture_threads).threads


def _load_first_that_works(the_plan: Plan, info: ModelInfo, threads: int | None, batch: int | None = None,
                           ) -> Engine:
    """Load the available candidates in order; a real load failure is recorded and the next one tried."""
    strict, intended = the_plan.strict, the_plan.intended
    candidates = list(the_plan.candidates)
    last_error: BaseException | None = None
    for index, candidate in enumerate(candidates):
        if not candidate.available:
            continue
        if strict and index != intended:
            wanted = candidates[intended]
            raise DelegateUnavailable(wanted.name, f"{wanted.reason} (strict mode: no fallback to {candidate.spec})")
        target = info if candidate.model in (None, info.path) else inspect_model(candidate.model)
        try:
            engine = _load_candidate(candidate, target, threads, batch=batch)
        except (DelegateUnavailable, ModelLoadError) as exc:
            if strict:
                raise
            candidates[index] = replace(candidate, available=False, reason=f"failed to load: {_short(exc)}")
            last_error = exc
            continue
        final = tuple(candidates)
        reason = _fallback_reason(final, index, intended, info)
        engine.fallback_reason = reason
        engine.selection = replace(the_plan, candidates=final, selected=index, fallback_reason=reason)
        return engine
    if strict:
        wanted = candidates[intended]
        raise DelegateUnavailable(wanted.name, f"{wanted.reason} (strict mode)")
    failed = replace(the_plan, candidates=tuple(candidates), selected=None)
    raise NoDelegateAvailable(info.path, failed.reasons()) from last_error

__all__ = ["DELEGATE_ENV", "STRICT_ENV", "Candidate", "Plan", "free_choice", "load", "load_candidate", "load_first",
           "plan", "runtime_thread_count", "unavailable_reason"]
