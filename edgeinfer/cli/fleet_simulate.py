"""``edgeinfer fleet simulate``: simulated agents for load tests and demos."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from .output import handle_errors, print_json


@click.command("simulate")
@click.option("--devices", "count", type=click.IntRange(min=1), required=True, help="How many devices.")
@click.option("--broker", required=True, envvar="EDGEINFER_BROKER", help="The broker, mqtt://HOST:PORT.")
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
@click.option("--behaviour", "behaviours", multiple=True, metavar="MODEL=BEHAVIOUR",
              help="How devices run a deployed model, by its sha256 or file name: slow[:FACTOR] (inference FACTOR "
                   "times slower, default 5), drift (answers in another class order), errors:SHARE (that share of "
                   "telemetry windows failed), healthy; joined by + (repeatable). Other models run healthy.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
@handle_errors
def simulate(count: int, broker: str, fleet_name: str | None, prefix: str, interval: float, duration: float | None,
             fail_rate: float, config_refuse_rate: float, seed: int, groups: tuple[str, ...], credentials: Path | None,
             behaviours: tuple[str, ...], as_json: bool) -> None:
    """Run simulated agents on one thread: real protocol, telemetry, births and Last Wills, deploy answers (models,
    configurations)."""
    from ..tools.simulate import Simulation, SimulationSettings

    accounts = _credentials(credentials) if credentials else None
    models = {}
    for item in behaviours:
        model, sep, behaviour = item.partition("=")
        if not sep or not model.strip():
            raise click.BadParameter(f"{item!r} is not MODEL=BEHAVIOUR (e.g. model_v2.tflite=slow:5)",
                                     param_hint="--behaviour")
        models[model.strip()] = behaviour.strip()
    try:
        settings = SimulationSettings(broker=broker, devices=count, fleet=fleet_name, prefix=prefix,
                                      interval_s=interval, duration_s=duration, fail_rate=fail_rate,
                                      config_refuse_rate=config_refuse_rate, seed=seed,
                                      groups=groups, credentials=accounts, behaviours=models)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    simulation = Simulation(settings)
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
        print_json(report.to_dict())
    else:
        click.echo(f"{report.devices} devices: published {report.published}, acked {report.acked}, refused "
                   f"{report.refused}, dropped {report.dropped}, connects {report.connects} (peak "
                   f"{report.peak_connects_per_s}/s), updates active {report.updates_active}, failed "
                   f"{report.updates_failed}")
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
