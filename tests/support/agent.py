"""Helpers for the agent's tests: agent configs, agent subprocesses, fake sysfs trees.

The broker side (a real Mosquitto, a collecting subscriber, TLS files) is in support/broker.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .assets import REPO


def write_config(path: Path, **values: Any) -> Path:
    """Write an agent.yaml with ``values`` (None values are left out)."""
    data = {k: v for k, v in values.items() if v is not None}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def agent_config(tmp_path: Path, broker_url: str, *, telemetry_interval_s: float = 0.1, **values: Any) -> Path:
    """``tmp_path/agent.yaml`` for device cam-01 of fleet ``test`` on ``broker_url``, quick to reconnect,
    with ``values`` on top."""
    base = {"device_id": "cam-01", "fleet": "test", "broker": broker_url, "data_dir": str(tmp_path / "data"),
            "telemetry_interval_s": telemetry_interval_s, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0}
    return write_config(tmp_path / "agent.yaml", **{**base, **values})


class AgentProcess:
    """``edgeinfer agent --config FILE`` as a real subprocess, with its stderr kept in a file."""

    def __init__(self, config: Path, log_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log_path = log_path
        self.args = args
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> AgentProcess:
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   PYTHONUNBUFFERED="1", **self.extra_env)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer", "-v", "agent", "--config", str(self.config), *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as in a power cut of the process."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM and wait; the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if not self._log.closed:
                self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if not self.alive():
                return text in self.output()
            time.sleep(0.05)
        return False

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.kill()


def fake_sysfs(root: Path, zones: dict[str, float], throttled: int | None = None) -> Path:
    """A tiny /sys tree like a Raspberry Pi's: thermal zones (type + temp in m°C) and get_throttled."""
    for index, (name, celsius) in enumerate(zones.items()):
        zone = root / "sys/class/thermal" / f"thermal_zone{index}"
        zone.mkdir(parents=True, exist_ok=True)
        (zone / "type").write_text(f"{name}\n")
        (zone / "temp").write_text(f"{round(celsius * 1000)}\n")
    if throttled is not None:
        firmware = root / "sys/devices/platform/soc/soc:firmware"
        firmware.mkdir(parents=True, exist_ok=True)
        (firmware / "get_throttled").write_text(f"{throttled:x}\n")
    return root


# ------------------------------------------------------------------------------ signed commands

_FLEET_KEY: list = []


def fleet_key():
    """The test session's fleet signing key (an Ed25519 SigningKey; agents pin its public half)."""
    from edgeinfer.updates.signing import SigningKey

    if not _FLEET_KEY:
        _FLEET_KEY.append(SigningKey.generate())
    return _FLEET_KEY[0]


def signed_command(command_id: str, cmd: str, args: dict | None = None, *, device: str = "cam-01",
                   key: Any = None, expires: float | None = None, ttl_s: float = 3600.0) -> bytes:
    """A ``cmd`` payload signed as the fleet manager signs it (by ``key``, default :func:`fleet_key`)."""
    from edgeinfer.link.protocol import encode, make_command
    from edgeinfer.updates.signing import sign_command

    message = sign_command(key or fleet_key(), make_command(command_id, cmd, args), device_id=device,
                           expires=time.time() + ttl_s if expires is None else expires)
    return encode(message)


def seed_update_history(data_dir: Path, configured: Path, updated: Path) -> None:
    """Model slots as after one committed update: ``updated`` (v2) active, ``configured`` (v1) the rollback target."""
    import shutil

    from edgeinfer.runtime.model import inspect_model
    from edgeinfer.updates.slots import InstalledModel, ModelSlots

    slots = ModelSlots(data_dir)
    slots.reset_to(configured, name=configured.name, version=1, sha256=inspect_model(configured).sha256)
    target = slots.slot_dir("b") / updated.name
    shutil.copyfile(updated, target)
    slots.begin_trial(InstalledModel("b", str(target), updated.name, 2, inspect_model(updated).sha256, "dep-1"))
    slots.commit()


def active_model(data_dir: Path) -> dict | None:
    """The committed model, read from the agent's slot state the way an investigator would (no locking)."""
    import json

    return json.loads((data_dir / "models" / "slots.json").read_text())["active"]
