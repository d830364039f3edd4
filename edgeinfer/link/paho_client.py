"""What edgeinfer asks of paho-mqtt (>= 2, callback API version 2): the import check, a configured
client, and the CONNECT with the session settings.

paho is imported here on first use, never at ``import edgeinfer``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependency
from ..util.optional import import_optional
from .settings import BrokerURL, LinkSettings

if TYPE_CHECKING:
    import ssl

#: paho MQTTErrorCode.MQTT_ERR_QUEUE_SIZE: the only publish() result after which paho does NOT keep a
#: QoS 1 message (for any other, e.g. NO_CONN or CONN_LOST, it resends it after the next CONNACK)
QUEUE_SIZE = 15
#: paho's in-flight limit above our window: room for the retained state messages
_RETAINED_ROOM = 8


def require_paho() -> None:
    """MissingDependency with the install hint when paho-mqtt (>= 2) is missing or too old."""
    paho_mqtt = import_optional("paho.mqtt", "fleet", "MQTT")
    major = str(getattr(paho_mqtt, "__version__", "0")).split(".")[0]
    if not major.isdigit() or int(major) < 2:
        raise MissingDependency(f"paho-mqtt {paho_mqtt.__version__} is too old; edgeinfer needs >= 2: "
                                "pip install -U 'paho-mqtt>=2'")


class BufferedSocket:
    """paho's socket, read 64 KiB at a time, and written in one piece while corked.

    paho reads each packet as its first byte, then its length byte by byte, then the rest: three or
    more ``recv()`` calls a message, a quarter of the fleet manager's receive cost, measured.
    ``pending()`` is paho's own hook (made for TLS, which buffers too): while it is non-zero paho
    reads on instead of waiting in ``select()``. And paho sends each packet with its own ``send()``:
    a thousand acknowledgements, a thousand system calls. Between :meth:`cork` and :meth:`uncork`
    what paho sends is collected and then sent at once; what the socket does not take then stays
    in order before anything sent later, and goes out when the socket is writable again
    (:meth:`unsent`, :meth:`flush`)."""

    __slots__ = ("_buffer", "_corked", "_inner_pending", "_pos", "_sock", "_unsent")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._inner_pending = getattr(sock, "pending", None)  # a TLS socket's own buffer
        self._buffer = b""
        self._pos = 0
        self._corked = False
        self._unsent = bytearray()

    def recv(self, size: int) -> bytes:
        if self._pos < len(self._buffer):
            chunk = self._buffer[self._pos:self._pos + size]
            self._pos += len(chunk)
            return chunk
        data = self._sock.recv(max(size, 65536))  # BlockingIOError and TLS's want-read pass through to paho
        if len(data) <= size:
            return data
        self._buffer, self._pos = data, size
        return data[:size]

    def pending(self) -> int:
        inner = self._inner_pending() if self._inner_pending is not None else 0
        return len(self._buffer) - self._pos + inner

    def send(self, data: bytes | bytearray) -> int:
        if not self._corked and not self._unsent:
            return self._sock.send(data)
        self._unsent += data  # taken: paho goes on as after a whole send
        if not self._corked:
            self.flush()
        return len(data)

    def cork(self) -> None:
        self._corked = True

    def uncork(self) -> None:
        self._corked = False
        self.flush()

    def unsent(self) -> int:
        return len(self._unsent)

    def flush(self) -> None:
        """Send what was held back, as much as the socket takes now. A broken connection is not reported
        here: the next read finds it, and the link reconnects (what was held back is resent by the
        broker's and paho's session rules, as for anything lost in a socket buffer)."""
        while self._unsent:
            try:
                sent = self._sock.send(self._unsent)
            except OSError:  # BlockingIOError, TLS's want-write/want-read (ssl.SSLError is an OSError), a broken pipe
                return
            del self._unsent[:sent]

    def __getattr__(self, name: str) -> Any:  # fileno, close, setblocking, ...
        return getattr(self._sock, name)


@contextlib.contextmanager
def corked(client: Any) -> Iterator[None]:
    """What ``client`` sends inside the block leaves in one system call (when its socket is ours)."""
    sock = client.socket()
    if not isinstance(sock, BufferedSocket):
        yield
        return
    sock.cork()
    try:
        yield
    finally:
        sock.uncork()


def plain_publish(header: int, packet: bytes | bytearray) -> tuple[bytes, int, bytes] | None:
    """``(topic, packet id, payload)`` of an MQTT 5 PUBLISH at QoS 0 or 1 that carries no properties — what
    every device sends — or None for any other (paho decodes those). ``header``: the fixed header's first
    byte; ``packet``: the rest after the remaining length."""
    qos = (header >> 1) & 0x03
    if qos > 1 or len(packet) < 2:
        return None
    end = 2 + ((packet[0] << 8) | packet[1])
    mid = 0
    if qos:
        if len(packet) < end + 2:
            return None
        mid = (packet[end] << 8) | packet[end + 1]
        at = end + 2
    else:
        at = end
    if end == 2 or len(packet) <= at or packet[at] != 0:  # an empty topic needs an alias, a property
        return None
    return bytes(packet[2:end]), mid, bytes(packet[at + 1:])


@functools.cache
def _client_class() -> type:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import MQTTErrorCode

    class Client(paho.Client):
        """paho's client on a :class:`BufferedSocket` (``_create_socket`` is paho 2's socket factory), with
        the PUBLISH without properties decoded here: paho builds and clears a ``Properties`` object for every
        MQTT 5 PUBLISH, properties or not — 11 µs a message, a third of the fleet manager's receive cost,
        measured. ``_handle_publish`` and ``_in_packet`` are paho 2's (the ``fleet`` extra pins paho < 3);
        everything else, QoS 2 included, still goes to paho."""

        def _create_socket(self) -> Any:
            return BufferedSocket(super()._create_socket())

        # paho's own _sock_recv/_sock_send name ssl's exceptions in their except clauses, which loads ssl
        # at the first empty read; without TLS these are the same without them (edgeinfer/util/defer.py)
        def _sock_recv(self, bufsize: int) -> bytes:
            if self._ssl:
                return super()._sock_recv(bufsize)
            sock = self._sock
            if sock is None:
                raise ConnectionError("self._sock is None")
            return sock.recv(bufsize)

        def _sock_send(self, buf: bytes | bytearray) -> int:
            if self._ssl:
                return super()._sock_send(buf)
            sock = self._sock
            if sock is None:
                raise ConnectionError("self._sock is None")
            try:
                return sock.send(buf)
            except BlockingIOError:
                self._call_socket_register_write()
                raise

        def _get_proxy(self) -> dict[str, Any] | None:
            # paho asks PySocks and urllib.request for a proxy on every connect: only an ``mqtt_proxy``
            # environment variable can name one for the agent (it never calls proxy_set)
            if not any(name.lower() == "mqtt_proxy" for name in os.environ):
                return None
            return super()._get_proxy()

        def _handle_publish(self) -> Any:
            header = self._in_packet["command"]
            plain = plain_publish(header, self._in_packet["packet"]) if self._protocol == paho.MQTTv5 else None
            if plain is None:
                return super()._handle_publish()
            topic, mid, payload = plain
            # paho's __init__ would also give it an MQTTMessageInfo with a threading.Condition, which only
            # an outgoing message uses: every slot is set here instead (.properties None: there are none)
            message = paho.MQTTMessage.__new__(paho.MQTTMessage)
            message.timestamp, message.state = paho.time_func(), paho.mqtt_ms_invalid
            message.info = message.properties = None
            message.mid, message._topic, message.payload = mid, topic, payload
            message.dup, message.qos, message.retain = bool(header & 0x08), (header >> 1) & 0x03, bool(header & 0x01)
            self._handle_on_message(message)
            if message.qos and not self._manual_ack:
                return self._send_puback(mid)
            return MQTTErrorCode.MQTT_ERR_SUCCESS

    return Client


class SocketErrors:
    """paho's logger (``enable_logger``) that keeps the last error paho says and nothing else: why a socket died
    — an SSL alert from the broker (``certificate revoked``), a reset — which paho's return code does not say
    (``The connection was lost.``). Its other messages (one a packet) are dropped at once."""

    ERROR = 40  # logging.ERROR: paho's MQTT_LOG_ERR

    def __init__(self) -> None:
        self.last: str | None = None

    def log(self, level: int, message: str, *args: Any) -> None:
        if level >= self.ERROR:
            self.last = message % args if args else message

    def lost(self, rc: int) -> str:
        """Why the connection was lost (paho's return code ``rc``, and the error it said since the last call)."""
        said, why, self.last = error_string(rc), self.last, None
        return f"connection lost ({said.rstrip('.') + ': ' + why if why else said})"


def new_client(settings: LinkSettings, protocol: str, *, username: str | None, password: str | None,
               tls: ssl.SSLContext | None, will: tuple[str, bytes] | None,
               errors: SocketErrors | None = None) -> Any:
    """A paho client for MQTT ``protocol`` ("5" or "3.1.1") with a persistent session; it never reconnects
    by itself (the link does, with its own backoff)."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client_class = _client_class()
    if protocol == "5":
        client = client_class(CallbackAPIVersion.VERSION2, client_id=settings.client_id,
                              protocol=paho.MQTTv5, reconnect_on_failure=False, manual_ack=settings.manual_ack)
    else:
        client = client_class(CallbackAPIVersion.VERSION2, client_id=settings.client_id, clean_session=False,
                              protocol=paho.MQTTv311, reconnect_on_failure=False, manual_ack=settings.manual_ack)
    client.connect_timeout = settings.connect_timeout_s
    # our window bounds what is in flight; leave paho room for the retained state messages
    client.max_inflight_messages_set(settings.inflight_window + _RETAINED_ROOM)
    client.max_queued_messages_set(0)
    if username:
        client.username_pw_set(username, password)
    if tls is not None:
        client.tls_set_context(tls)
    if will is not None:
        client.will_set(will[0], will[1], qos=1, retain=True)
    if errors is not None:
        client.enable_logger(errors)
    return client


def connect(client: Any, broker: BrokerURL, settings: LinkSettings, protocol: str) -> None:
    """Send CONNECT (MQTT 5: ``clean_start=False``, a session expiry interval and any Receive Maximum);
    OSError / ValueError when the socket cannot be opened."""
    if protocol == "5":
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = settings.session_expiry_s
        if settings.receive_maximum is not None:
            props.ReceiveMaximum = settings.receive_maximum
        client.connect(broker.host, broker.port, keepalive=settings.keepalive_s, clean_start=False,
                       properties=props)
    else:
        client.connect(broker.host, broker.port, keepalive=settings.keepalive_s)


def loop_once(client: Any, timeout: float, *, wake: int | None = None, woken: Callable[[], None] | None = None) -> int:
    """One round of paho's network loop — select(), read, write, keepalive — as paho's ``loop()`` does it,
    through paho's API for callers that select() themselves, but without ``loop()``'s wake-up socket pair:
    every paho call is made on the link's own thread, so the byte paho writes to that pair for each
    packet it queues (each acknowledgement) would only cost a system call. ``wake``: a file descriptor
    that another thread makes readable to end the wait (then ``woken()`` is called: it empties it)."""
    from paho.mqtt.enums import MQTTErrorCode

    sock = client.socket()
    if sock is None:
        return MQTTErrorCode.MQTT_ERR_NO_CONN
    pending = sock.pending()  # bytes paho has not read yet from our buffer (or TLS's): do not wait
    unsent = sock.unsent()  # what a corked send left for when the socket is writable
    try:
        readable, writable, _ = select.select([sock] if wake is None else [sock, wake],
                                              [sock] if unsent or client.want_write() else [], [],
                                              0.0 if pending else timeout)
    except (OSError, ValueError, TypeError):  # closed under us
        return MQTTErrorCode.MQTT_ERR_CONN_LOST
    if wake is not None and wake in readable:
        readable.remove(wake)
        if woken is not None:
            woken()
    if readable or pending:
        rc = client.loop_read()
        if rc or client.socket() is None:
            return rc
    if writable:
        if unsent:
            sock.flush()
        rc = client.loop_write()
        if rc or client.socket() is None:
            return rc
    return client.loop_misc()


def error_string(rc: int) -> str:
    """paho's words for a network-loop result code."""
    import paho.mqtt.client as paho

    return paho.error_string(rc)
