"""The agent updates itself, end to end: real wheels of this tree, real venvs, a real agent process started by the
launcher from slot a, enrolled with a real manager and Mosquitto, and ``edgeinfer deploy --agent`` from the CLI.

A good wheel (its version bumped) is installed into slot b, the agent restarts from it and reports the new version;
a wheel whose agent cannot start is rolled back to the old slot by the launcher and the device keeps reporting;
a wheel that cannot even be imported, a bundle that is not the one signed and a manifest signed by another key
are refused, nothing switched. The venvs are cheap (support/agent_update.py says how; docs/fleet.md what a device
does instead).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.agent import write_config
from support.agent_update import (
    LauncherProcess,
    build_wheel,
    bumped_version,
    copy_launcher,
    make_slot,
    source_copy,
)
from support.assets import IMAGES, MODELS
from support.fleet import admin_token_file, running_fleet
from support.processes import edgeinfer_cmd
from support.processes import wait_until as wait

from edgeinfer._version import __version__
from edgeinfer.capture import make_test_clip
from edgeinfer.fleet.auth import issue_grant
from edgeinfer.link.vocabulary import Command
from edgeinfer.updates import launcher as slots_state
from edgeinfer.updates.bundle import pack, version_number
from edgeinfer.updates.signing import SigningKey, new_manifest

MODEL = MODELS / "mobilenet_v1_0.25_128_quant.tflite"
DEVICE = "cam-01"
BROKEN_START = 'raise RuntimeError("this agent is broken on purpose")\n'
BROKEN_IMPORT = 'raise ImportError("this edgeinfer cannot be imported")\n'

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """This tree as real wheels: version + 1, + 2 (its agent cannot start), + 3 (edgeinfer cannot be imported)."""
    folder = tmp_path_factory.mktemp("wheels")
    source, dist = source_copy(folder), folder / "dist"
    return {"good": build_wheel(source, dist, bumped_version(1)),
            "broken_start": build_wheel(source, dist, bumped_version(2),
                                        {"edgeinfer/agent/daemon.py": BROKEN_START}),
            "broken_import": build_wheel(source, dist, bumped_version(3), {"edgeinfer/__init__.py": BROKEN_IMPORT})}


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_test_clip(tmp_path_factory.mktemp("clip") / "clip.avi", [IMAGES / "parrot.jpg", IMAGES / "cat.bmp"],
                          size=(160, 120), fps=10, frames_per_image=5)


class Device:
    """A device as provisioned: slot a (this checkout), the launcher, agent.yaml; the fleet it reports to."""

    def __init__(self, tmp_path: Path, fleet, broker, clip: Path) -> None:
        self.fleet = fleet
        self.root = tmp_path / "agent-slots"
        config = write_config(tmp_path / "agent.yaml", **{
            "device_id": DEVICE, "fleet": "lab", "broker": broker.url, "data_dir": str(tmp_path / "data"),
            "telemetry_interval_s": 0.5, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0, "profile": "none",
            "update_public_key": fleet.key.public_key_b64(),
            "pipelines": [{"name": "main", "model": str(MODEL), "source": str(clip), "task": "classify",
                           "loop": True, "max_fps": 5, "threads": 1, "version": "1"}]})
        self.launcher = LauncherProcess(copy_launcher(tmp_path / "opt"), self.root, make_slot(tmp_path / "venv"),
                                        ["-v", "agent", "--config", str(config)], tmp_path / "launcher.log",
                                        trial_s=120)

    def state(self) -> dict:
        return (self.fleet.db.get_device(DEVICE) or {}).get("state") or {}

    def online(self) -> bool:
        device = self.fleet.db.get_device(DEVICE)
        return bool(device and device["online"] and device["last_telemetry"])

    def telemetry_after(self, since: float) -> int:
        return sum(1 for row in self.fleet.db.device_telemetry(DEVICE, limit=1000) if row["ts"] > since)

    def events(self) -> list[dict]:
        return self.fleet.db.device_events(DEVICE, limit=1000)

    def slots(self) -> dict:
        return slots_state.read_state(self.root)


@pytest.fixture
def device(tmp_path, broker, clip):
    with running_fleet(tmp_path / "fleet", broker.url) as fleet:
        device = Device(tmp_path, fleet, broker, clip)
        with device.launcher:
            assert wait(device.online, 90), device.launcher.output()[-3000:]
            assert device.state()["agent"] == {"slot": "a", "version": __version__, "sha256": None, "trial": False}
            yield device


def deploy_agent(device: Device, wheel: Path) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run(edgeinfer_cmd("deploy", "--agent", str(wheel), "--device", DEVICE, "--no-canary-analysis",
                                          "--json", "--fleet-url", device.fleet.http.url,
                                          "--token-file", admin_token_file(device.fleet)),
                            capture_output=True, text=True, timeout=400)
    return result, json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}


def test_an_agent_update_restarts_from_the_new_slot_and_a_broken_one_is_rolled_back(device, wheels):
    boot_a = device.state()["boot_id"]
    result, final = deploy_agent(device, wheels["good"])
    assert result.returncode == 0, result.stderr + device.launcher.output()[-4000:]
    new_version = bumped_version(1)
    assert final["status"] == "succeeded" and final["counts"] == {"active": 1}
    assert (final["kind"], final["model_name"], final["version"]) == ("agent", f"edgeinfer-{new_version}",
                                                                      version_number(new_version))
    # the agent runs from slot b now, and says so
    slots = device.slots()
    assert slots["active"] == "b" and slots["trial"] is None
    assert slots["slots"]["b"]["path"] == str(device.root / "slots" / "b")
    assert slots["slots"]["b"]["version"] == new_version and slots["slots"]["b"]["sha256"] == final["sha256"]
    assert wait(lambda: device.state().get("agent", {}).get("trial") is False, 20)
    state = device.state()
    assert state["boot_id"] != boot_a and state["versions"]["edgeinfer"] == new_version
    assert state["agent"] == {"slot": "b", "version": new_version, "sha256": final["sha256"], "trial": False}
    steps = [(e["data"]["state"], e["boot_id"]) for e in device.events() if e["event"] == "update"]
    assert steps == [("downloading", boot_a), ("validating", boot_a), ("active", state["boot_id"])], steps
    active = next(e for e in reversed(device.events()) if e["event"] == "update")
    assert active["data"]["kind"] == "agent" and active["data"]["switch_s"] > 0
    assert active["cmd_id"] == f"deploy-{final['deployment_id']}"

    # a wheel whose agent cannot start: installed into slot a, tried, and the launcher goes back to slot b
    boot_b = state["boot_id"]
    result, final = deploy_agent(device, wheels["broken_start"])
    assert result.returncode == 1, result.stderr
    (target,) = final["devices"]
    assert target["state"] == "rolled_back" and final["status"] != "succeeded"
    assert "broken on purpose" in target["detail"] and "(2 start(s))" in target["detail"], target
    slots = device.slots()
    assert slots["active"] == "b" and slots["trial"] is None and slots["outcome"]["result"] == "failed"
    assert slots["slots"]["a"]["path"] == str(device.root / "slots" / "a")  # the provisioned venv is left alone
    assert (Path(device.launcher.command[device.launcher.command.index("--initial-slot") + 1]) / "bin").exists()
    # the device kept reporting: back on slot b, online, its telemetry goes on
    finished = time.time()
    assert wait(lambda: device.online() and device.telemetry_after(finished) >= 3, 60)
    state = device.state()
    assert state["boot_id"] not in (boot_a, boot_b) and state["versions"]["edgeinfer"] == new_version
    assert state["agent"]["slot"] == "b"
    assert device.launcher.alive()


def test_a_bundle_that_cannot_import_or_is_not_the_one_signed_is_refused_and_nothing_switches(device, wheels,
                                                                                            tmp_path):
    boot = device.state()["boot_id"]
    fleet = device.fleet
    # a manifest signed by another key
    bundle = pack(wheels["good"], tmp_path / "good.tar")
    digest, size = fleet.store.put(tmp_path / "good.tar")

    def command(sha256: str = digest, key: SigningKey | None = None) -> dict:
        manifest = new_manifest(model_name=bundle.name, version=bundle.number, sha256=sha256, size=size,
                                url=f"{fleet.public_url}/artifacts/{digest}", target=f"device:{DEVICE}", kind="agent")
        return {"manifest": manifest.to_dict(), "signature": (key or fleet.key).sign(manifest),
                "grant": issue_grant(fleet.key, digest, DEVICE, time.time() + 600)}

    def outcome(command_id: str) -> dict:
        def find():
            return next((e for e in device.events() if e.get("cmd_id") == command_id and (
                e["event"] == "cmd_rejected" or e["data"].get("state") in ("failed", "rolled_back", "active"))), None)
        assert wait(lambda: find() is not None, 120), device.launcher.output()[-3000:]
        return find()

    forged = fleet.commands.send(DEVICE, Command.DEPLOY, command(key=SigningKey.generate()))
    assert outcome(forged)["data"]["reason"] == "bad_signature"
    # the bytes the server holds are not the ones the manifest names
    tampered = fleet.commands.send(DEVICE, Command.DEPLOY, command(sha256="ab" * 32))
    assert (outcome(tampered)["data"]["state"], outcome(tampered)["data"]["reason"]) == ("failed", "sha256_mismatch")
    # a wheel whose edgeinfer cannot be imported: installed into slot b, refused before any switch
    result, final = deploy_agent(device, wheels["broken_import"])
    assert result.returncode == 1, result.stderr
    (target,) = final["devices"]
    assert target["state"] == "failed" and target["detail"].startswith("validation_failed — "), target
    failed = next(e for e in device.events() if e["event"] == "update" and e["data"]["state"] == "failed"
                  and e["data"]["deployment_id"] == final["deployment_id"])
    assert "cannot be imported" in failed["data"]["detail"], failed
    assert target["detail"] == f"validation_failed — {failed['data']['detail']}"  # the device's words, kept
    # nothing switched: the same agent process (boot), on slot a, reporting
    slots = device.slots()
    assert slots["active"] == "a" and slots["trial"] is None and slots["outcome"] is None
    assert device.state()["boot_id"] == boot and device.state()["agent"]["slot"] == "a"
    since = time.time()
    assert wait(lambda: device.telemetry_after(since) >= 2, 30)
