"""The Mosquitto that `fleet serve` manages: config, persistence that really lands on disk (as root too),
a crash survived with its sessions, MQTT 5 shared subscriptions, and clear errors."""

from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.ports import free_port
from support.processes import wait_until as wait

from edgeinfer.errors import ConfigError
from edgeinfer.fleet.broker import ManagedMosquitto


def client(broker: ManagedMosquitto, client_id: str, *, persistent: bool = False, got: list | None = None):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600 if persistent else 0
    if got is not None:
        lock = threading.Lock()

        def on_message(_c, _u, message):
            with lock:
                got.append((message.topic, bytes(message.payload), bool(message.retain)))

        c.on_message = on_message
    c.connect(broker.host, broker.port, clean_start=not persistent, properties=props)
    c.loop_start()
    return c


def stop(*clients) -> None:
    for c in clients:
        c.disconnect()
        c.loop_stop()


def test_persistence_lands_in_a_root_only_folder_and_a_crash_keeps_sessions(tmp_path):
    data = tmp_path / "fleet-data"
    data.mkdir(mode=0o700)  # as root: the folder Mosquitto's own user could not write
    with ManagedMosquitto(data, port=0, allow_anonymous=True) as broker:
        config = broker.config_file.read_text()
        assert f"user {getpass.getuser()}" in config and "max_queued_messages 1000000" in config
        assert broker.persistence_file.exists(), "start() proves the persistence file is written"
        got: list = []
        offline = client(broker, "fleet-manager", persistent=True, got=got)
        offline.subscribe("edgeinfer/v1/+/+/telemetry", qos=1)
        time.sleep(0.3)
        stop(offline)  # away, with a persistent session
        publisher = client(broker, "device")
        publisher.publish("edgeinfer/v1/f/d/state", b"birth", qos=1, retain=True).wait_for_publish(5)
        publisher.publish("edgeinfer/v1/f/d/telemetry", b"queued", qos=1).wait_for_publish(5)
        stop(publisher)
        broker.save()
        first_pid, port = broker.pid, broker.port
        os.kill(first_pid, signal.SIGKILL)
        assert wait(lambda: broker.restarts == 1 and broker.pid not in (None, first_pid), 15)
        assert broker.port == port
        broker.save()  # at once: a relaunch counts as started only once this run said "running" (signals set)
        back = client(broker, "fleet-manager", persistent=True, got=got)  # the session survived the crash
        assert wait(lambda: got, 10)
        assert got == [("edgeinfer/v1/f/d/telemetry", b"queued", False)]
        late: list = []
        reader = client(broker, "reader", got=late)
        reader.subscribe("edgeinfer/v1/+/+/state", qos=1)
        assert wait(lambda: late, 10) and late == [("edgeinfer/v1/f/d/state", b"birth", True)]
        stop(back, reader)
    assert broker.pid is None


def test_a_manager_closed_at_once_says_nothing_of_its_stopped_broker_s_persistence(tmp_path, caplog):
    """The manager asks its Mosquitto to save its persistence a second after it connects (its session must survive a
    broker crash); a manager closed before that has stopped its broker with it: nothing to save, nothing to warn of."""
    from edgeinfer.fleet.manager import FleetManager, FleetSettings

    with caplog.at_level(logging.WARNING, logger="edgeinfer.fleet.manager"):
        with FleetManager(FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0",
                                        data_dir=tmp_path / "fleet")) as manager:
            assert manager.wait_connected(10)
        time.sleep(1.5)  # past the save's second
    assert not [r.getMessage() for r in caplog.records if "persistence" in r.getMessage()]


def test_a_start_waits_for_this_runs_own_running_line_not_an_earlier_runs(tmp_path):
    """Mosquitto opens its port before it installs its signal handlers (a SIGUSR1 or SIGHUP then would end
    it): the broker counts as started once its log says "running" — this run's line, the log being kept
    across restarts."""
    broker = ManagedMosquitto(tmp_path / "m", port=0, allow_anonymous=True)
    broker.folder.mkdir(parents=True)
    earlier = b"1: mosquitto version 2.0.11 starting\n1: mosquitto version 2.0.11 running\n"
    broker.log_file.write_bytes(earlier + b"2: mosquitto version 2.0.11 starting\n2: Opening ipv4 listen socket\n")
    assert broker._logged_running(0) and not broker._logged_running(len(earlier))
    with open(broker.log_file, "ab") as log:
        log.write(b"2: mosquitto version 2.0.11 running\n")
    assert broker._logged_running(len(earlier))


def test_shared_subscriptions_deliver_each_message_once(tmp_path):
    with ManagedMosquitto(tmp_path, port=0, allow_anonymous=True) as broker:
        got_a: list = []
        got_b: list = []
        a = client(broker, "manager-a", got=got_a)
        b = client(broker, "manager-b", got=got_b)
        for c in (a, b):
            c.subscribe("$share/fleet/edgeinfer/v1/+/+/telemetry", qos=1)
        time.sleep(0.3)
        publisher = client(broker, "device")
        for n in range(100):
            publisher.publish("edgeinfer/v1/f/d/telemetry", str(n).encode(), qos=1)
        assert wait(lambda: len(got_a) + len(got_b) >= 100, 10)
        time.sleep(0.3)
        payloads = sorted(int(p) for _t, p, _r in got_a + got_b)
        assert payloads == list(range(100)) and got_a and got_b
        stop(a, b, publisher)


def test_a_taken_port_a_missing_mosquitto_and_an_unwritable_folder_are_config_errors(tmp_path, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"could not start.*Address already in use"):
            ManagedMosquitto(tmp_path / "a", port=port, allow_anonymous=True).start()
    monkeypatch.setenv("PATH", str(tmp_path))  # no mosquitto anywhere edgeinfer looks
    monkeypatch.setattr("edgeinfer.fleet.broker.FALLBACK_PATHS", ())
    with pytest.raises(ConfigError, match=r"apt-get install mosquitto.*--broker"):
        ManagedMosquitto(tmp_path / "b", port=free_port(), allow_anonymous=True).start()
    monkeypatch.undo()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "mosquitto").write_text("a file where the folder should be")
    with pytest.raises(ConfigError, match="not writable"):
        ManagedMosquitto(tmp_path / "c", port=free_port(), allow_anonymous=True).start()
