"""The MQTT link against a real Mosquitto: PUBACK-gated spool drain, window, TLS, auth, sessions."""

from __future__ import annotations

import random
import signal
import time

import pytest
from support.broker import Broker, Collector, make_tls_files, running_broker
from support.processes import run_without
from support.processes import wait_until as wait_for

from edgeinfer.errors import ClosedError
from edgeinfer.link.mqtt import MqttLink
from edgeinfer.link.settings import LinkSettings, parse_broker_url
from edgeinfer.link.spool import Spool
from edgeinfer.util.backoff import EQUAL_JITTER, Backoff


@pytest.fixture
def broker(tmp_path):
    with running_broker(tmp_path) as b:
        yield b

TOPIC = "edgeinfer/v1/default/cam-01/telemetry"
CMD = "edgeinfer/v1/default/cam-01/cmd"


def settings(url: str, **overrides) -> LinkSettings:
    values = {"url": url, "client_id": "test-cam-01", "reconnect_min_s": 0.1, "reconnect_max_s": 0.5}
    values.update(overrides)
    return LinkSettings(**values)


def test_a_closed_link_refuses_to_start_again(broker):
    link = MqttLink(settings(broker.url))
    with link:
        assert wait_for(lambda: link.status.connected, 10)
    with pytest.raises(ClosedError, match="closed"):
        link.start()
    link.close()  # idempotent


def test_broker_urls():
    assert str(parse_broker_url("mqtt://example.org")) == "mqtt://example.org:1883"
    assert str(parse_broker_url("mqtts://example.org")) == "mqtts://example.org:8883"
    url = parse_broker_url("mqtt://user:p%40ss@10.0.0.2:1884")
    assert (url.host, url.port, url.username, url.password, url.tls) == ("10.0.0.2", 1884, "user", "p@ss", False)
    for bad in ("tcp://x", "mqtt://x:99999", "mqtt://x/path", "x:1883", ""):
        with pytest.raises(ValueError, match="mqtt://HOST"):
            parse_broker_url(bad)


def test_backoff_grows_is_capped_and_jittered():
    rng = random.Random(1)
    backoff = Backoff(initial_s=0.5, max_s=30, jitter=EQUAL_JITTER)  # what the link reconnects with
    delays = [[backoff.delay(n, rng) for _ in range(200)] for n in (1, 2, 3, 8, 20)]
    for values, base in zip(delays, (0.5, 1, 2, 30, 30)):
        assert base / 2 <= min(values) and max(values) <= base  # "equal jitter": within [base/2, base]
        assert max(values) - min(values) > base / 4  # really spread, so a fleet does not reconnect in lockstep


def test_a_missing_paho_names_the_pip_extra():
    """Without paho-mqtt a link is a MissingDependency (an ImportError too) that says what to install."""
    done = run_without({"paho"}, """
        from edgeinfer.errors import MissingDependency
        from edgeinfer.link.mqtt import MqttLink
        from edgeinfer.link.settings import LinkSettings
        try:
            MqttLink(LinkSettings(url='mqtt://127.0.0.1:1', client_id='no-paho'))
        except MissingDependency as exc:
            assert isinstance(exc, ImportError)
            print(exc)
    """)
    assert done.returncode == 0, done.stderr
    assert "pip install 'edgeinfer[fleet]'" in done.stdout


def test_rows_leave_the_spool_only_on_puback_and_the_window_is_bounded(tmp_path, broker):
    with Collector(broker.port) as collector, Spool(tmp_path / "s.db") as spool:
        assert collector.wait_subscribed()
        for i in range(50):
            spool.append(TOPIC, b'{"seq":%d}' % i)
        link = MqttLink(settings(broker.url, inflight_window=5), spool=spool)
        with link:
            assert link.wait_connected(10)
            assert wait_for(lambda: spool.pending == 0, 10)
            assert wait_for(lambda: len(collector.of_kind("telemetry")) == 50, 5)
            assert [m["seq"] for m in collector.of_kind("telemetry")] == list(range(50))  # in order

            broker.proc.send_signal(signal.SIGSTOP)  # the broker takes the bytes but acknowledges nothing
            try:
                published = link.status.published
                for i in range(50, 80):
                    spool.append(TOPIC, b'{"seq":%d}' % i)
                link.notify()
                assert wait_for(lambda: link.status.published == published + 5, 5)
                time.sleep(0.5)
                assert link.status.published == published + 5  # window of 5, not one more
                assert spool.pending == 30  # sent, but not acknowledged: still in the spool
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            assert wait_for(lambda: spool.pending == 0, 10)
            assert wait_for(lambda: len(collector.of_kind("telemetry")) == 80, 5)
            assert [m["seq"] for m in collector.of_kind("telemetry")] == list(range(80))


@pytest.mark.parametrize("version", ["5", "3.1.1"])
def test_persistent_session_gets_commands_sent_while_offline(tmp_path, broker, version):
    got: list[bytes] = []
    with Collector(broker.port) as fleet:
        link = MqttLink(settings(broker.url, mqtt_version=version), subscriptions=[CMD],
                        on_message=lambda topic, payload: got.append(payload))
        with link:
            assert link.wait_connected(10)
            time.sleep(0.2)  # SUBACK
            fleet.publish(CMD, b"first")
            assert wait_for(lambda: got == [b"first"], 5)
            assert link.status.protocol == version
        # the device is away (clean disconnect); the broker keeps its session and queues QoS 1
        fleet.publish(CMD, b"while-away")
        again = MqttLink(settings(broker.url, mqtt_version=version), subscriptions=[CMD],
                         on_message=lambda topic, payload: got.append(payload))
        with again:
            assert wait_for(lambda: got == [b"first", b"while-away"], 10)
            assert again.status.session_present is True


def test_last_will_and_retained_birth(tmp_path, broker):
    state = "edgeinfer/v1/default/cam-01/state"
    with Collector(broker.port, state) as collector:
        assert collector.wait_subscribed()
        link = MqttLink(settings(broker.url), will=(state, b'{"online":false}'))
        link.set_retained(state, b'{"online":true}')
        link.start()
        assert wait_for(lambda: collector.of_kind("state") == [b'{"online":true}'] or
                        collector.of_kind("state") == [{"online": True}], 10)
        # kill the link's socket the way a crash would: the broker sends the will
        link._client.socket().close()
        assert wait_for(lambda: {"online": False} in collector.of_kind("state"), 10)
        # and it comes back by itself, re-publishing the birth after reconnecting
        assert wait_for(lambda: collector.of_kind("state")[-1] == {"online": True}, 10)
        link.close()
        link.close()


def test_tls_with_client_certificate(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    other = make_tls_files(tmp_path / "other")  # a CA that did not sign the broker's certificate
    b = Broker(tmp_path / "broker", tls=tls).start()
    try:
        with Spool(tmp_path / "s.db") as spool:
            spool.append(TOPIC, b"{}")
            good = MqttLink(settings(b.url, ca=str(tls.ca), cert=str(tls.client_cert), key=str(tls.client_key)),
                            spool=spool)
            with good:
                assert good.wait_connected(10) and wait_for(lambda: spool.pending == 0, 5)
            wrong_ca = MqttLink(settings(b.url, ca=str(other.ca), cert=str(tls.client_cert),
                                         key=str(tls.client_key)))
            with wrong_ca:
                assert wait_for(lambda: wrong_ca.status.failed_attempts >= 2, 10)
                assert not wrong_ca.connected
                assert "TLS verification of 127.0.0.1" in wrong_ca.status.last_error
                assert "check `ca`" in wrong_ca.status.last_error
    finally:
        b.kill()


def test_bad_password_is_reported_and_retried_with_backoff(tmp_path):
    b = Broker(tmp_path / "broker", users={"cam-01": "right"}).start()
    try:
        good = MqttLink(settings(b.url, username="cam-01", password="right"))
        with good:
            assert good.wait_connected(10)
        bad = MqttLink(settings(b.url, username="cam-01", password="wrong", reconnect_min_s=0.2,
                                reconnect_max_s=0.4))
        with bad:
            assert wait_for(lambda: bad.status.failed_attempts >= 3, 10)
            assert not bad.connected
            assert "refused the connection" in bad.status.last_error
            assert "check username/password" in bad.status.last_error
            time.sleep(1.0)
            assert bad.status.failed_attempts < 12  # backing off, not hammering the broker
    finally:
        b.kill()


@pytest.mark.parametrize(("limit", "version"), [
    ("max_packet_size 2000", "5"),        # announced in CONNACK: refused before it is ever sent
    ("max_packet_size 2000", "3.1.1"),    # not announced: the broker hangs up on it, every time
    ("message_size_limit 1000", "5"),     # mosquitto drops the connection too
])
def test_a_message_the_broker_will_never_take_is_dropped_not_retried_for_ever(tmp_path, caplog, limit, version):
    """One oversized message at the head of the spool must not cut the device off for good."""
    broker = Broker(tmp_path / "broker", config=(limit,)).start()
    try:
        with Collector(broker.port) as collector, Spool(tmp_path / "s.db") as spool:
            assert collector.wait_subscribed()
            spool.append(TOPIC, b'{"seq":1}')
            spool.append(TOPIC, b'{"seq":2,"pad":"' + b"x" * 5000 + b'"}')
            for seq in range(3, 30):
                spool.append(TOPIC, b'{"seq":%d}' % seq)
            link = MqttLink(settings(broker.url, mqtt_version=version, inflight_window=5), spool=spool)
            with link:
                assert wait_for(lambda: spool.pending == 0, 30), link.status.to_dict()
                assert wait_for(lambda: len(collector.of_kind("telemetry")) >= 28, 5)
                seqs = sorted({m["seq"] for m in collector.of_kind("telemetry")})
                assert seqs == [1, *range(3, 30)]  # everything else arrived
                assert link.status.rejected == 1
                assert "dropped spooled message 2" in caplog.text
                spool.append(TOPIC, b'{"seq":30}')  # and the link goes on working
                link.notify()
                assert wait_for(lambda: 30 in {m["seq"] for m in collector.of_kind("telemetry")}, 10)
                assert link.connected
    finally:
        broker.stop()


def test_a_flaky_connection_loses_nothing_even_when_it_drops_right_after_sending(tmp_path):
    """The poison check must not drop messages a broker would take: kill the broker while a message
    is in flight, again and again (under the strike count each time it is acknowledged in between)."""
    broker = Broker(tmp_path / "broker").start()
    try:
        with Spool(tmp_path / "s.db") as spool:
            link = MqttLink(settings(broker.url), spool=spool)
            with link:
                assert link.wait_connected(10)
                for round_ in range(4):
                    broker.proc.send_signal(signal.SIGSTOP)  # takes bytes, acks nothing
                    spool.append(TOPIC, b'{"seq":%d}' % round_)
                    link.notify()
                    assert wait_for(lambda n=round_: link.status.published > n, 5)
                    broker.kill()
                    broker.start()
                    assert wait_for(lambda: spool.pending == 0, 20), link.status.to_dict()
                assert link.status.rejected == 0
    finally:
        broker.stop()


def test_manual_ack_and_receive_maximum_make_the_broker_hold_back(broker):
    """Unacknowledged messages stop the flow at the Receive Maximum (the broker queues the rest, drops none);
    acknowledging lets it resume; what was never acknowledged comes again after a reconnect."""
    import threading

    received: list[tuple[int, object]] = []
    lock = threading.Lock()

    def on_delivery(topic, payload, delivery):
        with lock:
            received.append((int(payload), delivery))

    link = MqttLink(settings(broker.url, client_id="fleet-ingest", receive_maximum=10, manual_ack=True,
                             mqtt_version="5"),
                    subscriptions=["test/#"], on_delivery=on_delivery)
    with pytest.raises(ValueError, match="manual_ack"):
        MqttLink(settings(broker.url), on_delivery=on_delivery)
    with link, Collector(broker.port, "nothing/#") as publisher:
        assert wait_for(lambda: link.status.connected, 10)
        time.sleep(0.3)  # the SUBSCRIBE is on its way
        for n in range(100):
            publisher.publish("test/x", str(n))
        assert wait_for(lambda: len(received) >= 10, 10)
        time.sleep(0.5)
        assert len(received) == 10, "the broker must hold back past the Receive Maximum"
        # acknowledge as they come: the other 90 arrive, in order, once each. (Mosquitto 2.0.11 refills more
        # than one slot per PUBACK — eclipse-mosquitto/mosquitto#2301 — so only the first stop is exact.)
        acked = 0
        while acked < 100:
            with lock:
                pending = [d for _, d in received[acked:]]
            for delivery in pending:
                delivery.ack()
            acked += len(pending)
            assert wait_for(lambda n=acked: len(received) > n or n == 100, 10)
        time.sleep(0.3)
        assert [n for n, _ in received] == list(range(100))
        # a delivery from an earlier connection is never acknowledged on the next one
        with lock:
            unacked_before_kill = len(received)
        publisher.publish("test/x", "100")
        assert wait_for(lambda: len(received) == unacked_before_kill + 1, 10)
        link._client.socket().close()  # the connection dies with message 100 unacknowledged
        assert wait_for(lambda: len(received) == unacked_before_kill + 2, 15), "100 is redelivered"
        assert received[-1][0] == 100 and received[-2][0] == 100
        received[-2][1].ack()  # stale: dropped
        received[-1][1].ack()


def test_an_acknowledgement_from_another_thread_wakes_the_link_thread_once_per_batch():
    """The link thread waits in select() on its socket and the inbox's wake-up socket (no 2 ms poll while messages
    are unacknowledged): the first acknowledgement queued makes it readable, the next ones go out with it."""
    import select
    import threading

    from edgeinfer.link.inbox import Delivery, Inbox

    woken = threading.Event()
    inbox = Inbox(lambda *_: None, woken.set)
    inbox.connected()
    try:
        fd = inbox.wake_fileno()
        assert select.select([fd], [], [], 0)[0] == []
        acks = [threading.Thread(target=Delivery(inbox, 1, mid, 1).ack) for mid in (1, 2, 3)]
        for thread in acks:
            thread.start()
            thread.join()
        assert select.select([fd], [], [], 5)[0] == [fd] and woken.is_set()
        inbox.woken()  # emptied: one byte for the three, which the next pump sends together
        assert select.select([fd], [], [], 0)[0] == []
        assert [d.mid for d in inbox._acks] == [1, 2, 3]
        Delivery(inbox, 0, 4, 1).ack()  # an earlier connection's: dropped, wakes nothing
        assert select.select([fd], [], [], 0)[0] == []
    finally:
        inbox.close()
    Delivery(inbox, 1, 5, 1).ack()  # after the link closed its inbox: dropped, no error
