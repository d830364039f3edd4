"""``edgeinfer device`` (profile, delegates, plan) and ``edgeinfer doctor`` (setup problems and fixes)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .output import handle_errors, print_json

if TYPE_CHECKING:
    from ..runtime.choice import ProbeResult
    from ..runtime.selection import Plan

_ROOT = click.option("--root", default="/", show_default=True,
                     type=click.Path(exists=True, file_okay=False, path_type=str),
                     help="Root filesystem to inspect (a mounted image, or a fake tree in tests).")
_PROFILE_DIRS = click.option("--profile-dir", "profile_dirs", multiple=True,
                             type=click.Path(exists=True, file_okay=False, path_type=str),
                             help="Extra directory of profile YAML files (repeatable; also $EDGEINFER_PROFILE_DIRS).")


@click.command()
@_ROOT
@click.option("--model", type=click.Path(dir_okay=False, path_type=str),
              help="Plan for this model (its format filters the delegates).")
@_PROFILE_DIRS
@click.option("--profile", help="Use this profile instead of detecting one (also $EDGEINFER_PROFILE).")
@click.option("--delegate", help="Plan for this delegate (name or name:device) instead of the profile's order.")
@click.option("--probe", "probe", flag_value="again",
              help="With --model: measure the runtimes that can run it again, whatever the cache holds.")
@click.option("--no-probe", "probe", flag_value="off",
              help="With --model: the plan only, no delegate probe. Default: the probe's cached choice, else "
                   "measured now (a few seconds) and kept, as a run would.")
@click.option("--image", type=click.Path(exists=True, dir_okay=False, path_type=str),
              help="With --model: judge the runtimes' answers on this frame (and a synthetic one) — a frame of the "
                   "device's camera, whose choice its runs then read from the cache.")
@click.option("--threads", type=click.IntRange(min=1), help="With --model: the thread count a run would give it.")
@click.option("--sources", type=click.IntRange(min=1), default=1, show_default=True,
              help="Share the cores as a run of this many sources (cameras, clips) would: one capture thread each.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def device(root: str, model: str | None, profile_dirs: tuple[str, ...], profile: str | None, delegate: str | None,
           probe: str | None, image: str | None, threads: int | None, sources: int, as_json: bool) -> None:
    """Show the matched device profile, every delegate with its availability and reason, and the plan; with
    --model, the delegate the probe chose for it by measurement and the figures."""
    from ..device.cores import runtime_threads
    from ..runtime.selection import plan

    the_plan = plan(model, delegate, profile=profile, root=root, profile_dirs=profile_dirs, include_others=True)
    runtime = runtime_threads(threads, the_plan.threads, root=root, capture_threads=sources)
    skipped = None
    if model is not None:
        the_plan, skipped = _probed(the_plan, root, probe or "auto", image, runtime.threads)
    if as_json:
        print_json({**the_plan.to_dict(), "runtime_threads": runtime.to_dict(),
                    **({"probe_skipped": skipped} if model is not None else {})})
        return
    detection = the_plan.detection
    matched = detection.profile if detection else None
    if matched is not None:
        click.echo(f"profile   {matched.name} — {matched.description}")
        click.echo(f"matched   {'; '.join(detection.evidence)}")
        others = [f"{name} ({score})" for name, score in detection.ranking[1:]]
        if others:
            click.echo(f"also      {', '.join(others)}")
        budget = f"{matched.memory_budget_mb} MB" if matched.memory_budget_mb else "-"
        click.echo(f"threads   {matched.threads or 'runtime default'}    memory budget {budget}")
        if matched.camera.device or matched.camera.gstreamer:
            click.echo(f"camera    {matched.camera.device or '-'}  {matched.camera.pipeline() or ''}".rstrip())
    else:
        arch = detection.host.arch if detection else "?"
        click.echo(f"profile   none matched (architecture {arch or 'unknown'}) — built-in order by model format")
    if the_plan.model:
        click.echo(f"model     {the_plan.model}")
    click.echo(f"order     {the_plan.source}")
    rows = [(str(i + 1), c) for i, c in enumerate(the_plan.candidates)] + [("-", c) for c in the_plan.others]
    width = max([len(c.spec) for _, c in rows] + [8])
    for number, candidate in rows:
        mark = "  <- selected" if candidate is the_plan.chosen else ""
        note = "" if candidate.in_plan else " (not in this order)"
        available = "yes" if candidate.available else "no "
        click.echo(f"  {number:>2}  {candidate.spec:<{width}}  {available}  {candidate.reason}{note}{mark}")
    chosen = the_plan.chosen
    click.echo(f"selected  {chosen.spec if chosen else 'nothing can run here'}")
    if the_plan.fallback_reason:
        click.echo(f"fallback  {the_plan.fallback_reason}")
    click.echo(f"runtime   {runtime.describe()}")
    click.echo(f"cores     {runtime.sharing()}")
    if the_plan.probe is not None:
        _print_probe(the_plan.probe)
    elif skipped:
        click.echo(f"probe     not run: {skipped}")


def _probed(the_plan: Plan, root: str, mode: str, image: str | None, threads: int | None) -> tuple[Plan, str | None]:
    """``the_plan`` with the delegate probe's choice (cached, else measured now and kept; ``mode`` "again": measured
    anyway), or unchanged and why the probe did not run."""
    import dataclasses
    import os

    from ..pipeline.delegate_probe import DelegateProbe, judgement_frames
    from ..pipeline.options import PipelineOptions
    from ..runtime.model import inspect_model

    if os.path.realpath(root) != "/":
        return the_plan, "the probe measures this machine, not the one under --root"
    assert the_plan.model is not None
    probe = DelegateProbe(the_plan, inspect_model(the_plan.model), PipelineOptions(delegate_probe=mode != "off"),
                          threads=threads)
    if not probe.wanted:
        return the_plan, probe.skipped
    result = None if mode == "again" else probe.cached()
    if result is None or (not result.judged and image is not None):
        engine, result = probe.measure(judgement_frames(image=image))
        engine.close()
        if result is None:
            return the_plan, "the reference's results could not be read to judge others by"
    chosen = next((i for i in probe.indices if the_plan.candidates[i].spec == result.chosen), the_plan.selected)
    return dataclasses.replace(the_plan, selected=chosen, probe=result,
                               fallback_reason=the_plan.fallback_reason if chosen == the_plan.selected else None), None


def _print_probe(result: ProbeResult) -> None:
    """The probe's choice, each candidate's median invoke and verdict, its time and the frames it judged on."""
    origin = "cached" if result.cached else "measured now"
    click.echo(f"probe     {result.chosen}, {origin}: {result.reason}")
    width = max(len(m.delegate) for m in result.measurements)
    for m in result.measurements:
        timing = f"{m.ms:8.1f} ms" if m.ms is not None else "       -   "
        click.echo(f"            {m.delegate:<{width}}  {timing}  {m.verdict}")
    click.echo(f"          {result.spent_s:.1f} s of a {result.budget_s:g} s budget, judged on {result.judged_on}")
    for note in result.notes:
        click.echo(f"warning   {note}")


@click.command()
@_ROOT
@click.option("--user", help="Check device permissions for this user (default: $SUDO_USER, else you).")
@_PROFILE_DIRS
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def doctor(root: str, user: str | None, profile_dirs: tuple[str, ...], as_json: bool) -> None:
    """Diagnose common setup problems (libedgetpu, udev, gasket, TensorRT/JetPack, numpy, camera); exit 1 if any."""
    from ..tools.doctor import diagnose

    report = diagnose(root, user=user, profile_dirs=profile_dirs)
    if as_json:
        print_json(report.to_dict())
    else:
        for line in report_lines(report.to_dict()):
            click.echo(line)
    if report.problems:
        sys.exit(1)


def report_lines(report: dict) -> list[str]:
    """The doctor's report (``Report.to_dict()``, here or from a device: ``fleet doctor``) as the lines it prints:
    a finding a line, with its fix, then the count of problems."""
    labels = {"ok": "ok      ", "problem": "PROBLEM ", "warning": "warning ", "info": "        "}
    lines = []
    for finding in report.get("findings") or []:
        status = str(finding.get("status"))
        lines.append(f"{labels.get(status, status)}{finding.get('check')}: {finding.get('detail')}")
        if finding.get("fix") and status != "ok":
            lines.append(f"          fix: {finding['fix']}")
    count = sum(finding.get("status") == "problem" for finding in report.get("findings") or [])
    lines.append(f"{count} problem{'s' if count != 1 else ''} found" if count else "no problems found")
    return lines
