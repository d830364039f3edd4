"""A deployment has a kind: the signed manifest names it (a model's leaves it out), the agent's ``deploy`` command
checks what every kind shares and hands the rest to the kind's handler, versions are judged per kind, and a kind
the agent cannot install is refused — never installed as a model."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from support.agent import fleet_key

from edgeinfer.agent.commands import CommandContext
from edgeinfer.agent.config import parse_config
from edgeinfer.agent.deploy import UpdateService
from edgeinfer.errors import UpdateRejected
from edgeinfer.link.vocabulary import DeploymentKind
from edgeinfer.updates.signing import KIND_FORM, Manifest, new_manifest

#: the fields of a manifest as agents before kinds define it: their Manifest.from_dict is ``cls(**data)``
FIELDS_BEFORE_KINDS = {"deployment_id", "model_name", "version", "sha256", "size", "url", "target", "issued_at",
                       "expires_at", "rollback", "manifest_version", "extra"}


def manifest(kind: str | None, version: int = 2, deployment_id: str | None = None) -> Manifest:
    return new_manifest(model_name="artifact", version=version, sha256="ab" * 32, size=10,
                        url="http://fleet.example/artifacts/x", target="device:cam-01", kind=kind,
                        deployment_id=deployment_id)


def signed(kind: str | None, **options: Any) -> dict:
    made = manifest(kind, **options)
    return {"manifest": made.to_dict(), "signature": fleet_key().sign(made)}


def test_a_model_manifest_reads_as_before_kinds_and_any_other_kind_does_not():
    model, agent = manifest(None).to_dict(), manifest("agent").to_dict()
    assert set(model) == FIELDS_BEFORE_KINDS  # an agent from before kinds takes models as it always did
    assert set(agent) - FIELDS_BEFORE_KINDS == {"kind"} and agent["kind"] == "agent"  # ... and refuses this one
    assert Manifest.from_dict(agent).kind == "agent" and Manifest.from_dict(model).kind is None
    with pytest.raises(UpdateRejected) as refused:
        Manifest.from_dict({**model, "kind": "Not A Word"})
    assert refused.value.reason == "bad_manifest"
    assert [kind.value for kind in DeploymentKind] == ["model", "config", "agent"]
    assert all(KIND_FORM.fullmatch(kind.value) for kind in DeploymentKind)  # every word is one a manifest takes
    assert DeploymentKind.of(None) == DeploymentKind.MODEL


class Recorder:
    """A kind's handler that records what it is given; ``running``: the version of its kind the device runs."""

    def __init__(self, running: int | None) -> None:
        self.running = running
        self.deployed: list[Manifest] = []

    def running_version(self, args):
        return self.running

    def deploy(self, manifest, args, ctx):
        self.deployed.append(manifest)
        return {"state": "active"}

    def rollback(self, args, ctx):
        return {"state": "active", "rolled_back": True}


@pytest.fixture
def service(tmp_path) -> UpdateService:
    config = parse_config({"device_id": "cam-01", "fleet": "test", "data_dir": str(tmp_path / "data"),
                           "update_public_key": fleet_key().public_key_b64()})
    return UpdateService(config)


CTX = CommandContext(agent=None, command_id="c-1", message={})  # type: ignore[arg-type]


def reason(service: UpdateService, args: dict) -> str:
    with pytest.raises(UpdateRejected) as refused:
        service.handle_deploy(args, CTX)
    return refused.value.reason


def test_each_kind_goes_to_its_handler_with_its_own_versions(service):
    models, configs = Recorder(running=7), Recorder(running=3)
    service.register_kind(DeploymentKind.MODEL, models)
    service.register_kind(DeploymentKind.CONFIG, configs)
    assert service.handle_deploy(signed("config", version=4), CTX) == {"state": "active"}
    assert [m.kind for m in configs.deployed] == ["config"] and not models.deployed
    # version 4 is newer than the configuration's 3, older than the model's 7: per kind
    assert reason(service, signed(None, version=4)) == "downgrade"
    assert reason(service, signed("config", version=3)) == "downgrade"
    assert service.handle_deploy(signed(None, version=8), CTX) == {"state": "active"}
    assert [m.kind for m in models.deployed] == [None]
    # one record of deployments handled, whatever their kind: the same id again is a replay
    again = signed("config", version=9, deployment_id=configs.deployed[0].deployment_id)
    assert reason(service, again) == "replay"
    assert service.handle_rollback({"kind": "config"}, CTX) == {"state": "active", "rolled_back": True}


def test_a_kind_this_agent_cannot_install_is_refused_not_installed_as_a_model(service):
    models = Recorder(running=None)
    service.register_kind(DeploymentKind.MODEL, models)
    assert reason(service, signed("config")) == "unknown_kind"  # a word it knows, without a handler yet
    assert reason(service, signed("firmware")) == "unknown_kind"  # a word from a newer fleet
    forged = signed("agent")
    forged["manifest"] = {**forged["manifest"], "kind": None}  # the kind is signed: it cannot be taken off
    assert reason(service, forged) == "bad_signature"
    # an agent update needs the launcher: an agent started any other way refuses it, nothing changed
    assert reason(service, signed("agent")) == "self_update_unavailable"
    assert not models.deployed


def test_a_manifest_s_kind_is_part_of_what_is_signed():
    made = manifest("agent")
    other = dataclasses.replace(made, kind="config")
    assert fleet_key().sign(made) != fleet_key().sign(other)
