"""The MQTT link: one paho client, one thread, three parts.

:class:`MqttLink` owns one paho client and one named daemon thread, ``edgeinfer-mqtt``, that does
everything with it — connect, network loop, publish — so no paho call races another. The link
itself runs the connection:

- connects over TCP or TLS (``mqtts://``, CA / client certificate / key), with username/password;
- keeps a persistent session (MQTT 5: ``clean_start=False`` + a session expiry interval; MQTT
  3.1.1: ``clean_session=False``) under a stable client id, so commands queued for the device while
  it was away are delivered when it comes back; ``mqtt_version="auto"`` uses MQTT 5 and falls back
  to 3.1.1 when a broker does not speak 5;
- reconnects with exponential backoff and jitter, resetting the backoff only after a connection
  that lasted (a flapping link must not hammer the broker);
- sets a Last Will.

and wires in the two things it publishes:

- :class:`~edgeinfer.link.retained.RetainedMessages`: "latest value" retained messages (the
  device's ``state`` birth), re-published at every connect;
- :class:`~edgeinfer.link.outbox.Outbox`: drains a :class:`~edgeinfer.link.spool.Spool` oldest
  first at QoS 1 with a bounded in-flight window, deletes a row only on its PUBACK, and drops
  poison messages.

paho is imported when a link is created, never at ``import edgeinfer``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ClosedError
from ..util.backoff import EQUAL_JITTER, Backoff
from . import paho_client
from .inbox import DeliveryCallback, Inbox, network_round
from .outbox import Outbox
from .retained import RetainedMessages
from .settings import LinkSettings, describe_connect_error, describe_refusal, tls_context
from .spool import Spool
from .status import LinkStatus

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

#: a connection must last this long before the reconnect backoff starts again from the minimum (and
#: before a message in flight when it dies is no longer suspected of killing it)
STABLE_CONNECTION_S = 10.0

MessageCallback = Callable[[str, bytes], None]


class ReconnectSchedule:
    """When the next connection attempt is due: exponential backoff with equal jitter over the attempts in a row."""

    def __init__(self, settings: LinkSettings) -> None:
        self._backoff = Backoff(initial_s=settings.reconnect_min_s, max_s=settings.reconnect_max_s,
                                jitter=EQUAL_JITTER)
        self._rng = random.Random()
        #: failed attempts and lost connections since the last connection that lasted
        self.attempt = 0
        #: monotonic time the next attempt is due
        self.due = 0.0

    def back_off(self) -> float:
        """Make the next attempt due after the current attempt's delay; return the delay."""
        delay = self._backoff.delay(self.attempt, self._rng)
        self.due = time.monotonic() + delay
        return delay


class MqttLink:
    """A persistent, self-healing MQTT connection that drains a spool. One thread; close() is idempotent."""

    def __init__(self, settings: LinkSettings, *, spool: Spool | None = None,
                 will: tuple[str, bytes] | None = None, subscriptions: Sequence[str] = (),
                 on_message: MessageCallback | None = None, on_connected: Callable[[float | None], None] | None = None,
                 on_delivery: DeliveryCallback | None = None,
                 tls: ssl.SSLContext | None = None, name: str = "edgeinfer-mqtt") -> None:
        paho_client.require_paho()
        if (on_delivery is not None) != settings.manual_ack:
            raise ValueError("on_delivery (acknowledge when stored) goes with LinkSettings(manual_ack=True)")
        self.settings = settings
        self.broker = settings.broker
        self._will = will
        self._subscriptions = tuple(subscriptions)
        self._on_message = on_message
        self._on_connected = on_connected
        self._tls = tls if tls is not None else (
            tls_context(settings.ca, settings.cert, settings.key) if self.broker.tls else None)
        self._username = settings.username or self.broker.username
        self._password = settings.password or self.broker.password
        self._name = name
        self.status = LinkStatus()
        self._outbox = Outbox(spool, self.status, window=settings.inflight_window)
        self._retained = RetainedMessages(self.status)
        self._wake = threading.Event()
        self._inbox = Inbox(on_delivery, self._wake.set) if on_delivery is not None else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._started = False
        self._drain_deadline = 0.0
        # connection state, touched only by the link thread
        self._client: Any = None
        self._protocol = "5" if settings.mqtt_version in ("auto", "5") else "3.1.1"
        self._ever_connected = False
        self._connecting_since: float | None = None
        self._reconnect = ReconnectSchedule(settings)
        self._refused: str | None = None
        self._socket_errors = paho_client.SocketErrors()  # why paho lost a socket (its return code does not say)
        self._refused_protocol = False

    # ------------------------------------------------------------------------------ public API
    def start(self) -> MqttLink:
        """Start the link thread (it connects, and keeps reconnecting, on its own)."""
        with self._lock:
            if self._closed:
                raise ClosedError("the MQTT link is closed — create a new one")
            if self._started:
                return self
            self._started = True
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def set_retained(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` retained at QoS 1 now if connected, and again after every reconnect."""
        self._retained.set(topic, payload)
        self._wake.set()

    def notify(self) -> None:
        """Tell the link that the spool has new rows (it also polls)."""
        self._wake.set()

    @property
    def connected(self) -> bool:
        """True while a connection is up."""
        return self.status.connected

    def wait_connected(self, timeout: float) -> bool:
        """Block until connected, or ``timeout`` seconds pass; True if connected."""
        deadline = time.monotonic() + timeout
        while not self.status.connected and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.02)
        return self.status.connected

    def idle(self) -> bool:
        """True when nothing waits to be published or acknowledged."""
        return self._retained.idle() and self._outbox.idle()

    def stop(self, drain_timeout: float = 2.0) -> None:
        """Let what is in flight be acknowledged (up to ``drain_timeout`` s), disconnect (no Last Will), join."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.set()
            return
        self._drain_deadline = time.monotonic() + drain_timeout
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=drain_timeout + self.settings.connect_timeout_s + 5)
        if self._thread.is_alive():
            log.warning("MQTT thread did not stop in time; abandoning it (daemon thread)")

    def close(self) -> None:
        """Stop (with a short drain) and release the client and the inbox's wake-up sockets. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop()
        if self._inbox is not None:
            self._inbox.close()

    def __enter__(self) -> MqttLink:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._step()
                except Exception as exc:  # the link must outlive any surprise (a packet paho cannot decode)
                    log.exception("MQTT link error; reconnecting")
                    self._lost(f"internal error: {type(exc).__name__}: {exc}")
            self._shutdown()
        finally:
            self.status.connected = False

    def _step(self) -> None:
        now = time.monotonic()
        if self._client is None or (not self.status.connected and self._connecting_since is None):
            if now < self._reconnect.due:
                self._wake.wait(min(self._reconnect.due - now, 0.5))
                self._wake.clear()
                return
            self._connect()
            return
        rc = network_round(self._client, self.status, self._inbox)
        if rc != 0:
            self._lost(self._refused or self._socket_errors.lost(rc))  # why: an SSL alert (a revoked certificate)
            return
        if not self.status.connected:
            if self._connecting_since is not None and now - self._connecting_since > self.settings.connect_timeout_s:
                # A 3.1.1-only broker (older appliances) may take an MQTT 5 CONNECT and never
                # answer it: with mqtt_version auto, that silence counts as a refusal of version 5.
                self._lost(f"no CONNACK from {self.broker.host}:{self.broker.port} within "
                           f"{self.settings.connect_timeout_s:g} s", answered=self._protocol == "5")
            return
        self._pump()

    def _pump(self) -> None:
        self._retained.pump(self._client)
        self._outbox.pump(self._client)
        if self._inbox is not None:
            self._inbox.pump(self._client)

    def _shutdown(self) -> None:
        client = self._client
        if client is None:
            return
        if self.status.connected:
            deadline = self._drain_deadline or time.monotonic()
            while time.monotonic() < deadline:
                self._pump()  # the last window and events, if the broker takes them in time
                if self.idle():
                    break
                if paho_client.loop_once(client, 0.05) != 0:
                    break
            try:
                client.disconnect()
                paho_client.loop_once(client, 0.1)
            except Exception:  # pragma: no cover - best effort on the way out
                pass
        self.status.connected = False
        self._client = None

    # ------------------------------------------------------------------------------ the connection
    def _new_client(self) -> Any:
        client = paho_client.new_client(self.settings, self._protocol, username=self._username, password=self._password,
                                        tls=self._tls, will=self._will, errors=self._socket_errors)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_publish = self._handle_publish
        client.on_message = self._handle_message
        return client

    def _connect(self) -> None:
        if self._client is None:
            self._client = self._new_client()
        self._refused = None
        try:
            paho_client.connect(self._client, self.broker, self.settings, self._protocol)
        except (OSError, ValueError) as exc:
            self._failed(describe_connect_error(exc, self.broker), answered=False)
            return
        self._connecting_since = time.monotonic()

    def _failed(self, reason: str, *, answered: bool) -> None:
        """An attempt failed: schedule the next one with backoff and jitter.

        ``answered``: the broker answered the CONNECT (refused it, or hung up before a CONNACK).
        """
        self._connecting_since = None
        self.status.failed_attempts += 1
        self.status.last_error = reason
        self._reconnect.attempt += 1
        if self.settings.mqtt_version == "auto" and not self._ever_connected and answered:
            # The broker answered but did not accept us. A broker that does not speak MQTT 5 refuses
            # the protocol level or just hangs up, so try the other version next (paho fixes the
            # protocol per client object; nothing has been published through it yet).
            self._protocol = "3.1.1" if self._protocol == "5" else "5"
            self._discard_client()
            if self._refused_protocol:
                log.info("broker %s does not accept this MQTT version; trying MQTT %s", self.broker, self._protocol)
                self._reconnect.due = time.monotonic()
                return
        delay = self._reconnect.back_off()
        level = logging.ERROR if self._refused else logging.WARNING
        log.log(level, "MQTT: %s; retrying in %.1f s (attempt %d)", reason, delay, self._reconnect.attempt)

    def _lost(self, reason: str, *, answered: bool = True) -> None:
        """The connection died (or an attempt did, before its CONNACK): schedule the next attempt."""
        was_connected = self.status.connected
        since = self.status.connected_since
        self._drop_connection(reason)
        if not was_connected:
            self._failed(reason, answered=answered)
            return
        self.status.disconnects += 1
        self.status.lost_since = time.monotonic()
        lasted = time.monotonic() - since if since else 0.0
        if lasted >= STABLE_CONNECTION_S:
            self._reconnect.attempt = 0
        log.warning("MQTT: disconnected from %s: %s", self.broker, reason)
        if self._outbox.connection_lost(short_lived=lasted < STABLE_CONNECTION_S):
            self._discard_client()
        self._reconnect.attempt += 1
        self._reconnect.back_off()
        self.status.last_error = reason

    def _drop_connection(self, reason: str) -> None:
        self.status.connected = False
        self.status.connected_since = None
        self._connecting_since = None
        # paho closes the old socket itself at the next connect(). It keeps unacknowledged QoS 1
        # messages (with their mids) and resends them after the next CONNACK, so their rows stay in
        # flight here; the retained state is re-published at every connect.
        self._retained.connection_dropped()

    def _discard_client(self) -> None:
        """Forget the paho client and everything it held in memory; the spool still has the rows."""
        self._client = None
        self._outbox.forget_client()
        self._retained.forget_client()

    # ------------------------------------------------------------------------------ paho callbacks
    def _handle_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            # remembered; the network loop reports it when paho hangs up
            self._refused_protocol = "protocol" in reason.getName().lower()
            self._refused = describe_refusal(reason.getName(), self.broker)
            return
        self._refused_protocol = False
        self._connecting_since = None
        self._ever_connected = True
        self.status.connected = True
        self.status.connected_since = time.monotonic()
        self.status.connects += 1
        self.status.protocol = "5" if self._protocol == "5" else "3.1.1"
        self.status.session_present = bool(flags.session_present)
        self._outbox.connected(getattr(properties, "MaximumPacketSize", None) if properties is not None else None)
        self.status.last_error = None
        log.info("MQTT: connected to %s (MQTT %s, session present: %s)", self.broker, self.status.protocol,
                 flags.session_present)
        if self._inbox is not None:
            self._inbox.connected()
        for topic in self._subscriptions:
            client.subscribe(topic, qos=1)
        offline_s = time.monotonic() - self.status.lost_since if self.status.lost_since is not None else None
        self.status.lost_since = None
        if self._on_connected is not None:
            try:
                self._on_connected(offline_s)
            except Exception:
                log.exception("on_connected callback failed")

    def _handle_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason is not None and getattr(reason, "is_failure", False) and not self._refused:
            self.status.last_error = f"disconnected by broker: {reason.getName()}"

    def _handle_publish(self, client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        # called inside paho's out-message lock: record the ack, never call back into paho here
        if not self._outbox.acknowledged(mid, reason):
            self._retained.acknowledged(mid, reason)

    def _handle_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.status.received += 1
        if self._inbox is not None:
            self._inbox.deliver(message)
            return
        if self._on_message is None:
            return
        try:
            self._on_message(message.topic, bytes(message.payload))
        except Exception:
            log.exception("message handler failed for a message on %s", getattr(message, "_topic", b"?"))
