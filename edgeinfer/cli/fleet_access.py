"""Who may do what: ``edgeinfer fleet token|enroll|revoke|audit``, and the options every API command shares."""

from __future__ import annotations

import datetime as dt
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from .fleet_db import data_dir_option, database_url, db_option
from .output import handle_errors, print_json


def client_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--fleet-url``, ``--token-file`` and ``--ca``; the command gets ``client`` (a FleetClient) instead,
    and its EdgeInferErrors become one line and exit 1 (:func:`handle_errors`, applied here)."""

    @click.option("--fleet-url", envvar="EDGEINFER_FLEET_URL", default="http://127.0.0.1:8700", show_default=True,
                  help="The fleet manager's address ($EDGEINFER_FLEET_URL).")
    @click.option("--token-file", envvar="EDGEINFER_FLEET_TOKEN_FILE", type=click.Path(dir_okay=False),
                  help="File holding the API token ($EDGEINFER_FLEET_TOKEN_FILE; or the token itself in "
                       "$EDGEINFER_FLEET_TOKEN). `fleet serve` writes an admin token to DATA_DIR/admin.token.")
    @click.option("--ca", "fleet_ca", envvar="EDGEINFER_FLEET_CA", type=click.Path(exists=True, dir_okay=False),
                  help="For an https manager: the CA that signed it (DATA_DIR/tls/ca.crt with --tls).")
    @functools.wraps(func)
    @handle_errors  # the command's errors, and an unreadable token file, as one line
    def wrapper(*args: Any, fleet_url: str, token_file: str | None, fleet_ca: str | None, **kwargs: Any) -> Any:
        from ..fleet.client import FleetClient

        return func(*args, client=FleetClient(fleet_url, token_file=token_file, ca=fleet_ca), **kwargs)

    return wrapper


def duration(_ctx: Any, param: Any, value: str | float | None) -> float | None:
    """A click callback: ``30s``, ``5m``, ``1h`` or seconds → seconds, or a usage error that says so."""
    from ..fleet.client import parse_duration

    if value is None or isinstance(value, float):
        return value
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        raise click.BadParameter(f"{exc} (e.g. 30s, 5m, 1h)", param=param) from None


def verdict_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--wait/--no-wait and --timeout of a command whose verdict the CLI waits for (``follow_command``)."""
    func = click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
                        help="Seconds to wait for the device's answer at most.")(func)
    return click.option("--wait/--no-wait", default=True, show_default=True,
                        help="Wait for the device's verdict (applied, or refused and why).")(func)


def follow_command(client: Any, sent: dict, line: str, *, wait: bool, timeout: float, as_json: bool) -> None:
    """A command sent to a device: ``line`` (what was sent) alone with ``wait`` off, else the device's verdict waited
    for and said in the words of ``fleet/verdicts.py`` — the dashboard's. Exit 1 when the device refused it, it
    expired, no answer came within ``timeout`` (it stays queued for the device), or (a capture) not every frame
    reached the manager."""
    from ..fleet.client import wait_for_command  # the fleet's client loads on use (the agent's CLI must not)

    if not wait:
        print_json(sent) if as_json else click.echo(line)
        return
    if not as_json:
        click.echo(f"{line}; waiting for the device…", err=True)
    found = wait_for_command(client.command, sent["command_id"], timeout_s=timeout)
    print_json(found) if as_json else click.echo(found["text"])
    if found["state"] == "sent":
        click.echo(f"edgeinfer: error: no answer from {found.get('device_id') or 'the device'} within {timeout:g} s: "
                   "the command stays queued for it (it runs it when it reconnects, until the command expires)",
                   err=True)
    elif not found["settled"]:
        click.echo(f"edgeinfer: error: not every frame reached the manager within {timeout:g} s", err=True)
    if found["state"] != "applied" or not found["settled"]:
        sys.exit(1)


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def table(rows: list[list[str]], headers: list[str]) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    for row in [headers, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


@click.group("token")
def token() -> None:
    """API tokens: viewer (read), operator (deploy, rollback, restart, abort), admin (tokens, enrolment)."""


@token.command("create")
@click.option("--role", required=True, type=click.Choice(["viewer", "operator", "admin"]))
@click.option("--name", required=True, help="Who or what uses it (shown in the audit log).")
@click.option("--expires", help="Lifetime: 90d, 12h, 30m... (default: until revoked).")
@click.option("--json", "as_json", is_flag=True)
@client_options
def token_create(client: Any, role: str, name: str, expires: str | None, as_json: bool) -> None:
    """Create a token and print it — the only time it is shown; the manager keeps a hash."""
    from ..fleet.client import parse_duration

    created = client.create_token(name, role, parse_duration(expires) if expires else None)
    if as_json:
        print_json(created)
        return
    click.echo(f"token {created['token_id']} ({created['role']}, {created['name']}, expires "
               f"{_when(created['expires_at']) if created['expires_at'] else 'never'}) — store it now, "
               "it is not shown again:", err=True)
    click.echo(created["token"])


@token.command("list")
@click.option("--json", "as_json", is_flag=True)
@client_options
def token_list(client: Any, as_json: bool) -> None:
    """Every token: id, name, role, created, expires, revoked, last used (never the token)."""
    tokens = client.tokens()
    if as_json:
        print_json(tokens)
        return
    table([[t["token_id"], t["name"], t["role"], _when(t["created_at"]), _when(t["expires_at"]),
            _when(t["revoked_at"]), _when(t["last_used_at"])] for t in tokens],
          ["ID", "NAME", "ROLE", "CREATED", "EXPIRES", "REVOKED", "LAST USED"])


@token.command("revoke")
@click.argument("token_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def token_revoke(client: Any, token_id: str, as_json: bool) -> None:
    """Revoke a token (by the id `token list` shows): refused from the next request on."""
    revoked = client.revoke_token(token_id)
    print_json(revoked) if as_json else click.echo(f"revoked token {revoked['token_id']} ({revoked['name']})")


@click.command("enroll")
@click.argument("device_ids", metavar="DEVICE_ID...", nargs=-1, required=True)
@click.option("--fleet", "fleet_name", help="The devices' fleet (default: default).")
@click.option("--certificate", is_flag=True,
              help="Issue a key and a client certificate of the fleet's CA instead of a password (the manager runs "
                   "with --tls): written beside --out as DEVICE_ID.crt, DEVICE_ID.key (0600) and ca.crt.")
@click.option("--json", "as_json", is_flag=True, help="Print the agent.yaml keys as JSON (a list for several).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write them to this YAML file (mode 0600), to merge into the device's agent.yaml.")
@client_options
def enroll(client: Any, device_ids: tuple[str, ...], fleet_name: str | None, certificate: bool, as_json: bool,
           out: Path | None) -> None:
    """Issue each DEVICE_ID its MQTT credential and open its topics on the managed broker.

    Prints what goes into the device's agent.yaml — broker, username and password (or, with
    --certificate, cert, key and ca), manager_url, the fleet's update key; the password (or key) is
    shown only now. Enrolling again issues a new one. Several devices are enrolled with one broker
    reload (a list of YAML documents, or of JSON objects). Many devices from one image: a claim
    instead (docs/provisioning.md).
    """
    from ..util.fs import atomic_write_bytes

    if certificate and out is None:
        raise click.UsageError("--certificate writes the key and certificate beside --out: give --out FILE")
    issued = client.enroll_many(list(device_ids), fleet_name, certificate=certificate)
    issued = [_agent_keys(entry, out.parent if out else None) for entry in issued]
    text = yaml.safe_dump(issued[0], sort_keys=False) if len(issued) == 1 else yaml.safe_dump_all(issued,
                                                                                                  sort_keys=False)
    if out is not None:
        atomic_write_bytes(out, text.encode(), mode=0o600)
    if as_json:
        print_json(issued[0] if len(issued) == 1 else issued)
    else:
        secret = "key" if certificate else "password"
        click.echo(f"# {', '.join(device_ids)} enrolled: put these keys into its agent.yaml (the {secret} is not "
                   "shown again)", err=True)
        click.echo(text, nl=False)


def _agent_keys(entry: dict, folder: Path | None) -> dict:
    """What enroll answered as agent.yaml keys: a certificate's PEMs written to files in ``folder``, named by
    ``cert``, ``key`` and ``ca``; nothing left empty."""
    from ..util.fs import atomic_write_bytes

    pems = {k: entry.pop(k, None) for k in ("certificate", "private_key", "ca_certificate")}
    if pems["certificate"] and folder is not None:
        device = entry["device_id"]
        files = ((f"{device}.crt", pems["certificate"], 0o644), (f"{device}.key", pems["private_key"], 0o600),
                 ("ca.crt", pems["ca_certificate"], 0o644))
        for name, pem, mode in files:
            atomic_write_bytes(folder / name, pem.encode(), mode=mode)
        entry.update(cert=str(folder / f"{device}.crt"), key=str(folder / f"{device}.key"), ca=str(folder / "ca.crt"))
    return {k: v for k, v in entry.items() if v is not None}


@click.command("revoke")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def revoke(client: Any, device_id: str, as_json: bool) -> None:
    """Revoke DEVICE_ID's credential: the broker drops and refuses it, artifact downloads answer 401."""
    result = client.revoke_device(device_id)
    print_json(result) if as_json else click.echo(f"revoked {device_id}: it can no longer connect")


@click.command("enrollments")
@click.option("--json", "as_json", is_flag=True)
@client_options
def enrollments(client: Any, as_json: bool) -> None:
    """Every enrolled device: its MQTT user name, fleet, when enrolled, whether revoked (never a password)."""
    entries = client.enrollments()
    if as_json:
        print_json(entries)
        return
    table([[e["device_id"], e["fleet"], e["username"], _when(e["created_at"]), _when(e["revoked_at"])]
           for e in entries], ["DEVICE", "FLEET", "USER", "ENROLLED", "REVOKED"])


@click.command("audit")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@client_options
def audit(client: Any, limit: int, as_json: bool) -> None:
    """Who (token name) did what, to what, when and from where: deploys, aborts, rollbacks, tokens, enrolment."""
    entries = client.audit(limit)
    if as_json:
        print_json(entries)
        return
    table([[_when(e["ts"]), e["actor"], e.get("role") or "-", e["action"], e.get("target") or "-",
            e.get("remote") or "-"] for e in entries], ["WHEN", "WHO", "ROLE", "ACTION", "TARGET", "FROM"])


@click.command("broker-auth")
@db_option
@data_dir_option
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for `passwd` and `acl` (point Mosquitto's password_file and acl_file at them).")
@click.option("--manager", "managers", multiple=True, required=True, metavar="USER:PASSWORD_FILE",
              help="A fleet manager's account: its user name (= its --manager-id under use_username_as_clientid) "
                   "and the file holding its password (repeatable: one per manager).")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def broker_auth(db_url: str | None, data_dir: Path, out: Path, managers: tuple[str, ...], as_json: bool) -> None:
    """Write Mosquitto's password and ACL files for a broker you run (`fleet serve --broker`).

    The same files the managed Mosquitto gets: every enrolled, not revoked device with its own
    topics only, and the managers' accounts. Run it after `fleet enroll` / `fleet revoke`, then
    make Mosquitto re-read them: kill -HUP <mosquitto's pid>. Needs allow_anonymous false and
    use_username_as_clientid true in mosquitto.conf (docs/security.md).
    """
    from ..fleet.broker_auth import ManagerAccount, device_accounts, hash_password, write_auth_files
    from ..fleet.db import FleetDB

    accounts = []
    for spec in managers:
        user, sep, password_file = spec.partition(":")
        if not sep or not user or not password_file:
            raise click.BadParameter(f"{spec!r}: give USER:PASSWORD_FILE", param_hint="--manager")
        try:
            password = Path(password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise click.BadParameter(f"cannot read {password_file}: {exc.strerror or exc}",
                                     param_hint="--manager") from None
        accounts.append(ManagerAccount(username=user, password_hash=hash_password(password)))
    database = FleetDB(database_url(db_url, data_dir))
    try:
        devices = device_accounts(database.list_credentials())
    finally:
        database.close()
    files = write_auth_files(out, accounts, devices)
    summary = {"password_file": str(files.password_file), "acl_file": str(files.acl_file),
               "devices": len(devices), "managers": [a.username for a in accounts]}
    if as_json:
        print_json(summary)
    else:
        click.echo(f"wrote {files.password_file} and {files.acl_file}: {len(devices)} device(s), "
                   f"{len(accounts)} manager account(s) — now: kill -HUP <mosquitto's pid>")
