"""``edgeinfer fleet logs DEVICE`` and ``edgeinfer fleet doctor DEVICE``: a device's recent log lines and its doctor's
report, from the fleet (docs/fleet.md, *Logs and diagnosis from afar*).

Each asks the device through the manager, then reads what the manager stores until the device has answered or
the bound (``--wait``) has passed: it never hangs. Exit status: 0 the device answered (``doctor``: and found no
problem), 1 an error (``doctor``: problems found, as ``edgeinfer doctor``), 2 a usage error, 3 no answer — the
device is offline, did not answer within the bound, or refused — with what the manager had shown all the same.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any

import click

from ..link.logs import LEVELS
from .device import report_lines
from .fleet_access import client_options, duration
from .output import print_json

#: the exit status when the device gave no answer (offline, silent within the bound, or refusing)
EXIT_NO_ANSWER = 3
#: how often the manager is asked whether the answer has come; how often a follower reads new lines
POLL_S = 0.25
FOLLOW_POLL_S = 1.0


def _clock(ts: float | None) -> str:
    """A time as a person reads it: the time of day, with the date when it is not today."""
    if not ts:
        return "?"
    when = dt.datetime.fromtimestamp(ts)
    return when.strftime("%H:%M:%S" if when.date() == dt.date.today() else "%Y-%m-%d %H:%M:%S")


def line_text(line: dict) -> str:
    stamp = dt.datetime.fromtimestamp(float(line["ts"])).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{stamp} {str(line['level']).upper():<8} {line['logger']}: {line['message']}"


def no_answer(device_id: str, state: dict, waited: float) -> str | None:
    """Why the device has not answered the request ``state`` is about (None: it has)."""
    if not state.get("online"):
        return f"{device_id} is offline since {_clock(state.get('last_seen'))}"
    if state.get("refused"):
        return f"{device_id} refused the request ({state['refused']})"
    requested, received = state.get("requested_at"), state.get("received_at")
    if requested is None or received is None or received < requested:
        return f"no answer from {device_id} within {waited:g} s"
    return None


def _await(read: Any, device_id: str, state: dict, wait: float, done: Any) -> tuple[dict, str | None]:
    """Read ``read()`` until ``done(state)`` or the bound: the last state, and why there is no answer (None)."""
    deadline = time.monotonic() + wait
    while state.get("online") and not state.get("refused") and not done(state) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = read() or state
    return state, None if state.get("online") and done(state) else no_answer(device_id, state, wait)


def _answered(state: dict) -> bool:
    received, requested = state.get("received_at"), state.get("requested_at")
    return received is not None and requested is not None and received >= requested


@click.command("logs")
@click.argument("device_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines as the device logs them (Ctrl-C ends).")
@click.option("--since", callback=duration, help="Only lines written in the last DURATION (30s, 10m, 1h).")
@click.option("--level", type=click.Choice(list(LEVELS)), help="Only lines at this level or above.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 5000),
              help="At most this many lines (the newest).")
@click.option("--wait", default="10s", show_default=True, callback=duration,
              help="How long to wait for the device's answer before showing what the manager has.")
@click.option("--json", "as_json", is_flag=True, help="A JSON document (--follow: one JSON object a line).")
@client_options
def logs(client: Any, device_id: str, follow: bool, since: float | None, level: str | None, limit: int, wait: float,
         as_json: bool) -> None:
    """Show DEVICE's recent log lines (secrets redacted on the device), asking the device for them (operator).

    Exit 0 when the device answered; 3 when it is offline or did not answer within --wait, after showing the
    lines the manager received before."""
    query = {"since": round(time.time() - since, 3) if since else None, "level": level, "limit": limit,
             "follow": follow or None}
    state = client.request_logs(device_id, follow=follow)
    state, why = _await(lambda: client.logs(device_id, **{**query, "limit": 1}), device_id, state, wait,
                        lambda s: _answered(s) and s.get("complete") is not False)
    page = client.logs(device_id, **query) or state
    shown = page.get("lines") or []
    if why is not None:
        why = f"{why}; showing the {len(shown)} line{'s' if len(shown) != 1 else ''} received before"
    if as_json and not follow:
        print_json({**{k: v for k, v in page.items() if k != "lines"}, "answered": why is None, "note": why,
                    "lines": shown})
    else:
        _print(shown, as_json)
    if why is not None:
        click.echo(why, err=True)
    if not follow:
        sys.exit(0 if why is None else EXIT_NO_ANSWER)
    if not page.get("online"):
        sys.exit(EXIT_NO_ANSWER)
    _follow(client, device_id, {**query, "limit": 5000}, page.get("next") or 0, as_json)


def _print(lines: list[dict], as_json: bool) -> None:
    for line in lines:
        if as_json:
            print_json_line(line)
        else:
            click.echo(line_text(line))


def print_json_line(value: Any) -> None:
    import json

    click.echo(json.dumps(value, separators=(",", ":"), default=str))


def _follow(client: Any, device_id: str, query: dict, after: int, as_json: bool) -> None:
    """Print new lines as they are stored, until Ctrl-C (exit 0) or the device goes offline (exit 3)."""
    try:
        while True:
            time.sleep(FOLLOW_POLL_S)
            page = client.logs(device_id, **{**query, "since": None, "after": after})
            if page is None:
                raise click.ClickException(f"no device {device_id}")
            _print(page["lines"], as_json)
            after = page.get("next") or after
            if not page.get("online"):
                click.echo(f"{device_id} went offline at {_clock(page.get('last_seen'))}", err=True)
                sys.exit(EXIT_NO_ANSWER)
    except KeyboardInterrupt:
        return


@click.command("doctor")
@click.argument("device_id")
@click.option("--wait", default="90s", show_default=True, callback=duration,
              help="How long to wait for the report (the device stops its doctor after 60 s).")
@click.option("--json", "as_json", is_flag=True, help="The whole answer as JSON (the report is `doctor --json`'s).")
@client_options
def doctor(client: Any, device_id: str, wait: float, as_json: bool) -> None:
    """Run `edgeinfer doctor` on DEVICE and show its report (operator).

    Exit 0: no problem found; 1: problems found (or the doctor failed on the device); 3: the device is offline,
    did not answer within --wait, or refused."""
    state = client.request_doctor(device_id)
    state, why = _await(lambda: client.doctor(device_id), device_id, state, wait, _answered)
    report = state.get("report") if why is None else None
    if as_json:
        print_json({**state, "answered": why is None, "note": why})
    elif why is None:
        click.echo(f"doctor on {device_id} ({_clock(state.get('ran_at'))}, {state.get('duration_s') or 0:.1f} s):")
        if report is not None:
            for line in report_lines(report):
                click.echo(line)
    if why is not None:
        last = f"; its last report came at {_clock(state.get('received_at'))}" if state.get("received_at") else ""
        click.echo(why + last, err=True)
        sys.exit(EXIT_NO_ANSWER)
    if report is None:
        click.echo(f"edgeinfer: error: the doctor on {device_id} gave no report: {state.get('error')}", err=True)
        sys.exit(1)
    sys.exit(1 if report.get("problems") else 0)
