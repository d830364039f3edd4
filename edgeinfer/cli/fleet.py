"""``edgeinfer fleet serve|devices|deployments|deployment|abort|rollback|restart`` and ``edgeinfer deploy``."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from ..fleet.rollout import DeploymentStatus
from ..util.optional import import_optional
from .fleet_access import (
    audit,
    broker_auth,
    client_options,
    enroll,
    enrollments,
    follow_command,
    revoke,
    table,
    token,
    verdict_options,
)
from .fleet_claims import claim
from .fleet_config import config
from .fleet_dataset import dataset
from .fleet_db import db
from .fleet_eval import dataset_options, eval_options, target_devices
from .fleet_eval import require_eval as require_eval_gate
from .fleet_logs import doctor as fleet_doctor
from .fleet_logs import logs as fleet_logs
from .fleet_simulate import simulate
from .output import handle_errors, print_json
from .rollout import analysis_lines, follow, longest_wait, rollout_fields, rollout_options

SHARED_GROUP = "edgeinfer-fleet"


@click.group()
def fleet() -> None:
    """Run the fleet manager, or ask it about devices and deployments."""


for _command in (db, dataset, simulate, token, enroll, enrollments, revoke, audit, broker_auth, fleet_logs,
                 fleet_doctor, config, claim):
    fleet.add_command(_command)


@fleet.command("serve")
@click.option("--broker", help="An existing MQTT 5 broker (mqtt[s]://host:port: Mosquitto, EMQX, HiveMQ). "
              "Default: start and supervise Mosquitto on --broker-port, its data in --data-dir.")
@click.option("--broker-port", default=1883, show_default=True, help="Port of the managed Mosquitto.")
@click.option("--broker-host", default="127.0.0.1", show_default=True,
              help="Where the managed Mosquitto listens (0.0.0.0: every interface; it admits enrolled devices only).")
@click.option("--device-broker-url", help="The broker URL `fleet enroll` tells devices (default: the managed "
              "broker's, e.g. mqtts://fleet.example:8883 when devices reach it by another name).")
@click.option("--tls", is_flag=True, help="Serve the managed broker as mqtts:// and the API as https://, with "
              "certificates from the fleet's own CA (DATA_DIR/tls/ca.crt: give it to devices and the CLI).")
@click.option("--tls-host", "tls_hosts", multiple=True, help="A name or address devices use to reach this "
              "machine, added to the certificates (repeatable; localhost, 127.0.0.1 and the host name are in).")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False), help="mqtts://: the CA that signed the broker.")
@click.option("--cert", type=click.Path(exists=True, dir_okay=False), help="mqtts://: client certificate.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), help="mqtts://: client key (unencrypted).")
@click.option("--username", help="MQTT user name.")
@click.option("--password-file", type=click.Path(exists=True, dir_okay=False),
              help="File holding the MQTT password (kept out of the command line).")
@click.option("--db", "db_url", help="SQLAlchemy URL (default: sqlite in the data dir; postgresql://... works).")
@click.option("--http", default="127.0.0.1:8700", show_default=True, help="HOST:PORT for artifacts and the API.")
@click.option("--public-url", help="How devices reach the HTTP server, if not http://HOST:PORT.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("fleet-data"),
              show_default=True, help="Signing key, artifacts, database, command spool, Mosquitto's files.")
@click.option("--manager-id", help="MQTT client id of this manager (default: from the host name and data dir). "
              "Each manager sharing a broker needs its own.")
@click.option("--retention-days", default=7.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Keep raw telemetry this long.")
@click.option("--rollup-days", default=90.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Keep per-minute telemetry roll-ups and events this long.")
@click.option("--audit-days", default=365.0, show_default=True, type=click.FloatRange(min=1),
              help="Keep the audit log (who did what through the API) this long.")
@click.option("--shared-group", help="Run as one of several managers: share telemetry and events through the MQTT 5 "
              f"shared subscription $share/GROUP/... (every manager of the fleet gives the same GROUP, e.g. "
              f"{SHARED_GROUP}).")
@click.option("--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds after which another manager takes over the rollouts of one that stopped renewing them.")
@click.option("--evidence-max-mb", default=2048.0, show_default=True, type=click.FloatRange(min=1),
              help="Keep at most this much event evidence (snapshots and clips, in the database); the events "
                   "stored first lose theirs first.")
@click.option("--evidence-snapshot-max-mb", default=4.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Refuse (413) a snapshot.jpg upload larger than this.")
@click.option("--evidence-clip-max-mb", default=64.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Refuse (413) a clip.mjpeg upload larger than this.")
@click.option("--samples-max-mb", default=4096.0, show_default=True, type=click.FloatRange(min=1),
              help="Keep at most this much of samples (datasets); the oldest unreviewed go first.")
@click.option("--samples-days", default=90.0, show_default=True, type=click.FloatRange(min=0.01),
              help="Delete samples older than this.")
@click.option("--unauthenticated-rate", default=5.0, show_default=True, type=click.FloatRange(min=0),
              help="Per client address: provisioning requests and requests refused 401 (bad tokens, sign-ins) a "
                   "second, beyond the burst; then 429 with Retry-After. Authenticated requests are never limited. "
                   "0: no limit.")
@click.option("--unauthenticated-burst", default=50, show_default=True, type=click.IntRange(min=1),
              help="How many of those one address may send at once.")
@click.option("--device-cert-days", default=30.0, show_default=True, type=click.FloatRange(min=0.01, max=3650),
              help="The lifetime of a provisioned device's certificate (its agent renews it at two thirds).")
@handle_errors
def fleet_serve(broker: str | None, broker_port: int, broker_host: str, device_broker_url: str | None, tls: bool,
                tls_hosts: tuple[str, ...], ca: str | None, cert: str | None, key: str | None,
                username: str | None, password_file: str | None, db_url: str | None, http: str,
                public_url: str | None, data_dir: Path, manager_id: str | None, retention_days: float,
                rollup_days: float, audit_days: float, shared_group: str | None, lease_ttl: float,
                evidence_max_mb: float, evidence_snapshot_max_mb: float, evidence_clip_max_mb: float,
                samples_max_mb: float, samples_days: float, unauthenticated_rate: float, unauthenticated_burst: int,
                device_cert_days: float) -> None:
    """Ingest every device's state, telemetry and events; serve artifacts and the API; run rollouts.

    Several managers may share one broker and one PostgreSQL (--db postgresql+psycopg://...): each
    message is stored once, and one manager drives each rollout at a time.
    """
    # the lazy boundary: the fleet manager's modules import FastAPI, SQLAlchemy, uvicorn... at their top
    parts = import_optional("edgeinfer.fleet.manager", "fleet", "edgeinfer fleet serve")
    from ..fleet.ingest import tune_garbage_collector

    password = Path(password_file).read_text().rstrip("\r\n") if password_file else None
    settings = parts.FleetSettings(
        broker=broker, db_url=db_url, http=http, data_dir=data_dir, public_url=public_url, broker_port=broker_port,
        broker_host=broker_host, device_broker_url=device_broker_url, tls=tls, tls_hosts=tls_hosts, ca=ca, cert=cert,
        key=key, username=username, password=password, manager_id=manager_id, raw_retention_days=retention_days,
        rollup_retention_days=rollup_days, audit_retention_days=audit_days, lease_ttl_s=lease_ttl,
        shared_group=shared_group, evidence_max_bytes=_mib(evidence_max_mb),
        evidence_snapshot_max_bytes=_mib(evidence_snapshot_max_mb), evidence_clip_max_bytes=_mib(evidence_clip_max_mb),
        samples_max_bytes=_mib(samples_max_mb), samples_retention_days=samples_days,
        unauthenticated_rate=unauthenticated_rate, unauthenticated_burst=unauthenticated_burst,
        device_cert_days=device_cert_days)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with parts.FleetManager(settings) as manager:
        click.echo(f"agents pin: update_public_key: {manager.key.public_key_b64()}", err=True)
        if manager.access.admin_token_file is not None:
            click.echo(f"admin token: {manager.access.admin_token_file} (mode 0600; first start) — use it with "
                       f"--token-file, and create less powerful ones: edgeinfer fleet token create", err=True)
        if not tls and _exposed(http, broker_host if broker is None else None, public_url):
            click.echo("warning: the API or the broker listens beyond this machine without TLS: tokens and device "
                       "passwords cross the network in clear — use --tls, or a TLS reverse proxy with an https "
                       "--public-url (docs/security.md)", err=True)
        if manager.access.ca is not None:
            click.echo(f"fleet CA: {manager.access.ca.ca_file} (devices and the CLI verify the broker and the API "
                       "with it)", err=True)
        # the "fleet manager:" line last: scripts wait for it, and then every line above is there too
        where = "managed Mosquitto" if manager.broker is not None else "broker"
        click.echo(f"fleet manager: {where} {manager.broker_url}, HTTP {manager.http.url}, data {data_dir}",
                   err=True)
        tune_garbage_collector()  # this process is the manager: its heap from now on is mostly messages
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass


def _mib(megabytes: float) -> int:
    return max(1, round(megabytes * (1 << 20)))


def _exposed(http: str, broker_host: str | None, public_url: str | None) -> bool:
    """Whether a listener of ours takes connections from other machines with no TLS in front of it."""
    loopback = ("127.", "localhost", "::1")
    http_host = http.rpartition(":")[0].strip("[]")
    http_open = not http_host.startswith(loopback) and not (public_url or "").startswith("https://")
    return http_open or (broker_host is not None and not broker_host.startswith(loopback))


@fleet.command("devices")
@click.option("--json", "as_json", is_flag=True)
@client_options
def fleet_devices(client: Any, as_json: bool) -> None:
    """List devices: online, model version, delegate, last telemetry."""
    devices = client.devices()
    if as_json:
        print_json(devices)
        return
    rows = []
    for d in devices:
        last = d.get("last_telemetry") or {}
        fps = sum(float(p.get("fps") or 0) for p in last.get("pipelines") or [])
        age = f"{time.time() - d['last_seen']:.0f}s ago" if d.get("last_seen") else "-"
        rows.append([d["device_id"], "online" if d["online"] else "offline", d.get("model_name") or "-",
                     str(d.get("model_version") or "-"), d.get("delegate") or "-", f"{fps:.1f}", age])
    table(rows, ["DEVICE", "STATUS", "MODEL", "VERSION", "DELEGATE", "FPS", "SEEN"])


@fleet.command("deployments")
@click.option("--json", "as_json", is_flag=True)
@client_options
def fleet_deployments(client: Any, as_json: bool) -> None:
    """List deployments with their per-state device counts."""
    deployments = client.deployments()
    if as_json:
        print_json(deployments)
        return
    rows = [[d["deployment_id"][:12], d.get("kind") or "model", d["model_name"], str(d["version"]), d["status"],
             " ".join(f"{k}={v}" for k, v in sorted(d["counts"].items())), canary_column(d)] for d in deployments]
    table(rows, ["DEPLOYMENT", "KIND", "NAME", "VERSION", "STATUS", "DEVICES", "CANARY"])


@fleet.command("deployment")
@click.argument("deployment_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def fleet_deployment(client: Any, deployment_id: str, as_json: bool) -> None:
    """One deployment: its status, the canary verdict metric by metric, every target's state."""
    found = client.deployment(deployment_id)
    if found is None:
        raise click.ClickException(f"no deployment {deployment_id}")
    if as_json:
        print_json(found)
        return
    click.echo(f"deployment {found['deployment_id']}: {found['model_name']} v{found['version']} — {found['status']}"
               + (f" ({found['detail']})" if found.get("detail") else ""))
    for line in analysis_lines(found.get("analysis")):
        click.echo(f"  {line}")
    table([[t["device_id"], str(t["wave"]), t["state"], t.get("detail") or ""] for t in found.get("devices") or []],
          ["DEVICE", "WAVE", "STATE", "DETAIL"])


def canary_column(deployment: dict) -> str:
    """The canary verdict in a word or two: passed, failed: <metrics>, waiting, off."""
    analysis = deployment.get("analysis")
    if isinstance(analysis, dict) and "passed" in analysis:
        if analysis["passed"]:
            return "passed"
        return "failed: " + ",".join(m["name"] for m in analysis.get("metrics") or [] if not m.get("passed"))
    canary = (deployment.get("options") or {}).get("canary_analysis") or {}
    if not canary.get("enabled") or not float((deployment.get("options") or {}).get("canary_pct") or 0):
        return "off"
    return "waiting" if deployment.get("status") == DeploymentStatus.RUNNING else "-"


@click.command()
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--agent", "agent_wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Instead of a model: edgeinfer's own wheel, to update the agents themselves (docs/fleet.md, "
                   "Agent updates). Its version is the wheel's.")
@click.option("--wheels", "wheels_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="With --agent: a folder of the wheels it needs on the devices (its dependencies, pip), sent with "
                   "it so that a device with no package index can install.")
@click.option("--version", "version", type=click.IntRange(min=0), help="The model's new version number.")
@click.option("--device", "devices", multiple=True, help="A target device id (repeatable).")
@click.option("--group", help="Every device in this group.")
@click.option("--all", "all_devices", is_flag=True, help="Every known device.")
@rollout_options
@click.option("--rollback", is_flag=True, help="Allow going back to an older version.")
@click.option("--pipeline", help="Which of the agent's pipelines to update (default: its first).")
@click.option("--no-wait", is_flag=True, help="Start the rollout and return.")
@click.option("--require-eval", "require_eval", is_flag=True,
              help="First score MODEL on the fleet's labelled samples (of --pipeline) against the model the targets "
                   "run now; refuse it, nothing uploaded, when it is worse (docs/datasets.md).")
@click.option("--eval-dataset", type=click.Path(exists=True, file_okay=False),
              help="With --require-eval (implied): a local labelled folder instead of the fleet's samples.")
@click.option("--baseline", type=click.Path(exists=True, dir_okay=False),
              help="With --require-eval: the current model's file (default: the artifact of the newest deployment "
                   "that succeeded on these targets and --pipeline).")
@click.option("--eval-tolerance", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="With --require-eval: how much lower (absolute) the headline figure may be.")
@dataset_options
@click.option("--json", "as_json", is_flag=True)
@client_options
def deploy(client: Any, model: Path | None, agent_wheel: Path | None, wheels_dir: Path | None, version: int | None,
           devices: tuple[str, ...], group: str | None, all_devices: bool, rollback: bool, pipeline: str | None,
           no_wait: bool, require_eval: bool, eval_dataset: str | None, baseline: str | None, eval_tolerance: float,
           dataset_format: str | None, labels: str | None, ignore_unknown: bool, eval_delegate: str | None,
           as_json: bool, **rollout: Any) -> None:
    """Roll MODEL out as VERSION (or, with --agent, a new edgeinfer): signed, in waves, canary first; exit 0 only
    if every target is active.

    The canary wave is judged on its live telemetry against devices still on the old version (or,
    with no later wave, against its own telemetry before the update): p95 infer latency, fps,
    pipeline error rate and output drift. Beyond a --max-* threshold the rollout is aborted and the
    canary rolled back (docs/fleet.md, Canary analysis).

    With --require-eval, MODEL is first scored against the model the targets run now (or --baseline) on
    the fleet's labelled samples (or --eval-dataset) and refused (exit 1, nothing uploaded) when it is
    worse (docs/datasets.md).

    Needs an operator token (--token-file / $EDGEINFER_FLEET_TOKEN).
    """
    schemas = import_optional("edgeinfer.fleet.api.schemas", "fleet", "edgeinfer deploy")  # pydantic: the fleet extra
    from pydantic import ValidationError

    from ..runtime.model import inspect_model

    if sum(bool(x) for x in (devices, group, all_devices)) != 1:
        raise click.UsageError("give exactly one of --device, --group or --all")
    if (model is None) == (agent_wheel is None):
        raise click.UsageError("give a MODEL file or --agent WHEEL (edgeinfer's own wheel), one of them")
    if agent_wheel is not None:
        if version is not None or require_eval or eval_dataset:
            raise click.UsageError("--agent takes its version from the wheel, and has no --require-eval")
        bundle, artifact = upload_agent(client, agent_wheel, wheels_dir, quiet=as_json)
        kind, name, version = "agent", bundle.name, bundle.number
    else:
        assert model is not None
        if version is None or wheels_dir is not None:
            raise click.UsageError("a model needs --version, and --wheels goes with --agent")
        inspect_model(model)  # refuse a file that is not a model before anything is sent
        if require_eval or eval_dataset:
            targets = None if baseline else target_devices(client, devices, group)  # whose current model
            require_eval_gate(client, model, folder=eval_dataset, baseline=baseline, pipeline=pipeline,
                              devices=targets, tolerance=eval_tolerance,
                              options=eval_options(dataset_format, labels, ignore_unknown, eval_delegate),
                              quiet=as_json)
        artifact = client.upload(model)
        kind, name = "model", model.name
    try:
        spec = schemas.DeploymentSpec(sha256=artifact["sha256"], kind=kind, model_name=name, version=version,
                                      rollback=rollback, pipeline=pipeline, devices=list(devices) or None,
                                      group=group, all=all_devices, **rollout_fields(**rollout))
    except ValidationError as exc:
        raise ValueError(f"the deployment is not valid: {schemas.describe_error(exc)}") from None
    created = client.create_deployment(spec)
    deployment_id = created["deployment_id"]
    if not as_json:
        click.echo(f"deployment {deployment_id}: {name} v{version} → {len(created['devices'])} device(s) "
                   f"in {1 + max(d['wave'] for d in created['devices'])} wave(s)", err=True)
    if no_wait:
        print_json(created) if as_json else click.echo(deployment_id)
        return

    _, all_active = follow(client, deployment_id, timeout_s=longest_wait(spec.model_dump()), as_json=as_json)
    sys.exit(0 if all_active else 1)


def upload_agent(client: Any, wheel: Path, wheels_dir: Path | None, *, quiet: bool) -> tuple[Any, dict]:
    """edgeinfer's WHEEL and the wheels of WHEELS_DIR packed into one agent bundle and uploaded: (bundle, artifact)."""
    from ..updates.bundle import pack

    with tempfile.TemporaryDirectory(prefix="edgeinfer-agent-") as folder:
        path = Path(folder) / "agent-bundle.tar"
        bundle = pack(wheel, path, wheels_dir=wheels_dir)  # ValueError: not an edgeinfer wheel, a bad version
        if not quiet:
            click.echo(f"agent bundle: edgeinfer {bundle.version} (version {bundle.number}), {len(bundle.wheels)} "
                       f"wheel(s), {path.stat().st_size:,} bytes", err=True)
            if bundle.pip_wheel() is None:
                click.echo("  no pip wheel in it: each device installs with the pip of the agent it runs", err=True)
        return bundle, client.upload(path)


@fleet.command("abort")
@click.argument("deployment_id")
@click.option("--json", "as_json", is_flag=True)
@client_options
def fleet_abort(client: Any, deployment_id: str, as_json: bool) -> None:
    """Stop a running rollout: devices not yet notified are left alone (operator)."""
    result = client.abort(deployment_id)
    print_json(result) if as_json else click.echo(f"deployment {deployment_id}: {result['status']}")


@fleet.command("rollback")
@click.argument("device_id")
@click.option("--pipeline", help="Which pipeline (default: the agent's updatable one).")
@verdict_options
@click.option("--json", "as_json", is_flag=True, help="Print the command's record (--no-wait: what was sent).")
@client_options
def fleet_rollback(client: Any, device_id: str, pipeline: str | None, wait: bool, timeout: float,
                   as_json: bool) -> None:
    """Send DEVICE_ID a signed rollback to its previous model, and say what the device did with it: applied, or
    refused and why (operator). Exit 1 when it refused, or no answer came within --timeout."""
    sent = client.rollback(device_id, pipeline)
    follow_command(client, sent, f"rollback sent to {device_id} (command {sent['command_id']})", wait=wait,
                   timeout=timeout, as_json=as_json)


@fleet.command("restart")
@click.argument("device_id")
@click.option("--pipeline", required=True, help="The pipeline to restart.")
@verdict_options
@click.option("--json", "as_json", is_flag=True, help="Print the command's record (--no-wait: what was sent).")
@client_options
def fleet_restart(client: Any, device_id: str, pipeline: str, wait: bool, timeout: float, as_json: bool) -> None:
    """Send DEVICE_ID a signed restart of one pipeline, and say what the device did with it: applied, or refused and
    why (operator). Exit 1 when it refused, or no answer came within --timeout."""
    sent = client.restart(device_id, pipeline)
    follow_command(client, sent, f"restart of {pipeline} sent to {device_id} (command {sent['command_id']})",
                   wait=wait, timeout=timeout, as_json=as_json)
