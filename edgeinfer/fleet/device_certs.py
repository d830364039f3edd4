"""Devices' client certificates: signed from a device's own request, recorded, revoked by a CRL; who a peer is.

A device that holds a certificate of the fleet's CA is known by it on the broker's certificate listener
(``fleet/broker.py``) and on the manager's HTTPS (``fleet/http.py``). Interface::

    read_csr(pem) -> CertificateSigningRequest          # ProvisioningRefused(400): not PEM, too large, a subject...
    sign_csr(ca, csr, device_id, days=...) -> Certificate   # FleetCA.sign_csr, CN = device_id checked
        .record(device_id, cert)                         # a certificate signed elsewhere (claims.py) made revocable
    DeviceCertificates(db, ca, crl_file)
        .issue(device_id, csr_pem) -> Certificate        # signed and recorded (its serial can be revoked)
        .issue_with_key(device_id) -> (cert PEM, key PEM) # `fleet enroll --certificate`: the key made here
        .revoke(device_id) -> [serial]                   # recorded, then the CRL rewritten
        .write_crl() -> Path                             # the CRL of every revoked, unexpired certificate
        .identity(der) -> device id | None                # a TLS peer's certificate, as the broker judges it
        .kick(host, port, device_id) -> bool             # close a device's open MQTT session (see below)

Why these choices:

- **The device chooses nothing but its key.** A request must have an empty subject; the manager writes
  the CN (the device id) itself, so a device cannot name itself into another's topics. :func:`read_csr` is
  the one check of a request, for first boots (``claims.py``) and renewals alike.
- **One CRL, one reload.** Revoking writes the whole CRL (the revoked certificates still within their
  lifetime: an expired one is refused anyway, so the list does not grow for ever) atomically, and Mosquitto
  re-reads it on SIGHUP. Its ``next_update`` lies a year ahead and every write re-signs it: OpenSSL refuses
  *every* certificate once a CRL it checks has expired.
- **A revoked device is cut off at once.** Mosquitto 2.0.11 checks the CRL at the TLS handshake only: a
  connection open before the revocation stays open. :meth:`DeviceCertificates.kick` connects to the
  certificate listener with a throwaway certificate for the same CN (two minutes' life; its key lives in
  a private temporary file only while ``ssl`` loads it): ``use_username_as_clientid`` gives it the
  device's client id, the broker closes the
  device's connection as a session takeover, and the kick's clean start drops the device's session.
  The device's next handshake meets the new CRL and fails.
- **The HTTPS check is the broker's.** :meth:`identity` accepts a certificate the CA signed, for client
  authentication, within its lifetime, whose serial is not revoked — a database lookup per request, so a
  revocation holds on the API from the moment it is recorded (no reload).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import ssl
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import ProvisioningRefused
from ..util.fs import atomic_write_bytes
from .broker_auth import DEVICE_CERT_DAYS, FleetCA, check_device_common_name

log = logging.getLogger(__name__)

#: the largest CSR a device sends (an RSA-4096 request is under 2 KiB in PEM)
MAX_CSR_BYTES = 8192
CRL_FILE = "crl.pem"
#: how long a CRL stays valid; every write re-signs it
CRL_DAYS = 365
#: the life of the throwaway certificate that closes a revoked device's session
KICK_CERT_S = 120


def read_csr(pem: str) -> x509.CertificateSigningRequest:
    """A device's certificate request, checked: PEM of one PKCS#10 request, signed by its own key (an EC P-256/384/521,
    RSA of 2048 bits or more, or Ed25519 key), with an **empty subject** — the manager names the device.
    ProvisioningRefused(400) naming what is wrong."""
    if len(pem.encode("utf-8", "replace")) > MAX_CSR_BYTES:
        raise ProvisioningRefused(400, f"csr: at most {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError, UnsupportedAlgorithm) as exc:
        raise ProvisioningRefused(400, f"csr: not a PEM certificate request (PKCS#10): {exc}") from None
    try:
        if not csr.is_signature_valid:
            raise ProvisioningRefused(400, "csr: its signature does not match its public key")
        key = csr.public_key()
    except (ValueError, UnsupportedAlgorithm, InvalidSignature) as exc:
        raise ProvisioningRefused(400, f"csr: its key or signature cannot be read: {exc}") from None
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        raise ProvisioningRefused(400, f"csr: an RSA key of {key.key_size} bits; at least 2048")
    if not isinstance(key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey, ed25519.Ed25519PublicKey)):
        raise ProvisioningRefused(400, "csr: the key must be EC, RSA or Ed25519")
    if len(csr.subject):
        raise ProvisioningRefused(400, f"csr: the subject must be empty, not {csr.subject.rfc4514_string()!r} — the "
                                       "manager names devices (the certificate's CN is the device id it gives)")
    return csr


def _ca_pair(ca: FleetCA) -> tuple[Any, x509.Certificate]:
    return ca._ca()  # the same package's CA: its key stays in FleetCA, loaded once


def sign_csr(ca: FleetCA, csr: x509.CertificateSigningRequest, device_id: str, *,
             days: float = DEVICE_CERT_DAYS) -> x509.Certificate:
    """``FleetCA.sign_csr`` for a device: CN = ``device_id``, checked (an id, no reserved prefix)."""
    return ca.sign_csr(csr, check_device_common_name(device_id), days=days)


def serial_text(cert: x509.Certificate) -> str:
    """A certificate's serial as the database keeps it (lower-case hex)."""
    return format(cert.serial_number, "x")


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _new_key_and_csr() -> tuple[ec.EllipticCurvePrivateKey, x509.CertificateSigningRequest]:
    key = ec.generate_private_key(ec.SECP256R1())
    return key, x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class DeviceCertificates:
    """The device certificates of one fleet: issued and recorded in ``db``, revoked into ``crl_file``."""

    def __init__(self, db: Any, ca: FleetCA, crl_file: Path, *, days: float = DEVICE_CERT_DAYS) -> None:
        self.db = db
        self.ca = ca
        self.crl_file = Path(crl_file)
        self.days = days

    def issue(self, device_id: str, csr_pem: str | bytes, *, days: float | None = None) -> x509.Certificate:
        """Sign ``csr_pem`` (checked by :func:`read_csr`) for ``device_id`` and record it; ProvisioningRefused(400)
        for a bad request, ValueError for a device id no certificate may carry."""
        pem = csr_pem.decode("ascii", "replace") if isinstance(csr_pem, bytes) else csr_pem
        cert = sign_csr(self.ca, read_csr(pem), device_id, days=self.days if days is None else days)
        self.record(device_id, cert)
        return cert

    def record(self, device_id: str, cert: x509.Certificate) -> None:
        """Record a certificate issued to ``device_id``, so that revoking the device revokes it."""
        self.db.certificates.add(self.row(device_id, cert))

    @staticmethod
    def row(device_id: str, cert: x509.Certificate) -> dict:
        """The ``certificates`` row that records ``cert`` (what :meth:`record` writes; a provisioning request approved
        at once writes it in the request's own transaction)."""
        return {"serial": serial_text(cert), "device_id": device_id, "issued_at": time.time(),
                "not_after": cert.not_valid_after_utc.timestamp(), "revoked_at": None}

    def issue_with_key(self, device_id: str) -> tuple[bytes, bytes]:
        """A key made here and its recorded certificate (PEM each): for a device set up by hand (``fleet enroll
        --certificate``); a provisioned device makes its key itself and never sends it."""
        key, csr = _new_key_and_csr()
        cert = self.issue(device_id, csr.public_bytes(serialization.Encoding.PEM))
        return _pem(cert), _key_pem(key)

    def revoke(self, device_id: str) -> list[str]:
        """Revoke every certificate of ``device_id`` and rewrite the CRL; the revoked serials (none: nothing to do)."""
        serials = self.db.certificates.revoke(device_id, time.time())
        if serials:
            self.write_crl()
        return serials

    def write_crl(self) -> Path:
        """Write the CRL of the revoked certificates still within their lifetime (atomically, mode 0644)."""
        ca_key, ca_cert = _ca_pair(self.ca)
        now = dt.datetime.now(dt.timezone.utc)
        builder = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
                   .last_update(now - dt.timedelta(minutes=5)).next_update(now + dt.timedelta(days=CRL_DAYS))
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        for row in self.db.certificates.revoked(now.timestamp()):
            revoked_at = dt.datetime.fromtimestamp(row["revoked_at"], dt.timezone.utc)
            builder = builder.add_revoked_certificate(x509.RevokedCertificateBuilder()
                                                      .serial_number(int(row["serial"], 16))
                                                      .revocation_date(revoked_at).build())
        crl = builder.sign(ca_key, hashes.SHA256())
        atomic_write_bytes(self.crl_file, crl.public_bytes(serialization.Encoding.PEM), mode=0o644)
        return self.crl_file

    def identity(self, der: bytes | None, *, now: float | None = None) -> str | None:
        """The device id of a TLS peer's certificate (DER) if the CA signed it for a client, it is within its
        lifetime and not revoked; None otherwise (no certificate included)."""
        if not der:
            return None
        try:
            cert = x509.load_der_x509_certificate(der)
            cert.verify_directly_issued_by(_ca_pair(self.ca)[1])
            usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
            return None
        when = time.time() if now is None else now
        if (ExtendedKeyUsageOID.CLIENT_AUTH not in usage or len(names) != 1
                or not cert.not_valid_before_utc.timestamp() <= when <= cert.not_valid_after_utc.timestamp()):
            return None
        device_id = str(names[0].value)
        try:
            check_device_common_name(device_id)
        except ValueError:
            return None
        row = self.db.certificates.get(serial_text(cert))
        # a certificate of this CA that was never recorded is judged as the broker judges it: not on the CRL
        return device_id if row is None or row["revoked_at"] is None else None

    def kick(self, host: str, port: int, device_id: str, *, timeout: float = 5.0) -> bool:
        """Close ``device_id``'s MQTT connection on the certificate listener (a session takeover, see the module
        docstring); whether the broker accepted the takeover."""
        key, csr = _new_key_and_csr()
        cert = sign_csr(self.ca, csr, device_id, days=KICK_CERT_S / 86_400)
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca.ca_file))
        with tempfile.TemporaryDirectory(prefix="edgeinfer-kick-") as folder:  # ssl loads a key from a file only
            pair = Path(folder) / "kick.pem"
            fd = os.open(pair, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(_key_pem(key) + _pem(cert))
            context.load_cert_chain(pair)
        try:
            with socket.create_connection((host, port), timeout=timeout) as raw, \
                    context.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(_connect_packet(device_id))
                answer = _read_exactly(tls, 4)
                tls.sendall(b"\xe0\x00")  # DISCONNECT: the kick leaves no session behind (clean start)
        except (OSError, ssl.SSLError) as exc:
            log.warning("could not close %s's MQTT session on %s:%s: %s", device_id, host, port, exc)
            return False
        return answer[:1] == b"\x20" and answer[3:4] == b"\x00"


def _connect_packet(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT with clean session (the broker replaces the client id with the CN anyway)."""
    ident = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + struct.pack("!H", len(ident)) + ident
    return b"\x10" + bytes([len(body)]) + body  # under 128 bytes: a one-byte remaining length


def _read_exactly(sock: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data
