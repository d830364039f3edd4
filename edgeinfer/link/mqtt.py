"""The one place that talks to paho-mqtt (>= 2, callback API version 2).

:class:`MqttLink` owns one paho client and one named daemon thread, ``edgeinfer-mqtt``, that does
everything with it — connect, network loop, publish — so no paho call races another:

- connects over TCP or TLS (``mqtts://``, CA / client certificate / key), with username/password;
- keeps a persistent session (MQTT 5: ``clean_start=False`` + a session expiry interval; MQTT
  3.1.1: ``clean_session=False``) under a stable client id, so commands queued for the device while
  it was away are delivered when it comes back; ``mqtt_version="auto"`` uses MQTT 5 and falls back
  to 3.1.1 when a broker does not speak 5;
- reconnects with exponential backoff and jitter, resetting the backoff only after a connection
  that lasted (a flapping link must not hammer the broker);
- sets a Last Will and publishes "latest value" retained messages (the device's ``state`` birth)
  at every connect;
- drains a :class:`~edgeinfer.spool.Spool` oldest first at QoS 1 with a bounded in-flight window,
  and deletes a row only when the PUBACK for that packet's mid arrives (paho's own queue is in
  memory; the spool is what survives a crash).

paho is imported when a link is created, never at ``import edgeinfer``.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError, EdgeInferError
from .spool import Spool

log = logging.getLogger(__name__)

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
DEFAULT_KEEPALIVE_S = 30
DEFAULT_SESSION_EXPIRY_S = 7 * 24 * 3600
DEFAULT_RECONNECT_MIN_S = 0.5
DEFAULT_RECONNECT_MAX_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_INFLIGHT_WINDOW = 20
#: a connection must last this long before the reconnect backoff starts again from the minimum
STABLE_CONNECTION_S = 10.0
#: a spooled message is dropped as poison when the connection dies this many times in a row, each
#: time within STABLE_CONNECTION_S and with that message the oldest unacknowledged one (from the
#: second time on it is sent alone, so nothing else can be to blame)
POISON_STRIKES = 3
#: PUBLISH overhead besides topic and payload: fixed header, remaining length, topic length, packet
#: id, property length (an upper bound, for checking against the broker's Maximum Packet Size)
_PUBLISH_OVERHEAD = 12
MQTT_VERSIONS = ("auto", "5", "3.1.1")
_LOOP_TIMEOUT_S = 0.1
#: paho MQTTErrorCode.MQTT_ERR_QUEUE_SIZE: the only publish() result after which paho does NOT keep a
#: QoS 1 message (for any other, e.g. NO_CONN or CONN_LOST, it resends it after the next CONNACK)
_QUEUE_SIZE = 15


@dataclass(frozen=True)
class BrokerURL:
    """A parsed ``mqtt://host[:port]`` or ``mqtts://host[:port]`` URL."""

    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker_url(url: str) -> BrokerURL:
    """Parse a broker URL; ValueError that says what a good one looks like."""
    hint = "use mqtt://HOST[:PORT] or mqtts://HOST[:PORT]"
    if not isinstance(url, str) or not url:
        raise ValueError(f"broker URL is empty; {hint}")
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"broker URL {url!r} has scheme {parts.scheme or '(none)'!r}; {hint}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"broker URL {url!r} must not have a path or query; {hint}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"broker URL {url!r} has an invalid port; {hint}") from exc
    if not parts.hostname:
        raise ValueError(f"broker URL {url!r} has no host; {hint}")
    tls = parts.scheme == "mqtts"
    return BrokerURL(host=parts.hostname, port=port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT), tls=tls,
                     username=unquote(parts.username) if parts.username else None,
                     password=unquote(parts.password) if parts.password else None)


def _pem_kinds(path: Path, key: str) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"{key}: file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path} is a directory, not a PEM file") from None
    except PermissionError:
        raise ConfigError(f"{key}: cannot read {path} (permission denied) — the agent's user needs read access") \
            from None
    return text


def tls_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the broker (``ca``, or the system's CAs) and may present a cert.

    Raises ConfigError naming the key (``ca``, ``cert``, ``key``) that is missing, unreadable, not PEM,
    or (cert/key) that do not belong together.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        if "-----BEGIN CERTIFICATE-----" not in _pem_kinds(Path(ca), "ca"):
            raise ConfigError(f"ca: {ca} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as exc:
            raise ConfigError(f"ca: {ca} is not a valid PEM CA certificate ({exc.reason or exc})") from exc
    if bool(cert) != bool(key):
        missing, given = ("key", "cert") if cert else ("cert", "key")
        raise ConfigError(f"{missing}: required when {given} is given (a client certificate needs its private key)")
    if cert and key:
        if "-----BEGIN CERTIFICATE-----" not in _pem_kinds(Path(cert), "cert"):
            raise ConfigError(f"cert: {cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        key_text = _pem_kinds(Path(key), "key")
        if "PRIVATE KEY-----" not in key_text:
            raise ConfigError(f"key: {key} holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)")
        if "ENCRYPTED" in key_text:
            raise ConfigError(f"key: {key} is encrypted; the agent needs an unencrypted key readable only by its user")

        def no_password() -> bytes:
            raise ConfigError(f"key: {key} is encrypted; the agent needs an unencrypted key")

        try:
            context.load_cert_chain(cert, key, password=no_password)
        except ssl.SSLError as exc:
            reason = str(exc.reason or exc)
            if "MISMATCH" in reason.upper():
                raise ConfigError(f"cert/key: the private key {key} does not belong to the certificate {cert}") \
                    from exc
            raise ConfigError(f"cert/key: cannot load {cert} with {key} ({reason})") from exc
    return context


@dataclass(frozen=True, kw_only=True)
class LinkSettings:
    """How to reach the broker. Frozen; validated on construction."""

    url: str
    client_id: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    mqtt_version: str = "auto"
    keepalive_s: int = DEFAULT_KEEPALIVE_S
    session_expiry_s: int = DEFAULT_SESSION_EXPIRY_S
    reconnect_min_s: float = DEFAULT_RECONNECT_MIN_S
    reconnect_max_s: float = DEFAULT_RECONNECT_MAX_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    inflight_window: int = DEFAULT_INFLIGHT_WINDOW

    def __post_init__(self) -> None:
        broker = parse_broker_url(self.url)
        if (self.ca or self.cert or self.key) and not broker.tls:
            raise ValueError(f"ca/cert/key are set but the broker URL {self.url!r} is not mqtts://")
        if self.mqtt_version not in MQTT_VERSIONS:
            raise ValueError(f"mqtt_version must be one of {', '.join(MQTT_VERSIONS)}, got {self.mqtt_version!r}")
        if not self.client_id or len(self.client_id) > 128:
            raise ValueError("client_id must be 1-128 characters")
        if not 5 <= self.keepalive_s <= 65535:
            raise ValueError(f"keepalive_s must be within 5..65535, got {self.keepalive_s}")
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            raise ValueError("reconnect delays must satisfy 0 < reconnect_min_s <= reconnect_max_s")
        if not 1 <= self.inflight_window <= 1000:
            raise ValueError(f"inflight_window must be within 1..1000, got {self.inflight_window}")
        if self.connect_timeout_s <= 0 or self.session_expiry_s < 0:
            raise ValueError("connect_timeout_s must be > 0 and session_expiry_s >= 0")

    @property
    def broker(self) -> BrokerURL:
        return parse_broker_url(self.url)


def backoff_delay(attempt: int, minimum: float, maximum: float, rng: random.Random | None = None) -> float:
    """Delay before reconnect attempt ``attempt`` (1-based): exponential, capped, with "equal jitter".

    Half of the capped exponential delay is fixed, half random, so a fleet that lost its broker at
    the same instant does not come back in lockstep, yet each device still backs off.
    """
    base = min(maximum, minimum * (2 ** max(0, attempt - 1)))
    return base / 2 + (rng or random).uniform(0, base / 2)


def describe_connect_error(exc: BaseException, broker: BrokerURL) -> str:
    """A sentence a person can act on for a failed connection attempt."""
    where = f"{broker.host}:{broker.port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"TLS verification of {where} failed: {exc.verify_message or exc} — check `ca` and that the broker's "
                "certificate names this host")
    if isinstance(exc, ssl.SSLError):
        return (f"TLS handshake with {where} failed: {exc.reason or exc} — check ca/cert/key and the broker's "
                "TLS listener")
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {where} refused — is the broker running and listening there?"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve broker host {broker.host!r} ({exc.strerror})"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer from {where} (timed out)"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return f"cannot connect to {where}: {exc}"


@dataclass
class LinkStatus:
    """Counters and the last error, for telemetry and /metrics."""

    connected: bool = False
    protocol: str = ""
    connects: int = 0
    disconnects: int = 0
    failed_attempts: int = 0
    published: int = 0
    acked: int = 0
    rejected: int = 0
    received: int = 0
    last_error: str | None = None
    connected_since: float | None = None
    session_present: bool | None = None
    #: monotonic time the last connection was lost (None while connected or before the first)
    lost_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"connected": self.connected, "protocol": self.protocol, "connects": self.connects,
                "disconnects": self.disconnects, "failed_attempts": self.failed_attempts,
                "published": self.published, "acked": self.acked, "rejected": self.rejected,
                "received": self.received, "last_error": self.last_error}


MessageCallback = Callable[[str, bytes], None]


def _require_paho() -> None:
    """EdgeInferError with the install hint when paho-mqtt (>= 2) is missing."""
    try:
        import paho.mqtt
    except ImportError as exc:
        raise EdgeInferError("MQTT needs paho-mqtt >= 2: pip install 'edgeinfer[fleet]'") from exc
    major = str(getattr(paho.mqtt, "__version__", "0")).split(".")[0]
    if not major.isdigit() or int(major) < 2:
        raise EdgeInferError(f"paho-mqtt {paho.mqtt.__version__} is too old; edgeinfer needs >= 2: "
                             "pip install -U 'paho-mqtt>=2'")


class MqttLink:
    """A persistent, self-healing MQTT connection that drains a spool. One thread; close() is idempotent."""

    def __init__(self, settings: LinkSettings, *, spool: Spool | None = None,
                 will: tuple[str, bytes] | None = None, subscriptions: Sequence[str] = (),
                 on_message: MessageCallback | None = None,
                 on_connected: Callable[[float | None], None] | None = None,
                 tls: ssl.SSLContext | None = None, name: str = "edgeinfer-mqtt") -> None:
        _require_paho()
        self.settings = settings
        self.broker = settings.broker
        self._spool = spool
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
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._started = False
        # connection state, touched only by the link thread
        self._client: Any = None
        self._protocol = "5" if settings.mqtt_version in ("auto", "5") else "3.1.1"
        self._ever_connected = False
        self._connecting_since: float | None = None
        self._attempt = 0
        self._next_attempt = 0.0
        self._inflight: dict[int, int] = {}       # paho mid -> spool row id
        self._direct_inflight: set[int] = set()   # mids of retained/direct messages
        self._cursor = 0                          # highest spool id handed to paho
        self._refused: str | None = None
        self._max_packet: int | None = None       # the broker's Maximum Packet Size (MQTT 5 CONNACK)
        self._suspect: tuple[int, int] | None = None  # (spool row, strikes): a message that may kill connections
        # "latest value" retained messages (the state birth): topic -> (payload, version)
        self._retained: dict[str, tuple[bytes, int]] = {}
        self._retained_sent: dict[str, int] = {}
        self._version = 0

    # ------------------------------------------------------------------------------ public API
    def start(self) -> MqttLink:
        """Start the link thread (it connects, and keeps reconnecting, on its own)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("MqttLink is closed")
            if self._started:
                return self
            self._started = True
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def set_retained(self, topic: str, payload: bytes) -> None:
        """Publish ``payload`` retained at QoS 1 now if connected, and again after every reconnect."""
        with self._lock:
            self._version += 1
            self._retained[topic] = (bytes(payload), self._version)
        self._wake.set()

    def notify(self) -> None:
        """Tell the link that the spool has new rows (it also polls)."""
        self._wake.set()

    @property
    def connected(self) -> bool:
        return self.status.connected

    def wait_connected(self, timeout: float) -> bool:
        """Block until connected, or ``timeout`` seconds pass; True if connected."""
        deadline = time.monotonic() + timeout
        while not self.status.connected and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.02)
        return self.status.connected

    def idle(self) -> bool:
        """True when nothing waits to be published or acknowledged."""
        with self._lock:
            retained_done = all(self._retained_sent.get(t) == v for t, (_p, v) in self._retained.items())
        spool_done = self._spool is None or self._spool.closed or self._spool.pending == 0
        return retained_done and not self._direct_inflight and not self._inflight and spool_done

    def stop(self, drain_timeout: float = 2.0) -> None:
        """Let pending retained messages (and in-flight rows) be acknowledged for up to ``drain_timeout`` s,
        disconnect cleanly (no Last Will), and join the thread."""
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
        """Stop (with a short drain) and release the client. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.stop()

    def __enter__(self) -> MqttLink:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the thread
    _drain_deadline = 0.0

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
            if now < self._next_attempt:
                self._wake.wait(min(self._next_attempt - now, 0.5))
                self._wake.clear()
                return
            self._connect()
            return
        rc = self._client.loop(timeout=_LOOP_TIMEOUT_S if self.status.connected else 0.05)
        if rc != 0:
            self._lost(self._refused or f"connection lost ({self._paho.error_string(rc)})")
            return
        if not self.status.connected:
            if self._connecting_since is not None and now - self._connecting_since > self.settings.connect_timeout_s:
                # A 3.1.1-only broker (amqtt, older appliances) may take an MQTT 5 CONNECT and never
                # answer it: with mqtt_version auto, that silence counts as a refusal of version 5.
                self._lost(f"no CONNACK from {self.broker.host}:{self.broker.port} within "
                           f"{self.settings.connect_timeout_s:g} s", answered=self._protocol == "5")
            return
        self._pump_retained()
        self._pump_spool()

    def _new_client(self) -> Any:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self._paho = paho
        if self._protocol == "5":
            client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.settings.client_id,
                                 protocol=paho.MQTTv5, reconnect_on_failure=False)
        else:
            client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.settings.client_id,
                                 clean_session=False, protocol=paho.MQTTv311, reconnect_on_failure=False)
        client.connect_timeout = self.settings.connect_timeout_s
        # our window bounds what is in flight; leave paho room for the retained state messages
        client.max_inflight_messages_set(self.settings.inflight_window + 8)
        client.max_queued_messages_set(0)
        if self._username:
            client.username_pw_set(self._username, self._password)
        if self._tls is not None:
            client.tls_set_context(self._tls)
        if self._will is not None:
            client.will_set(self._will[0], self._will[1], qos=1, retain=True)
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
            if self._protocol == "5":
                from paho.mqtt.packettypes import PacketTypes
                from paho.mqtt.properties import Properties

                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = self.settings.session_expiry_s
                self._client.connect(self.broker.host, self.broker.port, keepalive=self.settings.keepalive_s,
                                     clean_start=False, properties=props)
            else:
                self._client.connect(self.broker.host, self.broker.port, keepalive=self.settings.keepalive_s)
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
        self._attempt += 1
        if self.settings.mqtt_version == "auto" and not self._ever_connected and answered:
            # The broker answered but did not accept us. A broker that does not speak MQTT 5 refuses
            # the protocol level or just hangs up, so try the other version next (paho fixes the
            # protocol per client object; nothing has been published through it yet).
            self._protocol = "3.1.1" if self._protocol == "5" else "5"
            self._discard_client()
            if self._refused_protocol:
                log.info("broker %s does not accept this MQTT version; trying MQTT %s", self.broker, self._protocol)
                self._next_attempt = time.monotonic()
                return
        delay = backoff_delay(self._attempt, self.settings.reconnect_min_s, self.settings.reconnect_max_s, self._rng)
        self._next_attempt = time.monotonic() + delay
        level = logging.ERROR if self._refused else logging.WARNING
        log.log(level, "MQTT: %s; retrying in %.1f s (attempt %d)", reason, delay, self._attempt)

    _refused_protocol = False

    def _lost(self, reason: str, *, answered: bool = True) -> None:
        was_connected = self.status.connected
        since = self.status.connected_since
        self._drop_connection(reason)
        if was_connected:
            self.status.disconnects += 1
            self.status.lost_since = time.monotonic()
            lasted = time.monotonic() - since if since else 0.0
            if lasted >= STABLE_CONNECTION_S:
                self._attempt = 0
            log.warning("MQTT: disconnected from %s: %s", self.broker, reason)
            self._check_poison(lasted)
            self._attempt += 1
            delay = backoff_delay(self._attempt, self.settings.reconnect_min_s, self.settings.reconnect_max_s,
                                  self._rng)
            self._next_attempt = time.monotonic() + delay
            self.status.last_error = reason
        else:
            self._failed(reason, answered=answered)

    def _check_poison(self, lasted: float) -> None:
        """A connection lost soon after connecting, with spooled messages unacknowledged: suspect the
        oldest of them (a broker drops the connection on a message over its size limit, and paho
        would resend it after every reconnect for ever). It goes alone on the next connection; after
        POISON_STRIKES such losses in a row it is dropped, counted in ``rejected``."""
        if self._spool is None or self._spool.closed or not self._inflight or lasted >= STABLE_CONNECTION_S:
            self._suspect = None
            return
        row = min(self._inflight.values())
        strikes = self._suspect[1] + 1 if self._suspect is not None and self._suspect[0] == row else 1
        if strikes >= POISON_STRIKES:
            self._suspect = None
            self._reject(row, f"the broker dropped the connection {strikes} times in a row while it was in flight "
                              "(over the broker's message size limit?)")
        else:
            self._suspect = (row, strikes)
        # paho would resend its whole queue; start over from the spool, the suspect first and alone
        self._discard_client()

    def _reject(self, row_id: int, why: str) -> None:
        """Drop a spooled message that no broker will take; it is counted, logged, and never retried."""
        self.status.rejected += 1
        self.status.last_error = f"dropped spooled message {row_id}: {why}"
        log.error("MQTT: dropped spooled message %d: %s", row_id, why)
        if self._spool is not None:
            self._spool.ack(row_id, rejected=True)

    def _drop_connection(self, reason: str) -> None:
        self.status.connected = False
        self.status.connected_since = None
        self._connecting_since = None
        # paho closes the old socket itself at the next connect(). It keeps unacknowledged QoS 1
        # messages (with their mids) and resends them after the next CONNACK, so their rows stay in
        # flight here; the retained state is re-published at every connect.
        with self._lock:
            self._retained_sent.clear()

    def _discard_client(self) -> None:
        """Forget the paho client and everything it held in memory; the spool still has the rows."""
        self._client = None
        self._inflight.clear()
        self._direct_inflight.clear()
        self._cursor = 0
        if self._spool is not None and not self._spool.closed:
            self._spool.release_all()

    # ------------------------------------------------------------------------------ callbacks
    def _handle_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            name = reason.getName()
            self._refused_protocol = "protocol" in name.lower()
            hint = ""
            if "not authorized" in name.lower() or "user name or password" in name.lower():
                hint = " — check username/password (or the client certificate) and the broker's ACL"
            self._refused = f"broker {self.broker} refused the connection: {name}{hint}"
            return
        self._refused_protocol = False
        self._connecting_since = None
        self._ever_connected = True
        self.status.connected = True
        self.status.connected_since = time.monotonic()
        self.status.connects += 1
        self.status.protocol = "5" if self._protocol == "5" else "3.1.1"
        self.status.session_present = bool(flags.session_present)
        self._max_packet = getattr(properties, "MaximumPacketSize", None) if properties is not None else None
        self.status.last_error = None
        log.info("MQTT: connected to %s (MQTT %s, session present: %s)", self.broker, self.status.protocol,
                 flags.session_present)
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
        failed = bool(getattr(reason, "is_failure", False))
        row = self._inflight.pop(mid, None)
        if row is not None:
            if self._suspect is not None and self._suspect[0] == row:
                self._suspect = None  # it got through (or was refused with a reason): not poison
            self.status.acked += 1
            if failed:
                self.status.rejected += 1
                log.warning("broker refused spooled message %d: %s (dropped)", row, reason.getName())
            if self._spool is not None:
                self._spool.ack(row, rejected=failed)
        else:
            self._direct_inflight.discard(mid)
            if failed:
                log.warning("broker refused a retained message: %s", reason.getName())

    def _handle_message(self, client: Any, userdata: Any, message: Any) -> None:
        self.status.received += 1
        if self._on_message is None:
            return
        try:
            self._on_message(message.topic, bytes(message.payload))
        except Exception:
            log.exception("message handler failed for a message on %s", getattr(message, "_topic", b"?"))

    # ------------------------------------------------------------------------------ publishing
    def _pump_retained(self) -> None:
        client = self._client
        with self._lock:
            pending = [(t, p, v) for t, (p, v) in self._retained.items() if self._retained_sent.get(t) != v]
        for topic, payload, version in pending:
            info = client.publish(topic, payload, qos=1, retain=True)
            if info.rc == _QUEUE_SIZE:
                return
            self._direct_inflight.add(info.mid)
            self.status.published += 1
            with self._lock:
                self._retained_sent[topic] = version

    def _pump_spool(self) -> None:
        client = self._client
        spool = self._spool
        if spool is None or spool.closed:
            return
        # a suspected poison message travels alone until it is acknowledged
        window = 1 if self._suspect is not None else self.settings.inflight_window
        while len(self._inflight) < window and spool.last_id > self._cursor:
            rows = spool.fetch(self._cursor, window - len(self._inflight))
            if not rows:
                self._cursor = spool.last_id
                break
            for index, row in enumerate(rows):
                size = len(row.topic.encode()) + len(row.payload) + _PUBLISH_OVERHEAD
                if self._max_packet is not None and size > self._max_packet:
                    self._cursor = row.id
                    self._reject(row.id, f"{size} bytes on {row.topic} is over the broker's maximum packet size "
                                         f"({self._max_packet} bytes)")
                    continue
                info = client.publish(row.topic, row.payload, qos=row.qos, retain=row.retain)
                if info.rc == _QUEUE_SIZE:
                    spool.release(r.id for r in rows[index:])
                    return
                self._inflight[info.mid] = row.id
                self._cursor = row.id
                self.status.published += 1

    def _shutdown(self) -> None:
        client = self._client
        if client is None:
            return
        if self.status.connected:
            deadline = self._drain_deadline or time.monotonic()
            while time.monotonic() < deadline:
                self._pump_retained()
                self._pump_spool()  # the last window and events, if the broker takes them in time
                if self.idle():
                    break
                if client.loop(timeout=0.05) != 0:
                    break
            try:
                client.disconnect()
                client.loop(timeout=0.1)
            except Exception:  # pragma: no cover - best effort on the way out
                pass
        self.status.connected = False
        self._client = None
