"""What edgeinfer changes under paho: the buffered socket (whole packets from one recv(), nothing held back
from select()) and the PUBLISH without properties decoded without paho's ``Properties``."""

from __future__ import annotations

import socket
import struct
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt import _packet
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.broker import running_broker
from support.processes import wait_until

from edgeinfer.link import paho_client
from edgeinfer.link.mqtt import MqttLink
from edgeinfer.link.paho_client import BufferedSocket, plain_publish
from edgeinfer.link.settings import LinkSettings


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    left.setblocking(False)
    yield BufferedSocket(left), right
    left.close()
    right.close()


def test_small_reads_are_served_from_one_system_read(pair):
    buffered, peer = pair
    packets = [bytes([0x30, 5]) + b"hello", bytes([0x30, 3]) + b"abc"]
    peer.sendall(b"".join(packets))
    assert buffered.recv(1) == b"\x30"
    assert buffered.pending() == len(b"".join(packets)) - 1  # read ahead: paho must not wait in select()
    assert buffered.recv(1) == b"\x05" and buffered.recv(5) == b"hello"
    assert buffered.recv(1) == b"\x30" and buffered.recv(1) == b"\x03"
    assert buffered.recv(100) == b"abc"  # never more than what is left of the chunk
    assert buffered.pending() == 0
    with pytest.raises(BlockingIOError):  # nothing buffered, nothing on the socket: paho's "try again"
        buffered.recv(1)
    peer.sendall(b"xyz")
    assert buffered.recv(10) == b"xyz"
    peer.shutdown(socket.SHUT_WR)
    assert buffered.recv(1) == b""  # end of stream reaches paho as such


def test_a_packet_split_across_system_reads_is_whole(pair):
    buffered, peer = pair
    peer.sendall(b"\x30\x0a01234")
    assert buffered.recv(1) == b"\x30" and buffered.recv(1) == b"\x0a"
    assert buffered.recv(10) == b"01234"  # what arrived so far; paho asks again for the rest
    peer.sendall(b"56789")
    assert buffered.recv(5) == b"56789"
    assert buffered.fileno() == buffered._sock.fileno()  # select() sees the real socket


def test_what_is_sent_while_corked_leaves_in_one_piece(pair):
    buffered, peer = pair
    peer.setblocking(False)
    buffered.cork()
    assert buffered.send(b"\x40\x02\x00\x01") == 4 and buffered.send(b"\x40\x02\x00\x02") == 4
    with pytest.raises(BlockingIOError):  # held back
        peer.recv(100)
    buffered.uncork()
    assert peer.recv(100) == b"\x40\x02\x00\x01\x40\x02\x00\x02" and buffered.unsent() == 0


def test_what_the_socket_does_not_take_stays_in_order_before_later_sends(pair):
    buffered, peer = pair
    buffered._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = bytes(range(256)) * 4096  # far more than the socket buffers
    buffered.cork()
    buffered.send(big)
    buffered.uncork()
    assert 0 < buffered.unsent() < len(big)  # partly sent; the rest held, in order
    assert buffered.send(b"after") == 5  # taken, queued behind what is still held
    received = bytearray()
    while len(received) < len(big) + 5:
        received += peer.recv(65536)
        buffered.flush()  # what loop_once() does when select() says the socket is writable
    assert bytes(received) == big + b"after" and buffered.unsent() == 0


def test_the_link_reads_through_the_buffer(tmp_path):
    """paho 2 calls the ``_create_socket`` we override: a paho that stops doing so fails here, not silently."""
    with running_broker(tmp_path) as broker, MqttLink(LinkSettings(url=broker.url, client_id="buffered")) as link:
        assert wait_until(lambda: link.status.connected, 10)
        assert isinstance(link._client.socket(), BufferedSocket)


def publish_packet(topic: bytes, qos: int, mid: int, properties: bytes, payload: bytes, *, dup: bool = False,
                   retain: bool = False) -> tuple[int, bytes]:
    """(fixed header's first byte, the rest after the remaining length) of an MQTT 5 PUBLISH."""
    header = 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    body = struct.pack("!H", len(topic)) + topic + (struct.pack("!H", mid) if qos else b"") + properties + payload
    return header, body


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("payload", [b"", b"{}", bytes(range(256)) * 40])
@pytest.mark.parametrize("topic", [b"t", "edgeinfer/v1/f/d\u00e9v/telemetry".encode()])
def test_a_publish_without_properties_decodes_as_paho_decodes_it(qos, payload, topic):
    header, body = publish_packet(topic, qos, 4242 if qos else 0, b"\x00", payload, dup=bool(qos), retain=True)
    paho_says = _packet.decode_publish(header, bytearray(body), paho.MQTTv5)
    assert plain_publish(header, bytearray(body)) == (paho_says.topic, paho_says.mid, paho_says.payload)
    assert type(plain_publish(header, bytearray(body))[2]) is bytes  # not a view of paho's reused buffer


@pytest.mark.parametrize(("qos", "dup", "retain"), [(0, False, False), (1, True, True), (1, False, True)])
def test_the_message_built_here_is_the_one_paho_builds(qos, dup, retain):
    """Our subclass's ``_handle_publish`` against paho's own, on the same packet, with manual acks."""
    client = paho_client._client_class()(CallbackAPIVersion.VERSION2, client_id="x", protocol=paho.MQTTv5,
                                         manual_ack=True)
    seen: list = []
    client.on_message = lambda _client, _userdata, message: seen.append(message)
    header, body = publish_packet(b"edgeinfer/v1/f/d/telemetry", qos, 77 if qos else 0, b"\x00", b'{"v":1}',
                                  dup=dup, retain=retain)
    for handle in (client._handle_publish, lambda: paho.Client._handle_publish(client)):
        client._in_packet = {"command": header, "packet": bytearray(body)}
        assert handle() == 0
    ours, pahos = seen
    for name in ("topic", "mid", "payload", "qos", "dup", "retain", "state"):
        assert getattr(ours, name) == getattr(pahos, name), name
    assert ours.timestamp <= pahos.timestamp


def test_anything_else_is_left_to_paho():
    with_properties = b"\x02" + b"\x01\x01"  # Payload Format Indicator = 1
    assert plain_publish(*publish_packet(b"t", 1, 7, with_properties, b"x")) is None
    assert plain_publish(*publish_packet(b"t", 2, 7, b"\x00", b"x")) is None  # QoS 2: paho's PUBREC dance
    assert plain_publish(*publish_packet(b"", 0, 0, b"\x00", b"x")) is None  # an empty topic needs an alias
    header, body = publish_packet(b"topic", 1, 7, b"\x00", b"")
    for cut in range(len(body)):  # truncated anywhere: paho raises its MalformedPacket
        assert plain_publish(header, body[:cut]) is None


@pytest.mark.parametrize("qos", [0, 1])  # the link subscribes at QoS 1: the broker sends nothing at QoS 2
def test_the_link_receives_publishes_with_and_without_properties(tmp_path, monkeypatch, qos):
    decoded_here = []

    def counting(header, packet):
        found = plain_publish(header, packet)
        decoded_here.append(found is not None)
        return found

    monkeypatch.setattr(paho_client, "plain_publish", counting)
    got: list[tuple[str, bytes]] = []
    with running_broker(tmp_path) as broker:
        link = MqttLink(LinkSettings(url=broker.url, client_id="receiver", mqtt_version="5"), subscriptions=["in/#"],
                        on_message=lambda topic, payload: got.append((topic, payload)))
        sender = paho.Client(CallbackAPIVersion.VERSION2, client_id="sender", protocol=paho.MQTTv5)
        with link:
            assert wait_until(lambda: link.status.connected, 10)
            time.sleep(0.3)  # the SUBACK
            sender.connect("127.0.0.1", broker.port)
            sender.loop_start()
            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType = "application/json"
            sender.publish("in/plain", b"one", qos=qos).wait_for_publish(5)
            sender.publish("in/with-properties", b"two", qos=qos, properties=properties).wait_for_publish(5)
            assert wait_until(lambda: len(got) == 2, 10)
            sender.disconnect()
            sender.loop_stop()
    assert got == [("in/plain", b"one"), ("in/with-properties", b"two")]
    assert decoded_here == [True, False]  # the first decoded here, the second by paho
