"""The fleet manager signs every command it sends, for that device, with an expiry (real Mosquitto, real manager)."""

from __future__ import annotations

import json
import time

import pytest
from support.broker import Collector
from support.fleet import running_fleet
from support.processes import wait_until as wait

from edgeinfer.errors import CommandRejected
from edgeinfer.link.protocol import Topics, validate
from edgeinfer.link.vocabulary import Command
from edgeinfer.updates.signing import COMMAND_TTL_S, VerifyKey


def test_commands_are_signed_for_their_device_and_expire(tmp_path, broker):
    with running_fleet(tmp_path / "fleet", broker.url) as manager, Collector(broker.port) as wire:
        assert wire.wait_subscribed()
        for device in ("cam-01", "cam-02"):
            wire.publish(Topics("f", device).state, json.dumps({
                "v": 1, "type": "state", "fleet": "f", "device": device, "ts": time.time(), "online": True,
                "boot_id": "0" * 32}))
        assert wait(lambda: len(manager.db.list_devices()) == 2)
        pinned = VerifyKey(manager.key.public_key_b64())
        sent_at = time.time()
        manager.commands.send("cam-01", Command.ROLLBACK, {}, command_id="c-rollback")
        expires_at = sent_at + 3 * 24 * 3600
        manager.commands.send("cam-02", Command.DEPLOY, {"manifest": {"deployment_id": "d1", "expires_at": expires_at},
                                                  "signature": "s"}, command_id="c-deploy")
        assert wait(lambda: len(wire.of_kind("cmd")) == 2)
        rollback, deploy = sorted(wire.of_kind("cmd"), key=lambda m: m["id"], reverse=True)
        for message in (rollback, deploy):
            validate("cmd", message)
        pinned.verify_command(rollback, device_id="cam-01")
        assert rollback["device"] == "cam-01"
        assert sent_at + COMMAND_TTL_S - 5 <= rollback["expires"] <= time.time() + COMMAND_TTL_S
        pinned.verify_command(deploy, device_id="cam-02")
        assert deploy["expires"] == expires_at  # a deploy lives as long as its manifest
        with pytest.raises(CommandRejected) as info:  # not good on another device
            pinned.verify_command(rollback, device_id="cam-02")
        assert info.value.reason == "wrong_device"
