"""``edgeinfer agent``: the on-device daemon."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ..updates.launcher import CONFIG_EXIT_STATUS
from .output import handle_errors, print_json

if TYPE_CHECKING:
    from ..errors import ConfigError

#: exit status for a configuration error (sysexits EX_CONFIG). The systemd unit lists it in
#: RestartPreventExitStatus= so a broken config does not become a crash loop; the agent's launcher gives up a
#: new version that exits with it at once (edgeinfer/updates/launcher.py defines it for both).
EXIT_CONFIG = CONFIG_EXIT_STATUS


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="The agent's YAML configuration (see docs/agent.md).")
@click.option("--check", is_flag=True,
              help="Validate the configuration (TLS files, each pipeline's model read as its run reads it: task, "
                   "output layout, labels, rules; each source opened), print it with the fleet revision it runs "
                   "over agent.yaml, and exit. Exit 78 for a configuration error.")
@handle_errors
def agent(config_path: str, check: bool) -> None:
    """Run the device agent: pipelines + MQTT telemetry, state, events and commands, until SIGTERM."""
    import signal

    from ..util.defer import defer_imports, prefer_builtin_hashes

    defer_imports()  # before paho and the agent's modules are imported (edgeinfer/util/defer.py)
    prefer_builtin_hashes()
    from ..agent.config import load_config, resolve_profile
    from ..agent.daemon import Agent
    from ..errors import ConfigError

    try:
        config = load_config(config_path)
        if config.claim and not check:
            config = _provisioned(config_path, config)
        if check:
            resolve_profile(config, detect_now=False)  # a named profile must exist
            from ..agent.config_check import check_configuration
            from ..agent.configuration import preview

            config, precedence = preview(config)  # the fleet's applied revision over agent.yaml (read only)
            found = check_configuration(config)  # each model read as the run reads it, each source opened
    except ConfigError as exc:
        _config_error(exc)
    if check:
        for problem in found["sources"]:  # a camera the running agent holds, one not plugged in: not the config's
            click.echo(f"edgeinfer: warning: {problem}", err=True)
        print_json({"device_id": config.device_id, "fleet": config.fleet,
                    "broker": str(config.link_settings().broker),  # without credentials
                    "data_dir": str(config.data_dir), "telemetry_interval_s": config.telemetry_interval_s,
                    "spool_max_bytes": config.spool_max_bytes, "topics": config.topics.root,
                    "profile": config.profile, "configuration": precedence,
                    "pipelines": [p.name for p in config.pipelines], "models": found["models"],
                    "source_warnings": found["sources"]})
        return
    from ..util.native import cap_malloc_arenas

    cap_malloc_arenas()  # before the agent's threads allocate (docs/agent.md, "Footprint")
    daemon = Agent(config)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.stop())
    try:
        daemon.run()
    except ConfigError as exc:  # found at start (data_dir not writable, ...)
        _config_error(exc)
    if daemon.config_errors.error is not None:  # a pipeline's first start failed as configured (reported, stopped)
        _config_error(daemon.config_errors.error)
    if daemon.exit_status:  # an agent update: the launcher starts the slot its state names now
        sys.exit(daemon.exit_status)


def _provisioned(config_path: str, config: Any) -> Any:
    """A claimed device without its identity yet: trade the claim for one (waiting while it is pending; SIGTERM
    stops the wait), then the configuration with it (agent/provisioning.py)."""
    import signal
    import threading

    from ..agent.config import load_config
    from ..agent.identity import hardware, identity_dir, read_identity
    from ..agent.provisioning import provision
    from ..errors import ConfigError

    folder = identity_dir(config.data_dir)
    if read_identity(folder) is not None:
        return config
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        names = hardware(config.sensors.root, serial=config.serial)
    except ValueError as exc:
        raise ConfigError(f"{config.path}: serial: {exc}") from None
    click.echo(f"edgeinfer: provisioning {names['serial']} with {config.manager_url}", err=True)
    if provision(config.manager_url, config.claim, folder, names, cafile=config.mqtt.ca, stop=stop) is None:
        sys.exit(0)  # stopped while waiting: the key and request stay, the next start resumes
    return load_config(config_path)


def _config_error(error: ConfigError) -> NoReturn:
    click.echo(f"edgeinfer: error: {' '.join(str(error).split())}", err=True)
    sys.exit(EXIT_CONFIG)
