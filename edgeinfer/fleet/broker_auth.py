"""Accounts, ACLs and TLS for the fleet's managed Mosquitto (library layer: no database, no CLI).

Nothing connects anonymously: every device has its own account, allowed only its own topics, and the
fleet manager has one account (one per manager process when several share the broker, see below).

Interface (the database and ``fleet enroll/revoke`` sit on top of it)::

    hash_password(password, *, iterations=101) -> str      # "$7$101$<b64 salt>$<b64 PBKDF2-SHA512>"
    verify_password(password, hashed) -> bool               # our hashes and mosquitto_passwd's ($7$, $6$)
    new_password() -> str                                    # 192 random bits, URL-safe
    device_username(fleet, device_id) -> str                 # "edgeinfer-<fleet>-<device_id>", the agent's client id
    DeviceAccount(username, fleet, device_id, password_hash)
    ManagerAccount(username, password_hash)
    write_auth_files(folder, manager | [managers], devices) -> AuthFiles(password_file, acl_file)
    certificate_acl_text(managers) -> str                    # the certificate listener's ACL: patterns, any fleet size
    write_certificate_acl(folder, managers) -> Path          # <folder>/acl-certificates
    check_device_common_name(device_id) -> str               # a device certificate's CN (no reserved prefix)
    TLSFiles(cafile, certfile, keyfile)
    FleetCA(folder).ensure() -> FleetCA; .ca_file; .server_cert(hosts) -> (cert, key);
        .client_cert(common_name) -> (cert PEM, key PEM); .tls_files(hosts) -> TLSFiles;
        .sign_csr(csr, common_name, days=DEVICE_CERT_DAYS) -> Certificate   # a device's own key (claims.py)

Then ``ManagedMosquitto(data_dir, auth=files, tls=ca.tls_files(hosts))``; after rewriting the files
(enroll, revoke) call ``ManagedMosquitto.reload()``.

Why these choices:

- The hash is Mosquitto 2's own ``$7$`` format (PBKDF2-HMAC-SHA512, 12-byte salt, 64-byte hash — the
  salt length Mosquitto insists on). 101 iterations is what ``mosquitto_passwd`` writes: the passwords
  are 192-bit random secrets, for which key stretching adds nothing, while Mosquitto hashes on every
  CONNECT — a fleet reconnecting after a broker restart would pay for a high count all at once.
- The broker runs with ``use_username_as_clientid true``: Mosquitto replaces the client id a client
  sends with its username, so device A cannot take B's client id and kick B off (or take over B's
  session). Device usernames are therefore ``device_username(fleet, id)`` — exactly the client id
  the agent sends, so its persistent session keeps its name. A manager's session is named after its
  username too: each manager process needs its own ``ManagerAccount`` (username = its client id),
  or two managers with one account keep disconnecting each other.
  Mosquitto (2.0.11) sends no Assigned Client Identifier: a client is not told its id was replaced.
- The ACL names each device's topics literally (fleet and id included), in the device's own ``user``
  section. Mosquitto 2.0.11 drops a denied publish (MQTT 5: PUBACK 0x87 Not authorized; 3.1.1: a
  plain PUBACK) and grants a denied subscription (SUBACK QoS 1) but never delivers what it matches.
  The manager reads ``edgeinfer/v1/#`` (which also admits ``$share/<group>/edgeinfer/v1/...``) and
  writes only ``edgeinfer/v1/+/+/cmd``.
- On reload Mosquitto 2.0.11 disconnects a client whose account is gone (revocation takes effect at
  once, not at the device's next connect).
- Names are limited to ``[A-Za-z0-9._-]`` (fleet, device id: 64 characters, as the link protocol;
  usernames: 140, room for ``edgeinfer-<fleet>-<id>``): nothing that could end a line, a field
  (``:``) or add an MQTT wildcard to the files Mosquitto parses.
- Certificate identity (a second listener, ``require_certificate`` and ``use_identity_as_username``): a
  device's certificate's CN is its device id, and one ACL of *patterns* serves every device —
  ``pattern write edgeinfer/v1/+/%u/state`` and so on — so the file has the same size for ten devices or
  100,000 and enrolling one rewrites nothing. The fleet level is ``+``: Mosquitto's patterns know only
  ``%u`` and ``%c``, so a device id is unique across the manager's fleets (the credentials' table keys
  it so already). A manager connecting by certificate has its own ``user`` section (CN
  ``edgeinfer-manager``); no device certificate may carry a CN starting ``edgeinfer-``
  (:func:`check_device_common_name`), so none can take a manager's rights. Mosquitto refuses any client
  whose username holds ``/``, ``+`` or ``#`` from every ACL check, which the id's form excludes anyway.
- Files are written to a temporary file and renamed (Mosquitto never reads half a file, on reload
  or on a restart after a crash), mode 0600: Mosquitto runs as the caller (see broker.py).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import ConfigError
from ..util.fs import atomic_write_bytes

#: what mosquitto_passwd (2.0) writes
DEFAULT_ITERATIONS = 101
SALT_BYTES = 12
HASH_BYTES = 64
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
USERNAME_RE = re.compile(r"[A-Za-z0-9._-]{1,140}")
TOPIC_ROOT = "edgeinfer/v1"
DEVICE_WRITES = ("state", "telemetry", "events")
DEVICE_READS = ("cmd",)


# ---------------------------------------------------------------------------------------- passwords
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _pbkdf2(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations, HASH_BYTES)


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS) -> str:
    """Mosquitto 2's password-file hash: ``$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>``."""
    if iterations < 1:
        raise ValueError("iterations must be positive")
    salt = secrets.token_bytes(SALT_BYTES)
    return f"$7${iterations}${_b64(salt)}${_b64(_pbkdf2(password, salt, iterations))}"


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches a ``$7$`` (Mosquitto 2) or ``$6$`` (Mosquitto 1.x) hash; constant time."""
    parts = hashed.split("$")
    try:
        if len(parts) == 5 and parts[:2] == ["", "7"]:
            salt, expected = base64.b64decode(parts[3], validate=True), base64.b64decode(parts[4], validate=True)
            actual = _pbkdf2(password, salt, int(parts[2]))
        elif len(parts) == 4 and parts[:2] == ["", "6"]:
            salt, expected = base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
            actual = hashlib.sha512(password.encode("utf-8") + salt).digest()
        else:
            return False
    except ValueError:  # bad base64 or iteration count
        return False
    return hmac.compare_digest(actual, expected)


def new_password() -> str:
    """A fresh random password: 192 bits, URL-safe (no character a config or shell would mangle)."""
    return secrets.token_urlsafe(24)


# ----------------------------------------------------------------------------------------- accounts
def _check(value: str, what: str, pattern: re.Pattern[str] = NAME_RE) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        limit = 140 if pattern is USERNAME_RE else 64
        raise ValueError(f"{what} {value!r}: only letters, digits, '.', '_' and '-', at most {limit} characters")
    return value


def device_username(fleet: str, device_id: str) -> str:
    """A device's username: the client id its agent connects with (see use_username_as_clientid)."""
    return f"edgeinfer-{_check(fleet, 'fleet')}-{_check(device_id, 'device id')}"


@dataclass(frozen=True)
class DeviceAccount:
    username: str
    fleet: str
    device_id: str
    password_hash: str

    def topic(self, kind: str) -> str:
        return f"{TOPIC_ROOT}/{self.fleet}/{self.device_id}/{kind}"


def device_accounts(credentials: Iterable[dict]) -> list[DeviceAccount]:
    """The accounts of enrolled devices from their credential rows (``FleetDB.list_credentials``), revoked
    ones left out: what the password and ACL files hold."""
    return [DeviceAccount(username=c["username"], fleet=c["fleet"], device_id=c["device_id"],
                          password_hash=c["password_hash"]) for c in credentials if c["revoked_at"] is None]


@dataclass(frozen=True)
class ManagerAccount:
    username: str
    password_hash: str


@dataclass(frozen=True)
class AuthFiles:
    password_file: Path
    acl_file: Path


def _check_hash(username: str, password_hash: str) -> None:
    if not re.fullmatch(r"\$[67]\$[A-Za-z0-9+/=$]+", password_hash or ""):
        raise ValueError(f"{username}: password_hash is not a Mosquitto hash (make it with hash_password)")


def _validated(managers: list[ManagerAccount], devices: list[DeviceAccount]) -> None:
    seen: set[str] = set()
    for account in [*managers, *devices]:
        _check(account.username, "username", USERNAME_RE)
        _check_hash(account.username, account.password_hash)
        if account.username in seen:
            raise ValueError(f"username {account.username!r} appears twice")
        seen.add(account.username)
    for device in devices:
        _check(device.fleet, "fleet")
        _check(device.device_id, "device id")


def acl_text(managers: Sequence[ManagerAccount], devices: Sequence[DeviceAccount]) -> str:
    lines = ["# Written by edgeinfer: edit the fleet's accounts, not this file."]
    for manager in managers:
        lines += ["", f"user {manager.username}", f"topic read {TOPIC_ROOT}/#", f"topic write {TOPIC_ROOT}/+/+/cmd"]
    for device in devices:
        lines += ["", f"user {device.username}"]
        lines += [f"topic write {device.topic(kind)}" for kind in DEVICE_WRITES]
        lines += [f"topic read {device.topic(kind)}" for kind in DEVICE_READS]
    return "\n".join(lines) + "\n"


def write_auth_files(folder: Path, manager: ManagerAccount | Iterable[ManagerAccount],
                     devices: Iterable[DeviceAccount]) -> AuthFiles:
    """Write ``<folder>/passwd`` and ``<folder>/acl`` for these accounts (each file replaced atomically)."""
    managers = [manager] if isinstance(manager, ManagerAccount) else list(manager)
    devices = list(devices)
    if not managers:
        raise ValueError("at least one manager account is needed")
    _validated(managers, devices)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = AuthFiles(folder / "passwd", folder / "acl")
    passwd = "".join(f"{a.username}:{a.password_hash}\n" for a in [*managers, *devices])
    atomic_write_bytes(files.password_file, passwd.encode("ascii"), mode=0o600)
    atomic_write_bytes(files.acl_file, acl_text(managers, devices).encode("ascii"), mode=0o600)
    return files


# ------------------------------------------------------------------------ certificate identity
#: CNs with this prefix are the fleet's own (managers, the broker): never a device's
RESERVED_PREFIX = "edgeinfer-"
CERTIFICATE_ACL = "acl-certificates"


def check_device_common_name(device_id: str) -> str:
    """``device_id`` as a device certificate's CN: an id (``[A-Za-z0-9._-]``, 64 at most) not starting
    ``edgeinfer-`` (the managers' names); ValueError otherwise."""
    _check(device_id, "device id")
    if device_id.lower().startswith(RESERVED_PREFIX):
        raise ValueError(f"device id {device_id!r}: names starting {RESERVED_PREFIX!r} are the fleet's own")
    return device_id


def certificate_acl_text(managers: Sequence[str] = ("edgeinfer-manager",)) -> str:
    """The ACL of a listener where the certificate's CN is the username: a ``user`` section per manager CN
    and the devices' topics as patterns (``%u``: the device id) — the same text for any number of devices."""
    lines = ["# Written by edgeinfer: certificate identity (the CN is the user name). Devices are patterns:",
             "# this file does not grow with the fleet."]
    for manager in managers:
        _check(manager, "manager name", USERNAME_RE)
        lines += ["", f"user {manager}", f"topic read {TOPIC_ROOT}/#", f"topic write {TOPIC_ROOT}/+/+/cmd"]
    lines.append("")
    lines += [f"pattern write {TOPIC_ROOT}/+/%u/{kind}" for kind in DEVICE_WRITES]
    lines += [f"pattern read {TOPIC_ROOT}/+/%u/{kind}" for kind in DEVICE_READS]
    return "\n".join(lines) + "\n"


def write_certificate_acl(folder: Path, managers: Sequence[str] = ("edgeinfer-manager",)) -> Path:
    """Write ``<folder>/acl-certificates`` (atomically, mode 0600); its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / CERTIFICATE_ACL
    atomic_write_bytes(path, certificate_acl_text(managers).encode("ascii"), mode=0o600)
    return path


# ---------------------------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TLSFiles:
    cafile: Path
    certfile: Path
    keyfile: Path


CA_DAYS = 3650
LEAF_DAYS = 825
#: a provisioned device's certificate (``fleet serve --device-cert-days``): its agent renews it at two thirds
DEVICE_CERT_DAYS = 30
RENEW_BEFORE = dt.timedelta(days=30)
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([*DEFAULT_HOSTS, *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _load(path: Path, what: str, parse: Callable[[bytes], Any]) -> Any:
    """``parse`` of the file's bytes; a ConfigError naming the file when it cannot be read or parsed."""
    try:
        return parse(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not {what} in PEM ({exc})") from None


class FleetCA:
    """The fleet's own CA (EC P-256, in ``folder``): the broker's server certificate and client certificates."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.key_file = self.folder / "ca.key"
        self.cert_file = self.folder / "ca.crt"
        self.server_cert_file = self.folder / "server.crt"
        self.server_key_file = self.folder / "server.key"
        self._key: ec.EllipticCurvePrivateKey | None = None
        self._cert: x509.Certificate | None = None

    @property
    def ca_file(self) -> Path:
        return self.cert_file

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Two managers sharing a data dir must not each make a CA (or a server key) of their own."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def ensure(self) -> FleetCA:
        """Load the CA, creating it the first time (kept for good: every device trusts it). One of its two files
        without the other, or one that does not read, is a ConfigError naming the file: a new CA made in its place
        would cut off every device that trusts the old one."""
        with self._locked():
            present = [path.exists() for path in (self.key_file, self.cert_file)]
            if not any(present):
                self._create()
            elif not all(present):
                missing, kept = (self.key_file, self.cert_file) if present[1] else (self.cert_file, self.key_file)
                raise ConfigError(f"the fleet CA's {missing} is missing beside {kept}: restore it from a backup "
                                  "(a new CA would cut off every device that trusts this one)")
            key = _load(self.key_file, "the fleet CA's private key",
                        lambda data: serialization.load_pem_private_key(data, password=None))
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ConfigError(f"{self.key_file} is not an EC private key (the fleet CA's key)")
            self._key = key
            self._cert = _load(self.cert_file, "the fleet CA's certificate", x509.load_pem_x509_certificate)
        return self

    def _create(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgeinfer fleet CA"),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgeinfer")])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=True, crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        atomic_write_bytes(self.key_file, _key_pem(key), mode=0o600)
        atomic_write_bytes(self.cert_file, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)

    def _ca(self) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        if self._key is None or self._cert is None:
            self.ensure()
        assert self._key is not None and self._cert is not None
        return self._key, self._cert

    def _issue(self, common_name: str, usage: x509.ObjectIdentifier, san: list[x509.GeneralName] | None,
               days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        ca_key, ca_cert = self._ca()
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(ca_cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False,
                                                key_agreement=True, key_cert_sign=False, crl_sign=False,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    def _server_cert_current(self, san: list[x509.GeneralName]) -> bool:
        """Reuse the broker's certificate if this CA issued it, for the same names, and it is not about to expire."""
        if not (self.server_cert_file.exists() and self.server_key_file.exists()):
            return False
        _ca_key, ca_cert = self._ca()
        try:
            cert = x509.load_pem_x509_certificate(self.server_cert_file.read_bytes())
            cert.verify_directly_issued_by(ca_cert)
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
            return False
        return set(names) == set(san) and cert.not_valid_after_utc - _now() > RENEW_BEFORE

    def server_cert(self, hosts: Sequence[str] = ()) -> tuple[Path, Path]:
        """The broker's certificate and key for ``hosts`` (plus 127.0.0.1 and localhost), issued or reused."""
        san = _san(hosts)
        with self._locked():
            if not self._server_cert_current(san):
                cert, key = self._issue(str(next(iter(hosts), "localhost")), ExtendedKeyUsageOID.SERVER_AUTH, san,
                                        LEAF_DAYS)
                atomic_write_bytes(self.server_key_file, _key_pem(key), mode=0o600)
                atomic_write_bytes(self.server_cert_file, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        return self.server_cert_file, self.server_key_file

    def tls_files(self, hosts: Sequence[str] = ()) -> TLSFiles:
        """What ``ManagedMosquitto(tls=...)`` needs."""
        cert, key = self.server_cert(hosts)
        return TLSFiles(self.ca_file, cert, key)

    def sign_csr(self, csr: x509.CertificateSigningRequest, common_name: str, *,
                 days: float = DEVICE_CERT_DAYS) -> x509.Certificate:
        """A client certificate for the key of ``csr`` (whose signature the caller has checked), named
        ``common_name`` by the manager — whatever the request's subject says — for ``days``."""
        _check(common_name, "common name", USERNAME_RE)
        ca_key, ca_cert = self._ca()
        public_key = csr.public_key()
        now = _now()
        return (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                .issuer_name(ca_cert.subject).public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=not isinstance(public_key, ec.EllipticCurvePublicKey),
                                             data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                             crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))

    def client_cert(self, common_name: str, *, days: int = LEAF_DAYS) -> tuple[bytes, bytes]:
        """A client certificate (PEM) and its key (PEM, unencrypted) for mqtts; nothing is kept here."""
        _check(common_name, "common name", USERNAME_RE)
        cert, key = self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None, days)
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)
