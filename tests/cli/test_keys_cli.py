"""`edgeinfer keys` as a user runs it, and the embedded broker."""

from __future__ import annotations

import json
import subprocess
import time

import paho.mqtt.client as mqtt
from support.processes import edgeinfer_cmd

from edgeinfer.fleet.broker import EmbeddedBroker
from edgeinfer.updates.signing import SigningKey, VerifyKey, new_manifest


def test_keys_init_and_show(tmp_path):
    out = subprocess.run(edgeinfer_cmd("keys", "init", "--dir", str(tmp_path), "--json"),
                         capture_output=True, text=True, check=True)
    made = json.loads(out.stdout)
    assert (tmp_path / "fleet-signing.key").stat().st_mode & 0o777 == 0o600
    key = SigningKey.load(made["private_key"])
    manifest = new_manifest(model_name="m.tflite", version=1, sha256="a" * 64, size=1, url="http://x/y", target="all")
    VerifyKey(made["public_key"]).verify(manifest.to_dict(), key.sign(manifest))
    again = subprocess.run(edgeinfer_cmd("keys", "init", "--dir", str(tmp_path)), capture_output=True, text=True)
    assert again.returncode == 1 and "refusing to replace" in again.stderr
    shown = subprocess.run(edgeinfer_cmd("keys", "show", "--dir", str(tmp_path)), capture_output=True, text=True)
    assert shown.stdout.strip() == made["public_key"]


def test_embedded_broker_relays_retained_qos1(tmp_path):
    got = []
    with EmbeddedBroker(port=0) as broker:
        publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="pub")
        publisher.connect(broker.host, broker.port)
        publisher.loop_start()
        publisher.publish("edgeinfer/v1/f/d/state", b'{"online": true}', qos=1, retain=True).wait_for_publish(5)
        subscriber = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sub")
        subscriber.on_message = lambda c, u, m: got.append((m.topic, m.retain))
        subscriber.connect(broker.host, broker.port)
        subscriber.subscribe("edgeinfer/v1/+/+/state", qos=1)
        subscriber.loop_start()
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        for client in (publisher, subscriber):
            client.loop_stop()
            client.disconnect()
    assert got == [("edgeinfer/v1/f/d/state", True)]
