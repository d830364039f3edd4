"""``edgeinfer agent``: the on-device daemon."""

from __future__ import annotations

import sys

import click

from ..updates.launcher import CONFIG_EXIT_STATUS
from .output import handle_errors, print_json

#: exit status for a configuration error (sysexits EX_CONFIG). The systemd unit lists it in
#: RestartPreventExitStatus= so a broken config does not become a crash loop; the agent's launcher gives up a
#: new version that exits with it at once (edgeinfer/updates/launcher.py defines it for both).
EXIT_CONFIG = CONFIG_EXIT_STATUS


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="The agent's YAML configuration (see docs/agent.md).")
@click.option("--check", is_flag=True, help="Validate the configuration (and TLS files), print it, and exit.")
@handle_errors
def agent(config_path: str, check: bool) -> None:
    """Run the device agent: pipelines + MQTT telemetry, state, events and commands, until SIGTERM."""
    import signal

    from .._defer import defer_imports, prefer_builtin_hashes

    defer_imports()  # before paho and the agent's modules are imported (edgeinfer/_defer.py)
    prefer_builtin_hashes()
    from ..agent.config import load_config, resolve_profile
    from ..agent.daemon import Agent
    from ..errors import ConfigError

    try:
        config = load_config(config_path)
        if check:
            resolve_profile(config, detect_now=False)  # a named profile must exist
    except ConfigError as exc:
        click.echo(f"edgeinfer: error: {' '.join(str(exc).split())}", err=True)
        sys.exit(EXIT_CONFIG)
    if check:
        print_json({"device_id": config.device_id, "fleet": config.fleet,
                    "broker": str(config.link_settings().broker),  # without credentials
                    "data_dir": str(config.data_dir), "telemetry_interval_s": config.telemetry_interval_s,
                    "spool_max_bytes": config.spool_max_bytes, "topics": config.topics.root,
                    "profile": config.profile,
                    "pipelines": [p.name for p in config.pipelines]})
        return
    from .._native import cap_malloc_arenas

    cap_malloc_arenas()  # before the agent's threads allocate (docs/agent.md, "Footprint")
    daemon = Agent(config)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    try:
        daemon.run()
    except ConfigError as exc:  # found at start (data_dir not writable, ...)
        click.echo(f"edgeinfer: error: {' '.join(str(exc).split())}", err=True)
        sys.exit(EXIT_CONFIG)
    if daemon.exit_status:  # an agent update: the launcher starts the slot its state names now
        sys.exit(daemon.exit_status)
