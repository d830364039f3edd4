"""The buffered socket under paho: whole packets from one recv(), nothing held back from select()."""

from __future__ import annotations

import socket

import pytest
from support.broker import running_broker
from support.processes import wait_until

from edgeinfer.link.mqtt import MqttLink
from edgeinfer.link.paho_client import BufferedSocket
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


def test_the_link_reads_through_the_buffer(tmp_path):
    """paho 2 calls the ``_create_socket`` we override: a paho that stops doing so fails here, not silently."""
    with running_broker(tmp_path) as broker, MqttLink(LinkSettings(url=broker.url, client_id="buffered")) as link:
        assert wait_until(lambda: link.status.connected, 10)
        assert isinstance(link._client.socket(), BufferedSocket)
