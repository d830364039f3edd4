"""``edgeinfer fleet simulate``: simulated agents for load tests and demos; with ``--claim``, provisioned through the
real flow (claim, key pair, CSR, ``POST /api/v1/provision``, certificate), each connected with its certificate as soon
as it has one."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from .output import handle_errors, print_json


@click.command("simulate")
@click.option("--devices", "count", type=click.IntRange(min=1), required=True, help="How many devices.")
@click.option("--broker", envvar="EDGEINFER_BROKER",
              help="The broker, mqtt://HOST:PORT (required without --claim; with it, the manager's answer says it).")
@click.option("--fleet", "fleet_name",
              help="Their fleet (the topic level). Default: the fleet each device's --credentials names, else "
                   "default (as `fleet enroll`). A --fleet that contradicts the credentials is an error.")
@click.option("--prefix", default="sim", show_default=True, help="Device ids are PREFIX-00000, PREFIX-00001, ...")
@click.option("--interval", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Seconds between one device's telemetry messages.")
@click.option("--duration", type=click.FloatRange(min=0), help="Seconds to run (default: until Ctrl-C / SIGTERM).")
@click.option("--fail-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of devices whose updates fail validation (the same devices for the same --seed).")
@click.option("--config-refuse-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of devices that refuse every configuration document they are sent (the same devices for "
                   "the same --seed).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--group", "groups", multiple=True, help="A group every device reports (repeatable).")
@click.option("--credentials", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="For a broker with accounts (the managed Mosquitto): the JSON list `edgeinfer fleet enroll "
                   "PREFIX-00000 PREFIX-00001 ... --json` printed for these devices.")
@click.option("--claim", help="Provision the devices first with this claim token (`fleet claim create`), as agents "
                               "do on first boot: each makes its key, sends its CSR to --manager-url and connects "
                               "with the certificate it gets (the manager's certificate listener). Device ids are "
                               "the manager's.")
@click.option("--manager-url", envvar="EDGEINFER_FLEET_URL", help="With --claim: the manager, https://HOST:PORT.")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False),
              help="With --claim: the fleet CA that verifies the manager (the claim's fleet-ca.crt).")
@click.option("--serial-prefix", default="sim-", show_default=True,
              help="With --claim: the devices' serials are PREFIX00000, PREFIX00001, ...")
@click.option("--identity-dir", type=click.Path(file_okay=False, path_type=Path),
              help="With --claim: keep each device's key and certificate in DIR/SERIAL/identity/ (a second run "
                   "resumes with them). Default: a temporary folder, removed at the end.")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=32, show_default=True,
              help="With --claim: provisioning requests in flight at once.")
@click.option("--provision-timeout", type=click.FloatRange(min=0.1),
              help="With --claim: seconds to wait for every device's certificate (default: as long as it takes; a "
                   "pending device waits for approval as the agent does).")
@click.option("--behaviour", "behaviours", multiple=True, metavar="MODEL=BEHAVIOUR",
              help="How devices run a deployed model, by its sha256 or file name: slow[:FACTOR] (inference FACTOR "
                   "times slower, default 5), drift (answers in another class order), errors:SHARE (that share of "
                   "telemetry windows failed), healthy; joined by + (repeatable). Other models run healthy.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@handle_errors
def simulate(count: int, broker: str, fleet_name: str | None, prefix: str, interval: float, duration: float | None,
             fail_rate: float, config_refuse_rate: float, seed: int, groups: tuple[str, ...], credentials: Path | None,
             claim: str | None, manager_url: str | None, ca: str | None, serial_prefix: str, identity_dir: Path | None,
             concurrency: int, provision_timeout: float | None, behaviours: tuple[str, ...], as_json: bool) -> None:
    """Run simulated agents on one thread: real protocol, telemetry, births and Last Wills, deploy answers (models,
    configurations). With --claim, each is provisioned first, as an agent's first boot does."""
    if claim is None:
        if broker is None:
            raise click.UsageError("--broker is required (or --claim and --manager-url: provisioned devices)")
        settings = _settings(count, broker, fleet_name, prefix, interval, duration, fail_rate, config_refuse_rate,
                             seed, groups, _credentials(credentials) if credentials else None, behaviours, None)
        from ..tools.simulate import Simulation

        _simulate(Simulation(settings), as_json, None)
        return
    if manager_url is None:
        raise click.UsageError("--claim needs --manager-url (where the devices ask: the claim's manager_url)")
    if credentials is not None:
        raise click.UsageError("--claim or --credentials, not both (certificates or password accounts)")
    # checked before any device is provisioned; the broker is the one the manager's answers name
    settings = _settings(count, "mqtts://broker.invalid:8883", fleet_name, prefix, interval, duration, fail_rate,
                         config_refuse_rate, seed, groups, None, behaviours, {})
    joining = _Joining(settings, since=time.monotonic())
    with tempfile.TemporaryDirectory(prefix="edgeinfer-simulate-") as temporary:
        try:
            provisioned = _provision(count, claim, manager_url, ca, serial_prefix, identity_dir or Path(temporary),
                                     concurrency, provision_timeout, as_json, joining)
        except BaseException:
            joining.stop()
            raise
        if not provisioned.identities:
            joining.stop()
            if as_json:
                print_json({"provisioning": provisioned.to_dict()})
            raise click.ClickException(f"no device was provisioned ({_refusals(provisioned)})")
        joining.simulation.done_joining()
        _simulate(joining.simulation, as_json, provisioned)


class _Joining:
    """The simulation that provisioned devices join, each as soon as it has its certificate (on the provisioning
    thread that got it): made and started with the first, whose answer names the broker; its clock runs from the
    start of the provisioning (``since``), so that its ``all_online_s`` is the whole fleet's time to be connected."""

    def __init__(self, settings: Any, since: float) -> None:
        self.settings = settings
        self.since = since
        self.simulation: Any = None
        self.halted = False
        self._lock = threading.Lock()

    def join(self, identity: dict[str, Any]) -> None:
        from ..tools.simulate import Simulation

        with self._lock:
            if self.simulation is None:
                self.simulation = Simulation(dataclasses.replace(self.settings, broker=identity["broker"]))
                self.simulation.start(since=self.since)
                if self.halted:
                    self.simulation._stop.set()
        self.simulation.join(identity)

    def halt(self) -> None:
        """SIGTERM: the simulation stops (and connects no more devices) as soon as the provisioning has (no lock:
        a signal handler may interrupt join())."""
        self.halted = True
        if self.simulation is not None:
            self.simulation._stop.set()

    def stop(self) -> None:
        with self._lock:
            if self.simulation is not None:
                self.simulation.stop(drain_s=0.0)


def _provision(count: int, claim: str, manager_url: str, ca: str | None, serial_prefix: str, folder: Path,
               concurrency: int, timeout_s: float | None, as_json: bool, joining: _Joining) -> Any:
    from ..tools.simulate.provision import ProvisionSettings, provision_fleet

    try:
        settings = ProvisionSettings(manager_url=manager_url, claim=claim, devices=count, folder=folder, ca=ca,
                                     serial_prefix=serial_prefix, concurrency=concurrency, timeout_s=timeout_s)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    stop = threading.Event()

    def terminate(*_: Any) -> None:
        stop.set()
        joining.halt()

    signal.signal(signal.SIGTERM, terminate)

    def progress(done: int, devices: int) -> None:
        click.echo(f"  provisioning: {done}/{devices} answered", err=True)

    try:
        report = provision_fleet(settings, stop=stop, on_progress=progress, on_provisioned=joining.join)
    except KeyboardInterrupt:
        stop.set()
        raise
    if not as_json:
        click.echo(f"provisioned {report.provisioned} of {report.devices} devices in {report.elapsed_s:.1f} s "
                   f"({1000 * report.elapsed_s / max(1, report.provisioned):.1f} ms a device; latency p50 "
                   f"{report.latency_ms.get('p50', 0):.0f} ms); {_refusals(report)}", err=True)
    return report


def _refusals(report: Any) -> str:
    if not report.refused and not report.failed:
        return "none refused"
    said = [f"{n} refused: {reason} (e.g. {report.refusal_examples[reason]})" for reason, n in report.refused.items()]
    return "; ".join(said + ([f"{report.failed} unanswered or pending"] if report.failed else []))


def _settings(count: int, broker: str, fleet_name: str | None, prefix: str, interval: float, duration: float | None,
              fail_rate: float, config_refuse_rate: float, seed: int, groups: tuple[str, ...],
              accounts: dict[str, tuple[str, ...]] | None, behaviours: tuple[str, ...],
              identities: dict[str, dict[str, Any]] | None) -> Any:
    """The simulation's settings from the options; with ``identities`` (provisioned devices), they join it."""
    from ..tools.simulate import SimulationSettings

    models = {}
    for item in behaviours:
        model, sep, behaviour = item.partition("=")
        if not sep or not model.strip():
            raise click.BadParameter(f"{item!r} is not MODEL=BEHAVIOUR (e.g. model_v2.tflite=slow:5)",
                                     param_hint="--behaviour")
        models[model.strip()] = behaviour.strip()
    try:
        return SimulationSettings(broker=broker, devices=count, fleet=fleet_name, prefix=prefix,
                                  interval_s=interval, duration_s=duration, fail_rate=fail_rate,
                                  config_refuse_rate=config_refuse_rate, seed=seed, groups=groups,
                                  credentials=accounts, behaviours=models, identities=identities,
                                  joining=identities is not None)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _simulate(simulation: Any, as_json: bool, provisioned: Any) -> None:
    """Run ``simulation`` (started already when provisioned devices joined it) and say how it went."""
    signal.signal(signal.SIGTERM, lambda *_: simulation._stop.set())
    last = {"published": 0, "elapsed": 0.0}

    def progress(report) -> None:
        rate = (report.published - last["published"]) / max(1e-9, report.elapsed_s - last["elapsed"])
        last.update(published=report.published, elapsed=report.elapsed_s)
        click.echo(f"  {report.elapsed_s:6.1f} s  online {report.online}/{report.devices}  published "
                   f"{report.published}  acked {report.acked}  refused {report.refused}  {rate:.0f} msg/s",
                   err=True)

    try:
        report = simulation.run(on_progress=progress)
    except KeyboardInterrupt:
        simulation.stop()
        report = simulation.report()
    if as_json:
        print_json({**report.to_dict(), **({"provisioning": provisioned.to_dict()} if provisioned else {})})
    else:
        click.echo(f"{report.devices} devices: published {report.published}, acked {report.acked}, refused "
                   f"{report.refused}, dropped {report.dropped}, connects {report.connects} (peak "
                   f"{report.peak_connects_per_s}/s), updates active {report.updates_active}, failed "
                   f"{report.updates_failed}")
    if provisioned is not None and (provisioned.refused or provisioned.failed):
        click.echo(f"edgeinfer: error: {provisioned.devices - provisioned.provisioned} of {provisioned.devices} "
                   f"devices were not provisioned: {_refusals(provisioned)}", err=True)
        sys.exit(1)
    if report.refused:  # the broker stored none of these: a load test that did not happen, whatever else it says
        fleets = sorted({d.fleet for d in simulation.devices})
        click.echo(f"edgeinfer: error: the broker refused {report.refused} of {report.published} telemetry messages "
                   f"(first: {simulation.first_refusal}); the devices published in fleet {', '.join(fleets)} — are "
                   "the credentials those devices' own, enrolled in that fleet?", err=True)
        sys.exit(1)


def _credentials(path: Path) -> dict[str, tuple[str, ...]]:
    """device id -> (user name, password, fleet) from `fleet enroll --json` output (one object or a list); an
    entry without a fleet gives (user name, password)."""
    try:
        entries = json.loads(path.read_text())
        entries = [entries] if isinstance(entries, dict) else entries
        return {e["device_id"]: (e["username"], e["password"], *([e["fleet"]] if e.get("fleet") else []))
                for e in entries}
    except (ValueError, TypeError, KeyError) as exc:
        raise click.BadParameter(f"{path} is not the JSON of `fleet enroll --json` ({exc})") from None
