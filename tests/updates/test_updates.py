"""Update steps on the device with real models, real subprocess validation and real files."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.assets import MODELS
from support.fleet import DEVICE_LOGIN, artifact_server
from support.processes import env_with_repo, wait_until

from edgeinfer.errors import UpdateRejected
from edgeinfer.fleet.artifacts import ArtifactStore
from edgeinfer.updates.health import HealthGate, result_is_finite
from edgeinfer.updates.signing import SigningKey, VerifyKey, new_manifest
from edgeinfer.updates.slots import ModelSlots
from edgeinfer.updates.updater import Updater
from edgeinfer.updates.validate import validate_in_subprocess

V1 = MODELS / "mobilenet_v2_1.0_224_quant.tflite"
V2 = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fleet(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    key = SigningKey.generate()
    with artifact_server(store, tmp_path) as server:
        yield store, key, server


def signed(store, key, server, model, version, **extra):
    digest, size = store.put(model)
    manifest = new_manifest(model_name=model.name, version=version, sha256=digest, size=size,
                            url=server.artifact_url(digest), target="all", **extra)
    return manifest.to_dict(), key.sign(manifest)


def make_updater(tmp_path, key) -> Updater:
    slots = ModelSlots(tmp_path / "data")
    slots.install_initial(V1, name=V1.name, version=1, sha256=sha(V1))
    return Updater(slots, VerifyKey(key.public_key_b64()), validate_timeout_s=60, credentials=DEVICE_LOGIN)


def test_update_goes_through_trial_and_commit(tmp_path, fleet):
    store, key, server = fleet
    updater = make_updater(tmp_path, key)
    data, signature = signed(store, key, server, V2, 2)
    manifest = updater.check(data, signature)
    staged = updater.stage(manifest)
    assert staged.slot == "b" and Path(staged.path).read_bytes() == V2.read_bytes()
    updater.slots.begin_trial(staged)
    assert updater.slots.active.version == 1  # not live until the gate passes
    updater.slots.commit()
    updater.slots.remember(manifest.deployment_id)
    reopened = ModelSlots(tmp_path / "data")
    assert (reopened.active.version, reopened.previous.version) == (2, 1)
    with pytest.raises(UpdateRejected) as info:
        updater.check(data, signature)
    assert info.value.reason == "replay"


def test_crash_during_trial_leaves_the_old_model(tmp_path, fleet):
    store, key, server = fleet
    updater = make_updater(tmp_path, key)
    data, signature = signed(store, key, server, V2, 2)
    updater.slots.begin_trial(updater.stage(updater.check(data, signature)))
    # the agent dies here; the next start must run v1
    reopened = ModelSlots(tmp_path / "data")
    assert reopened.active.version == 1 and reopened.trial is None


@pytest.mark.parametrize("case", ["downgrade", "same version", "wrong key", "tampered"])
def test_rejections_leave_the_running_model(tmp_path, fleet, case):
    store, key, server = fleet
    updater = make_updater(tmp_path, key)
    version = 1 if case == "same version" else (0 if case == "downgrade" else 2)
    data, signature = signed(store, key, server, V2, version)
    if case == "wrong key":
        signature = SigningKey.generate().sign(new_manifest(**{k: data[k] for k in (
            "model_name", "version", "sha256", "size", "url", "target")}))
    if case == "tampered":
        data = data | {"url": data["url"].replace(data["sha256"], sha(V1))}
    with pytest.raises(UpdateRejected) as info:
        updater.check(data, signature)
    expected = {"downgrade": "downgrade", "same version": "downgrade", "wrong key": "bad_signature",
                "tampered": "bad_signature"}[case]
    assert info.value.reason == expected
    assert ModelSlots(tmp_path / "data").active.version == 1


def test_rollback_command_may_go_back(tmp_path, fleet):
    store, key, server = fleet
    updater = make_updater(tmp_path, key)
    data, signature = signed(store, key, server, V1, 1, rollback=True)
    assert updater.check(data, signature).rollback


def test_subprocess_validation_of_good_and_broken_models(tmp_path):
    report = validate_in_subprocess(V2)
    assert report["ok"] and report["outputs"] == [[1, 965]]
    with pytest.raises(UpdateRejected) as info:
        validate_in_subprocess(MODELS / "model_invoking_error.tflite")
    assert info.value.reason == "validation_failed" and "fake-op-double" in info.value.detail
    truncated = tmp_path / "cut.tflite"
    truncated.write_bytes(V2.read_bytes()[:100_000])
    with pytest.raises(UpdateRejected, match="truncated"):
        validate_in_subprocess(truncated)


def fake_interpreter(tmp_path, body: str) -> str:
    """A stand-in for a Python whose runtime hangs or crashes while loading the model."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_hanging_runtime_is_killed_by_the_timeout(tmp_path):
    hang = fake_interpreter(tmp_path, "exec sleep 60")
    with pytest.raises(UpdateRejected) as info:
        validate_in_subprocess(V2, timeout_s=1, interpreter=hang)
    assert info.value.reason == "validation_timeout"


def test_a_crashing_runtime_is_reported(tmp_path):
    crash = fake_interpreter(tmp_path, f"kill -{int(signal.SIGSEGV)} $$")
    with pytest.raises(UpdateRejected, match="crashed"):
        validate_in_subprocess(V2, timeout_s=20, interpreter=crash)


def test_health_gate():
    gate = HealthGate(frames=3, baseline_infer_ms=10.0, max_factor=2.0)
    assert gate.observe(11.0, True) is None and gate.observe(12.0, True) is None
    assert gate.observe(9.0, True) is True
    slow = HealthGate(frames=2, baseline_infer_ms=10.0, max_factor=2.0)
    slow.observe(25.0, True)
    assert slow.observe(30.0, True) is False and "latency" in slow.reason
    assert HealthGate().observe(1.0, False) is False
    assert result_is_finite([{"score": 0.5}]) and not result_is_finite({"x": float("nan")})


def test_corrupt_state_file_is_a_clear_error(tmp_path):
    slots = ModelSlots(tmp_path)
    slots.install_initial(V1, name=V1.name, version=1, sha256=sha(V1))
    (tmp_path / "models" / "slots.json").write_text("{not json")
    with pytest.raises(UpdateRejected, match="state_corrupt"):
        ModelSlots(tmp_path)


def test_sigkill_during_state_write_never_corrupts(tmp_path):
    """Kill a writer mid-loop many times: the state file always parses and names one model."""
    script = (
        "from edgeinfer.updates.slots import ModelSlots, InstalledModel\n"
        f"s = ModelSlots({str(tmp_path)!r})\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1\n"
        "    s.begin_trial(InstalledModel('b', '/x', 'm', i, 'c' * 64)); s.commit()\n"
    )
    slots = ModelSlots(tmp_path)
    slots.install_initial(V1, name=V1.name, version=1, sha256=sha(V1))
    state_file = tmp_path / "models" / "slots.json"
    for _ in range(3):
        before = json.loads(state_file.read_text())["active"]["version"]
        proc = subprocess.Popen([sys.executable, "-c", script], env=env_with_repo())
        try:
            # kill it inside its write loop, not while it is still starting up
            assert wait_until(lambda b=before: json.loads(state_file.read_text())["active"]["version"] != b, 30)
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL  # killed while writing, not dead of its own accord
        state = ModelSlots(tmp_path)
        assert state.active is not None and state.trial is None
    shutil.rmtree(tmp_path / "models")
