"""Deployment kinds on the fleet's side: the API takes a kind (model by default, or an agent bundle), signs it into
the manifest, keeps it in the deployment's row (migration 0011) and says it in every answer and in the audit; the
rollout, its abort rate and the canary's rollback treat every kind through the same code. Real HTTP API, real
SQLite; the devices' side end to end is in test_agent_update.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.fleet import admin_of, api_server, state_message

from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.deployments import follow_state, rollback_args, running_artifacts
from edgeinfer.fleet.rollout import plan_waves, step
from edgeinfer.fleet.schemas import DeploymentSpec
from edgeinfer.link.vocabulary import DeploymentKind
from edgeinfer.updates.bundle import pack
from edgeinfer.updates.signing import VerifyKey


def fake_wheel(folder: Path, version: str) -> Path:
    """An edgeinfer wheel as far as the bundle reads one (its METADATA)."""
    path = folder / f"edgeinfer-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"edgeinfer-{version}.dist-info/METADATA", f"Name: edgeinfer\nVersion: {version}\n")
    return path


@pytest.fixture
def world(tmp_path):
    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    for device in ("cam-1", "cam-2"):
        db.record_state("f", device, state_message(device, "0" * 32))
    with api_server(db, tmp_path / "api") as (server, services):
        yield db, services, FleetClient(server.url, token=admin_of(tmp_path / "api")), server.url
    db.close()


def post(url: str, token: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/api/deployments", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_api_signs_the_kind_keeps_it_and_says_it(world, tmp_path):
    db, services, client, url = world
    bundle = pack(fake_wheel(tmp_path, "0.9.1"), tmp_path / "bundle.tar")
    uploaded = client.upload(tmp_path / "bundle.tar")
    agent = client.create_deployment(DeploymentSpec(sha256=uploaded["sha256"], kind="agent", model_name=bundle.name,
                                                    version=bundle.number, devices=["cam-1"]))
    assert (agent["kind"], agent["model_name"], agent["version"]) == ("agent", "edgeinfer-0.9.1", 9001)
    model_file = tmp_path / "m.tflite"
    model_file.write_bytes(b"TFL3" + b"\0" * 60)
    model = client.create_deployment(DeploymentSpec(sha256=client.upload(model_file)["sha256"], version=2,
                                                    devices=["cam-1"]))
    assert model["kind"] == "model"
    # what the devices are sent: the kind in the signed manifest (a model's leaves it out)
    key = VerifyKey(services.deployments.key.public_key_b64())
    rows = {r["deployment_id"]: r for r in db.running_deployments()}
    signed_agent = rows[agent["deployment_id"]]
    assert key.verify(signed_agent["manifest"], signed_agent["signature"]).kind == "agent"
    assert "kind" not in rows[model["deployment_id"]]["manifest"]
    assert {d["deployment_id"]: d["kind"] for d in client.deployments()} == {agent["deployment_id"]: "agent",
                                                                              model["deployment_id"]: "model"}
    assert client.deployment(agent["deployment_id"])["kind"] == "agent"
    audit = next(e for e in client.audit() if e["action"] == "deployment.create"
                 and e["target"] == agent["deployment_id"])
    assert audit["detail"]["kind"] == "agent"
    # updating the agent needs an admin: an operator may deploy models only
    operator = services.access.tokens.create(name="ci", role="operator")["token"]
    status, body = post(url, operator, {"sha256": uploaded["sha256"], "kind": "agent", "version": 9002, "all": True})
    assert status == 403 and "updating the agent needs admin" in body["error"]
    status, _ = post(url, operator, {"sha256": uploaded["sha256"], "version": 3, "devices": ["cam-2"]})
    assert status == 201
    # a kind the manager cannot deploy is refused, naming the field
    token = admin_of(tmp_path / "api")
    for word in ("config", "firmware", 1):
        status, body = post(url, token, {"sha256": uploaded["sha256"], "version": 3, "kind": word, "all": True})
        assert status == 400 and body["error"].startswith("kind"), (word, body)


def test_every_kind_rolls_out_through_the_same_rule(tmp_path):
    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    try:
        devices = [f"d{i}" for i in range(5)]
        manifest = {"deployment_id": "agent-1", "kind": "agent", "model_name": "edgeinfer-0.9.1", "version": 9001,
                    "sha256": "b" * 64, "size": 1, "target": "all"}
        db.create_deployment(manifest, "sig", {"abort_failure_rate": 0.0, "device_timeout_s": 600, "canary_pct": 20},
                             plan_waves(devices, canary_pct=20, wave_size=2))
        (deployment,) = db.running_deployments()
        assert deployment["kind"] == "agent"
        notified: list[str] = []
        assert step(db, deployment, notified.append) is None and notified == ["d0"]  # the canary only
        db.advance_target("agent-1", "d0", "downloading")
        db.advance_target("agent-1", "d0", "rolled_back", "the new agent exited with status 1")
        assert step(db, deployment, notified.append) == "aborted" and notified == ["d0"]  # nobody else
        assert rollback_args(deployment) == {"kind": "agent"}  # the canary's rollback names the agent
        assert rollback_args({**deployment, "kind": "model", "options": {"pipeline": "main"}}) == {"pipeline": "main"}
    finally:
        db.close()


def test_a_device_s_state_completes_a_target_of_its_own_kind_only(tmp_path):
    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    try:
        bundle_sha = "c" * 64
        db.create_deployment({"deployment_id": "agent-2", "kind": "agent", "model_name": "edgeinfer-0.9.2",
                              "version": 9002, "sha256": bundle_sha, "size": 1, "target": "all"}, "sig",
                             {"device_timeout_s": 600}, [["cam-1"]])
        db.advance_target("agent-2", "cam-1", "notified")
        running = db.running_deployments()
        state = state_message("cam-1", "1" * 32)
        on_trial = {**state, "agent": {"slot": "b", "version": "0.9.2", "sha256": bundle_sha, "trial": True}}
        assert running_artifacts(on_trial)[DeploymentKind.AGENT] == set()  # not before it reported healthy
        assert not follow_state(db, running, "cam-1", on_trial)
        models_only = {**state, "pipelines": [{"name": "main", "status": "running", "model": {"sha256": bundle_sha}}]}
        assert not follow_state(db, running, "cam-1", models_only)  # the same bytes as a model: another kind
        healthy = {**on_trial, "agent": {**on_trial["agent"], "trial": False}}
        assert follow_state(db, running, "cam-1", healthy)
        assert db.deployment_targets("agent-2")[0]["state"] == "active"
    finally:
        db.close()


def test_deployments_made_before_kinds_are_models(tmp_path):
    from alembic import command

    from edgeinfer.fleet.db.migrate import _config

    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        command.upgrade(_config(connection), "0008")
        connection.execute(sa.text(
            "INSERT INTO deployments (deployment_id, model_name, version, sha256, size, target, options, status, "
            "manifest, signature, created_at, updated_at) VALUES ('old-1', 'm.tflite', 2, :sha, 1, 'all', '{}', "
            "'succeeded', '{}', 's', 1.0, 1.0)"), {"sha": "a" * 64})
    engine.dispose()
    db = FleetDB(url)  # upgraded on open
    try:
        assert db.get_deployment("old-1")["kind"] == "model"
    finally:
        db.close()
