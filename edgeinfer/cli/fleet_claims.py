"""``edgeinfer fleet claim create|list|revoke|pending|approve|reject``: claims for zero-touch provisioning, and the
devices waiting for an operator (docs/provisioning.md, *Claims*). Admin only, audited by the manager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from .fleet_access import _when, client_options, table
from .output import print_json


@click.group("claim")
def claim() -> None:
    """Claims: one token baked into an image, traded by each device for its own certificate on first boot."""


def read_serials(path: Path) -> list[str]:
    """One serial a line (blank lines and ``#`` comments skipped), each checked as the manager checks it."""
    from ..fleet.claims import SERIAL_RE

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                                 param_hint="--serials") from None
    serials = []
    for number, line in enumerate(lines, 1):
        serial = line.split("#", 1)[0].strip()
        if not serial:
            continue
        if not SERIAL_RE.fullmatch(serial):
            raise click.BadParameter(f"{path}:{number}: {serial!r} is not a serial (1-64 of A-Z a-z 0-9 . _ : -)",
                                     param_hint="--serials")
        serials.append(serial)
    if not serials:
        raise click.BadParameter(f"{path} lists no serial", param_hint="--serials")
    return serials


def _expires(_ctx: Any, param: Any, value: str) -> float | None:
    from ..fleet.client import parse_duration

    if value.strip().lower() == "never":
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (e.g. 7d, 12h; or never)", param=param) from None


@claim.command("create")
@click.option("--group", "groups", multiple=True, required=True, help="A group its devices join (repeatable).")
@click.option("--expires", default="30d", show_default=True, callback=_expires,
              help="How long it admits new devices: 7d, 12h... or never (devices already in keep working).")
@click.option("--max-devices", type=click.IntRange(1, 1_000_000), help="The most devices it admits (default: any).")
@click.option("--approve", type=click.Choice(["auto", "manual"]), default="auto", show_default=True,
              help="auto: a device gets its certificate at once; manual: it waits until an operator approves it.")
@click.option("--serials", type=click.Path(dir_okay=False, path_type=Path),
              help="Admit only the serials in this file (one a line, # comments).")
@click.option("--name-template", default="cam-{serial}", show_default=True,
              help="The device id: {serial} replaced by its serial (a ':' written '-'); a taken name gets -2, -3...")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Also write DIR/agent.yaml (mode 0600) and DIR/fleet-ca.crt for the image.")
@click.option("--json", "as_json", is_flag=True)
@client_options
def claim_create(client: Any, groups: tuple[str, ...], expires: float | None, max_devices: int | None, approve: str,
                 serials: Path | None, name_template: str, out: Path | None, as_json: bool) -> None:
    """Create a claim and print its token — the only time it is shown; the manager keeps a hash — as the agent.yaml
    lines of the image: claim, manager_url, ca (the fleet CA, a file beside agent.yaml) and update_public_key."""
    from ..util.fs import atomic_write_bytes

    spec = {"groups": list(groups), "expires_s": expires, "max_devices": max_devices, "approve": approve,
            "name_template": name_template, "serials": read_serials(serials) if serials else None}
    created = client.create_claim(spec)
    text = yaml.safe_dump(created["agent_config"], sort_keys=False)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / "agent.yaml", text.encode(), mode=0o600)
        atomic_write_bytes(out / created["agent_config"]["ca"], created["ca_pem"].encode(), mode=0o644)
    if as_json:
        print_json(created)
        return
    click.echo(f"# claim {created['claim_id']}: groups {', '.join(created['groups'])}, {created['approve']} approval, "
               f"{created['max_devices'] or 'any number of'} devices, expires {_when(created['expires_at'])}. Its "
               f"token is not shown again. Put these lines into the image's agent.yaml, and the fleet CA beside it as "
               f"{created['agent_config']['ca']}" + (f" (written to {out})" if out else " (--out DIR writes both)"),
               err=True)
    click.echo(text, nl=False)


@claim.command("list")
@click.option("--json", "as_json", is_flag=True)
@client_options
def claim_list(client: Any, as_json: bool) -> None:
    """Every claim: state, devices used of its maximum, approval, groups, expiry (never a token)."""
    claims = client.claims()
    if as_json:
        print_json(claims)
        return
    table([[c["claim_id"], c["state"], f"{c['used']}/{c['max_devices'] or '-'}", c["approve"], ",".join(c["groups"]),
            str(c["serials"] or "any"), _when(c["created_at"]), _when(c["expires_at"]) if c["expires_at"] else "never"]
           for c in claims], ["ID", "STATE", "USED", "APPROVE", "GROUPS", "SERIALS", "CREATED", "EXPIRES"])


@claim.command("revoke")
@click.argument("claim_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def claim_revoke(client: Any, claim_id: str, as_json: bool) -> None:
    """Revoke CLAIM_ID: it admits no new device; the devices it let in are untouched."""
    revoked = client.revoke_claim(claim_id)
    print_json(revoked) if as_json else click.echo(f"revoked claim {claim_id}: {revoked['used']} device(s) it let in "
                                                   "keep working")


@claim.command("pending")
@click.option("--all", "every", is_flag=True, help="Every request, approved and rejected ones too.")
@click.option("--json", "as_json", is_flag=True)
@client_options
def claim_pending(client: Any, every: bool, as_json: bool) -> None:
    """Devices waiting for an operator (approve or reject them), with the hardware facts they sent."""
    found = client.provisioning(None if every else "pending")
    if as_json:
        print_json(found)
        return
    table([[r["device_id"], r["state"], r["serial"], r["hardware"].get("model") or "-", r["hardware"].get("mac") or "-",
            r["claim_id"], r.get("remote") or "-", _when(r["requested_at"])] for r in found],
          ["DEVICE", "STATE", "SERIAL", "MODEL", "MAC", "CLAIM", "FROM", "REQUESTED"])


@claim.command("approve")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def claim_approve(client: Any, device_id: str, as_json: bool) -> None:
    """Approve a pending DEVICE_ID: its certificate is signed, and its next request gets it."""
    decided = client.approve_device(device_id)
    print_json(decided) if as_json else click.echo(f"approved {device_id} (serial {decided['serial']}): it gets its "
                                                   "certificate at its next request")


@claim.command("reject")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def claim_reject(client: Any, device_id: str, as_json: bool) -> None:
    """Reject a pending DEVICE_ID for good: its requests are refused (403)."""
    decided = client.reject_device(device_id)
    print_json(decided) if as_json else click.echo(f"rejected {device_id} (serial {decided['serial']})")
