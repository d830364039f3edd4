"""``edgeinfer fleet config get|set|edit|history|rollback|apply|status``: the configuration the fleet holds — layers
for a fleet, a group or a device, in revisions, rolled out like a model (docs/fleet.md, *Configuration*).

Exit codes: 0 done (saved, and every device it went to took it — or none needed it; ``status``: every device shown
runs its desired document); 1 an error, or a device did not take it (refused, rolled back, timed out) or the rollout
stopped (``status``: a device is out of step); 2 a usage error; 3 the layer was saved by someone else since it was
read (409, and the layer has moved on): read it again. A document a device would refuse is a 409 too (the key named
in ``agent --check``'s words): exit 1.
"""

from __future__ import annotations

import datetime as dt
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from ..errors import FleetRequestError
from .fleet_access import client_options, table
from .output import print_json
from .rollout import follow, longest_wait, rollout_fields, rollout_options

#: the exit code of an edit made on a revision that is no longer the layer's newest
STALE = 3
SCOPES = ("fleet", "group", "device")


def layer_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--fleet NAME`` / ``--group NAME`` / ``--device ID``, exactly one: the command gets ``layer`` (scope, name)."""

    @click.option("--fleet", "fleet_name", metavar="NAME", help="The layer of every device of this fleet.")
    @click.option("--group", metavar="NAME", help="The layer of every device in this group.")
    @click.option("--device", metavar="ID", help="The layer of this device alone.")
    @functools.wraps(func)
    def wrapper(*args: Any, fleet_name: str | None, group: str | None, device: str | None, **kwargs: Any) -> Any:
        given = [(scope, name) for scope, name in zip(SCOPES, (fleet_name, group, device)) if name]
        if len(given) != 1:
            raise click.UsageError("give exactly one of --fleet, --group or --device")
        return func(*args, layer=given[0], **kwargs)

    return wrapper


def change_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What a command that saves a revision takes: why, whether to apply it now, the rollout, following it."""
    for option in reversed((
            click.option("-m", "--message", default="", help="Why (kept with the revision, shown in its history)."),
            click.option("--revision", "base", type=click.IntRange(min=0),
                         help="The revision the change is made on (default: the layer's newest, read now); another "
                              "save since it is refused (exit 3)."),
            click.option("--no-apply", is_flag=True, help="Save only: the devices get it with `fleet config apply`."),
            click.option("--no-wait", is_flag=True, help="Start the rollout and return."),
            click.option("--json", "as_json", is_flag=True))):
        func = option(func)
    return rollout_options(func)


@click.group("config")
def config() -> None:
    """The configuration the fleet holds: layers for a fleet, a group or a device (the device's wins), each saved in
    revisions and rolled out like a model (docs/fleet.md, Configuration).

    \b
    Exit codes: 0 done (every device it went to took it; status: all in step),
    1 an error, a device that did not take it, a rollout stopped (status: one out of step),
    2 a usage error, 3 someone saved the layer since it was read (read it again)."""


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _header(layer: dict) -> str:
    state = "applied" if layer.get("applied_at") else "saved, not applied" if layer["revision"] else "never saved"
    line = f"# {layer['layer']} revision {layer['revision']} ({state})"
    if layer["revision"]:
        line += f" — {layer['author']}, {_when(layer['created_at'])}" + (f": {layer['message']}"
                                                                          if layer.get("message") else "")
    return line + "\n# secrets show as ***: leave them so and the stored ones are kept\n"


@config.command("get")
@layer_options
@click.option("--effective", is_flag=True, help="With --device: the document its layers merge into, and where each "
                                                "key comes from.")
@click.option("--json", "as_json", is_flag=True)
@client_options
def config_get(client: Any, layer: tuple[str, str], effective: bool, as_json: bool) -> None:
    """A layer's document (YAML, secrets masked), or with --effective a device's merged one."""
    if effective:
        if layer[0] != "device":
            raise click.UsageError("--effective goes with --device")
        found = client.device_config(layer[1])
        if found is None:
            raise click.ClickException(f"no device {layer[1]}")
        if as_json:
            print_json(found)
            return
        click.echo(f"# {layer[1]}: {found['status']}; layers {' → '.join(found['layers'])} (the later wins); "
                   f"agent.yaml says: {', '.join(found['bootstrap']) or 'nothing the layers set'}")
        click.echo(yaml.safe_dump(found["document"], sort_keys=False, allow_unicode=True).rstrip())
        for path, origin in found["origins"].items():
            click.echo(f"#   {path}: {origin}")
        return
    found = client.config_layer(*layer)
    if as_json:
        print_json(found)
    else:
        click.echo(_header(found) + yaml.safe_dump(found["document"], sort_keys=False, allow_unicode=True).rstrip())


def _read(path: str) -> dict:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{path} is not YAML: {exc}", param_hint="FILE") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise click.BadParameter(f"{path} holds a {type(document).__name__}, not a mapping of keys", param_hint="FILE")
    return document


def diff_lines(diff: list[dict]) -> list[str]:
    """A revision's diff, a line per key: ``+ path: value``, ``- path: value``, ``~ path: before → after``."""
    lines = []
    for entry in diff:
        if entry["op"] == "add":
            lines.append(f"+ {entry['path']}: {entry['after']!r}")
        elif entry["op"] == "remove":
            lines.append(f"- {entry['path']}: {entry['before']!r}")
        elif entry.get("secret"):
            lines.append(f"~ {entry['path']}: {entry['after']!r} (its secret changed)")
        else:
            lines.append(f"~ {entry['path']}: {entry['before']!r} → {entry['after']!r}")
    return lines


def _changed(client: Any, call: Callable[[], dict], *, as_json: bool, no_wait: bool, rollout: dict,
             layer: tuple[str, str] | None = None, revision: int | None = None) -> None:
    """Make the change (on ``layer``'s ``revision``), show its diff and what it deployed, follow the rollout; exit as
    the module says."""
    try:
        result = call()
    except FleetRequestError as exc:
        # 409: the layer moved on since it was read (exit 3), or the device's check refused the document (an error)
        if exc.status != 409 or layer is None or int(client.config_layer(*layer)["revision"]) == revision:
            raise
        click.echo(f"edgeinfer: error: {exc}", err=True)
        sys.exit(STALE)
    layer, deployment = result["layer"], result["deployment"]
    if not as_json:
        click.echo(f"{layer['layer']}: revision {layer['revision']}" + ("" if layer.get("applied_at") else
                                                                        " (saved, not applied)"), err=True)
        for line in diff_lines(layer.get("diff") or []) or ["(no change)"]:
            click.echo(f"  {line}", err=True)
        for skipped in result["skipped"]:
            click.echo(f"  {skipped['device_id']}: not sent — {skipped['reason']}", err=True)
    if deployment is None or no_wait:
        if as_json:
            print_json(result)
        elif deployment is not None:
            click.echo(deployment["deployment_id"])
        return
    if not as_json:
        click.echo(f"deployment {deployment['deployment_id']}: {len(deployment['devices'])} device(s) in "
                   f"{1 + max(t['wave'] for t in deployment['devices'])} wave(s)", err=True)
    _, all_active = follow(client, deployment["deployment_id"], timeout_s=longest_wait(rollout), as_json=as_json)
    sys.exit(0 if all_active else 1)


def _base(client: Any, layer: tuple[str, str], base: int | None) -> int:
    return base if base is not None else int(client.config_layer(*layer)["revision"])


@config.command("set")
@click.argument("file", type=click.Path(allow_dash=True, dir_okay=False))
@layer_options
@change_options
@client_options
def config_set(client: Any, file: str, layer: tuple[str, str], message: str, base: int | None, no_apply: bool,
               no_wait: bool, as_json: bool, **rollout: Any) -> None:
    """Save FILE (YAML: the keys the layer sets; - for stdin) as the layer's next revision and roll it out."""
    document, fields = _read(file), rollout_fields(**rollout)
    revision = _base(client, layer, base)
    _changed(client, lambda: client.save_config(*layer, document, revision=revision, message=message,
                                                apply=not no_apply, rollout=fields),
             as_json=as_json, no_wait=no_wait, rollout=fields, layer=layer, revision=revision)


@config.command("edit")
@layer_options
@change_options
@client_options
def config_edit(client: Any, layer: tuple[str, str], message: str, base: int | None, no_apply: bool, no_wait: bool,
                as_json: bool, **rollout: Any) -> None:
    """Edit the layer in $EDITOR (secrets masked: leave them so to keep them), then save and roll it out."""
    current = client.config_layer(*layer)
    text = _header(current) + yaml.safe_dump(current["document"], sort_keys=False, allow_unicode=True)
    edited = click.edit(text, extension=".yaml")
    if edited is None or yaml.safe_load(edited) == yaml.safe_load(text):
        click.echo("no change", err=True)
        return
    document, fields = yaml.safe_load(edited) or {}, rollout_fields(**rollout)
    if not isinstance(document, dict):
        raise click.UsageError("the edited layer is not a mapping of keys")
    revision = current["revision"] if base is None else base
    _changed(client, lambda: client.save_config(*layer, document, revision=revision, message=message,
                                                apply=not no_apply, rollout=fields),
             as_json=as_json, no_wait=no_wait, rollout=fields, layer=layer, revision=revision)


@config.command("rollback")
@click.argument("to_revision", type=click.IntRange(min=1))
@layer_options
@change_options
@client_options
def config_rollback(client: Any, to_revision: int, layer: tuple[str, str], message: str, base: int | None,
                    no_apply: bool, no_wait: bool, as_json: bool, **rollout: Any) -> None:
    """Make the layer's next revision equal to TO_REVISION, and roll it out."""
    fields, revision = rollout_fields(**rollout), _base(client, layer, base)
    _changed(client, lambda: client.rollback_config(*layer, to_revision, revision=revision, message=message,
                                                    apply=not no_apply, rollout=fields),
             as_json=as_json, no_wait=no_wait, rollout=fields, layer=layer, revision=revision)


@config.command("apply")
@layer_options
@rollout_options
@click.option("--no-wait", is_flag=True, help="Start the rollout and return.")
@click.option("--json", "as_json", is_flag=True)
@client_options
def config_apply(client: Any, layer: tuple[str, str], no_wait: bool, as_json: bool, **rollout: Any) -> None:
    """Release the layer's newest revision (saved with --no-apply) and roll it out to the devices that lack it."""
    fields = rollout_fields(**rollout)
    _changed(client, lambda: client.apply_config(*layer, fields), as_json=as_json, no_wait=no_wait, rollout=fields)


@config.command("history")
@layer_options
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@client_options
def config_history(client: Any, layer: tuple[str, str], limit: int, as_json: bool) -> None:
    """The layer's revisions, newest first: who, when, why, applied, what changed."""
    revisions = client.config_history(*layer, limit)
    if as_json:
        print_json(revisions)
        return
    table([[str(r["revision"]), _when(r["created_at"]), r["author"] or "-", "yes" if r["applied_at"] else "no",
            (f"= r{r['restored_from']} " if r["restored_from"] else "") + (r["message"] or ""),
            ", ".join(e["path"] for e in r.get("diff") or [])[:80]] for r in revisions],
          ["REVISION", "SAVED", "BY", "APPLIED", "MESSAGE", "CHANGED"])


@config.command("status")
@click.option("--fleet", "fleet_name", metavar="NAME", help="The devices of this fleet only.")
@click.option("--group", metavar="NAME", help="The devices of this group only.")
@click.option("--device", metavar="ID", help="This device only.")
@click.option("--json", "as_json", is_flag=True)
@client_options
def config_status(client: Any, fleet_name: str | None, group: str | None, device: str | None, as_json: bool) -> None:
    """Each device's configuration: desired vs applied vs refused (exit 1 when one does not run its desired one)."""
    if device:
        found = client.device_config(device)
        if found is None:
            raise click.ClickException(f"no device {device}")
        devices = [found]
    else:
        found = client.config_devices(fleet=fleet_name, group=group)
        devices = found["devices"]
    if as_json:
        print_json(found)
    else:
        table([[d["device_id"], d["status"], "online" if d["online"] else "offline",
                (d["desired"]["sha256"] or "-")[:12], ((d["applied"] or {}).get("sha256") or "-")[:12],
                _detail(d)] for d in devices], ["DEVICE", "STATUS", "LINK", "DESIRED", "APPLIED", "DETAIL"])
    sys.exit(0 if all(d["status"] in ("in_step", "unmanaged") for d in devices) else 1)


def _detail(device: dict) -> str:
    if device["status"] == "refused" and device["refused"]:
        return f"refused: {device['refused']['reason'] or device['refused']['state']}"
    if device["status"] == "invalid":
        return device["desired"]["problem"] or ""
    if device["status"] == "pending" and device["deployment"]:
        return f"{device['deployment']['state']} in {device['deployment']['deployment_id'][:12]}"
    return ""
