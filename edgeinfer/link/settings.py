"""How to reach the broker: the broker URL, TLS material, :class:`LinkSettings`, and connect errors in words.

Nothing here imports paho: the agent's config loader validates a broker section with these
without needing the MQTT client installed.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError

if TYPE_CHECKING:
    import ssl

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
DEFAULT_KEEPALIVE_S = 30
DEFAULT_SESSION_EXPIRY_S = 7 * 24 * 3600
DEFAULT_RECONNECT_MIN_S = 0.5
DEFAULT_RECONNECT_MAX_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_INFLIGHT_WINDOW = 20
MQTT_VERSIONS = ("auto", "5", "3.1.1")


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


# ---------------------------------------------------------------------------------------- TLS
def _read_pem(path: Path, key: str) -> str:
    """The text of a PEM file named by config key ``key``; ConfigError that names the key if unreadable."""
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


_CERTIFICATE_MARK = "-----BEGIN CERTIFICATE-----"
_ENCRYPTED_KEY = "is encrypted; the agent needs an unencrypted key readable only by its user"


def _load_client_certificate(context: ssl.SSLContext, cert: str, key: str) -> None:
    """Present ``cert`` with its private ``key``; ConfigError naming what is wrong with them."""
    import ssl

    def no_password() -> bytes:  # OpenSSL asks for one: the key is encrypted
        raise ConfigError(f"key: {key} {_ENCRYPTED_KEY}")

    try:
        context.load_cert_chain(cert, key, password=no_password)
    except (ssl.SSLError, OSError) as exc:
        _client_certificate_problem(cert, key)  # the files' fault, named, when it is theirs
        reason = str(getattr(exc, "reason", None) or exc)
        if "MISMATCH" in reason.upper():
            raise ConfigError(f"cert/key: the private key {key} does not belong to the certificate {cert}") \
                from exc
        raise ConfigError(f"cert/key: cannot load {cert} with {key} ({reason})") from exc


def _client_certificate_problem(cert: str, key: str) -> None:
    """ConfigError for a cert or key file that is missing, unreadable, not PEM or encrypted (read only once OpenSSL
    has refused them: a simulator loads thousands that are good)."""
    if _CERTIFICATE_MARK not in _read_pem(Path(cert), "cert"):
        raise ConfigError(f"cert: {cert} holds no PEM certificate ({_CERTIFICATE_MARK})")
    key_text = _read_pem(Path(key), "key")
    if "PRIVATE KEY-----" not in key_text:
        raise ConfigError(f"key: {key} holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)")
    if "ENCRYPTED" in key_text:
        raise ConfigError(f"key: {key} {_ENCRYPTED_KEY}")


def tls_context(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the broker (``ca``, or the system's CAs) and may present a cert.

    Raises ConfigError naming the key (``ca``, ``cert``, ``key``) that is missing, unreadable, not PEM,
    or (cert/key) that do not belong together. OpenSSL alone reads the files; this module reads them only to
    say what is wrong once OpenSSL has refused them (a simulator loads thousands that are good).
    """
    import ssl  # here, not at import: an agent on a plain broker never loads OpenSSL (edgeinfer/util/defer.py)

    try:
        # with a ca, only it is trusted (as paho's tls_set and mosquitto_sub --cafile): the system's CAs are not
        # loaded, which also spares ~100 ms of parsing them per context (a simulator makes thousands)
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
    except (ssl.SSLError, OSError) as exc:
        if not ca:
            raise
        if _CERTIFICATE_MARK not in _read_pem(Path(ca), "ca"):
            raise ConfigError(f"ca: {ca} holds no PEM certificate ({_CERTIFICATE_MARK})") from None
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(f"ca: {ca} is not a valid PEM CA certificate ({reason})") from exc
    if ca and not context.cert_store_stats()["x509"]:  # a file OpenSSL took that holds no certificate (a CRL)
        raise ConfigError(f"ca: {ca} holds no PEM certificate ({_CERTIFICATE_MARK})")
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if bool(cert) != bool(key):
        missing, given = ("key", "cert") if cert else ("cert", "key")
        raise ConfigError(f"{missing}: required when {given} is given (a client certificate needs its private key)")
    if cert and key:
        _load_client_certificate(context, cert, key)
    return context


# ---------------------------------------------------------------------------------------- settings
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
    #: MQTT 5 Receive Maximum: how many QoS 1 messages the broker may have in flight to us unacknowledged; past
    #: it the broker holds messages back in our session instead of sending them (None: the protocol's 65535)
    receive_maximum: int | None = None
    #: acknowledge a received QoS 1 message only when the receiver says so (MqttLink's ``on_delivery``), after
    #: it has stored it, so a message is never acknowledged and then lost by a crash
    manual_ack: bool = False

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
        if self.receive_maximum is not None and not 1 <= self.receive_maximum <= 65535:
            raise ValueError(f"receive_maximum must be within 1..65535, got {self.receive_maximum}")
        if self.connect_timeout_s <= 0 or self.session_expiry_s < 0:
            raise ValueError("connect_timeout_s must be > 0 and session_expiry_s >= 0")

    @property
    def broker(self) -> BrokerURL:
        """The parsed broker URL."""
        return parse_broker_url(self.url)


def describe_refusal(reason: str, broker: BrokerURL) -> str:
    """A sentence for a CONNACK that refused us (``reason``: the MQTT reason code's name)."""
    hint = ""
    if "not authorized" in reason.lower() or "user name or password" in reason.lower():
        hint = " — check username/password (or the client certificate) and the broker's ACL"
    return f"broker {broker} refused the connection: {reason}{hint}"


def describe_connect_error(exc: BaseException, broker: BrokerURL) -> str:
    """A sentence a person can act on for a failed connection attempt."""
    where = f"{broker.host}:{broker.port}"
    tls_error = _tls_error(exc, where) if broker.tls else None  # only TLS fails this way: plain never loads ssl
    if tls_error:
        return tls_error
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {where} refused — is the broker running and listening there?"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve broker host {broker.host!r} ({exc.strerror})"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer from {where} (timed out)"
    if isinstance(exc, OSError):
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return f"cannot connect to {where}: {exc}"


def _tls_error(exc: BaseException, where: str) -> str | None:
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"TLS verification of {where} failed: {exc.verify_message or exc} — check `ca` and that the broker's "
                "certificate names this host")
    if isinstance(exc, ssl.SSLError):
        return (f"TLS handshake with {where} failed: {exc.reason or exc} — check ca/cert/key and the broker's "
                "TLS listener")
    return None
