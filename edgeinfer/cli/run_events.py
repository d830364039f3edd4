"""``edgeinfer run --event``: each event printed as it is recorded, and the tally at the end."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable

import click


def event_printer(as_json: bool, tty: bool) -> Callable[[dict], None]:
    """A listener printing each event as it is recorded: a JSON line, or a line of text."""
    lock = threading.Lock()

    def show(event: dict) -> None:
        with lock:
            if as_json:
                sys.stdout.write(json.dumps({"type": "event", **event}) + "\n")
                sys.stdout.flush()
                return
            what = event["kind"] + (f" {event['name']}" if event.get("name") else "")
            what += f" {event['direction']}" if event.get("direction") else ""
            who = f"{event['label']}" + (f" #{event['track_id']}" if event.get("track_id") is not None else "")
            stream = f"[{event['stream']}] " if event.get("stream") else ""
            click.echo(("\r\033[K" if tty else "") + f"event {stream}{what}: {who} at frame {event['frame_id']}"
                       + (f" -> {event['clip']}" if event.get("clip") else ""))

    return show


def print_event_counts(counts: dict, folder: str | None) -> None:
    held = counts["suppressed"] + counts["rate_limited"]
    click.echo(f"events: {counts['delivered']} recorded" + (f" in {folder}" if folder else "")
               + (f", {held} held back (cooldown / rate limit)" if held else "")
               + (f", {counts['failed']} not written" if counts["failed"] else ""))


def print_sample_counts(counts: dict, folder: str) -> None:
    """What the sampling rules kept (``StreamSampler.counts()``), at the end of a run."""
    held = counts["rate_limited"] + counts["dropped"]
    click.echo(f"capture: {counts['written']} sample(s) kept in {folder}"
               + (f", {held} held back (rate limit / a busy disk)" if held else "")
               + (f", {counts['failed']} not written" if counts["failed"] else ""))
