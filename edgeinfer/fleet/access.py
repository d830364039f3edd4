"""Who may reach the fleet: the API's tokens, the audit log, devices' MQTT accounts on the managed
Mosquitto, the fleet's CA (``fleet serve --tls``) and the devices' client certificates it issues (with TLS the
managed Mosquitto has a second listener where a device is its certificate: ``fleet/device_certs.py``). The
manager owns one :class:`FleetAccess`; the API's access routes call it (``api/access.py``)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..link.vocabulary import DEFAULT_FLEET
from ..updates.signing import SigningKey, VerifyKey
from .auth import TokenStore
from .broker import CertificateListener, ManagedMosquitto, free_port
from .broker_auth import (
    AuthFiles,
    FleetCA,
    ManagerAccount,
    device_accounts,
    device_username,
    hash_password,
    new_password,
    write_auth_files,
    write_certificate_acl,
)
from .db import FleetDB
from .device_certs import CRL_FILE, DeviceCertificates

log = logging.getLogger(__name__)

#: the fleet manager's own account on the Mosquitto it manages
MANAGER_USER = "edgeinfer-manager"


class FleetAccess:
    """Tokens (``TokenStore``), enrolment and the managed broker's password and ACL files."""

    def __init__(self, db: FleetDB, key: SigningKey, data_dir: Path, *, tls: bool, tls_hosts: Sequence[str] = (),
                 listen_hosts: Sequence[str] = (), broker_url: str | None = None,
                 device_broker_url: str | None = None) -> None:
        """``listen_hosts``: where the broker and the API listen; with ``tls`` one server certificate names
        them all, with ``tls_hosts``, this host's name, localhost and 127.0.0.1. ``broker_url``: a broker
        the operator runs (None: :meth:`start_broker`); enrolled devices are told ``device_broker_url``,
        or that."""
        self.db = db
        self.key = key
        self.data_dir = Path(data_dir)
        self.tokens = TokenStore(db, grant_key=VerifyKey(key.public_key_b64()))
        self.certificate_hosts = _certificate_hosts(listen_hosts, tls_hosts)
        self.device_broker_url = device_broker_url
        self.broker: ManagedMosquitto | None = None  # the managed Mosquitto, once started
        self.broker_url = broker_url
        self.manager_password: str | None = None
        self._lock = threading.Lock()
        #: the admin token file written at this start (a first start), else None
        self.admin_token_file = self.tokens.ensure_admin_token(self.data_dir)
        if self.admin_token_file is not None:
            log.warning("created an admin API token in %s (mode 0600): pass it as --token-file, or create "
                        "tokens with less power: edgeinfer fleet token create", self.admin_token_file)
        self.ca: FleetCA | None = FleetCA(self.data_dir / "tls").ensure() if tls else None
        #: devices' client certificates (with TLS): issued, recorded, revoked into the broker's CRL
        self.certificates = (DeviceCertificates(db, self.ca, self.data_dir / "mosquitto" / CRL_FILE)
                             if self.ca is not None else None)
        #: how devices reach the manager's HTTP API (the manager sets it once its server is up)
        self.manager_url: str | None = None

    # ------------------------------------------------------------------------- the managed broker
    def start_broker(self, host: str, port: int, certificate_port: int | None = None) -> ManagedMosquitto:
        """The managed Mosquitto: accounts for the manager and every enrolled device, no anonymous client; with
        TLS also the certificate listener (``certificate_port``; default: ``port`` + 1, or a free one)."""
        self.manager_password = new_password()  # a new one at every start: only this process needs it
        tls = self.ca.tls_files(self.certificate_hosts) if self.ca is not None else None
        port = port or free_port()
        listener = None
        if self.certificates is not None:
            self.certificates.write_crl()  # re-signed at every start: a CRL must never expire under the broker
            listener = CertificateListener(certificate_port or (port + 1 if port < 65535 else free_port()),
                                           write_certificate_acl(self.data_dir / "mosquitto", [MANAGER_USER]),
                                           self.certificates.crl_file)
        self.broker = ManagedMosquitto(self.data_dir, host=host, port=port, auth=self._write_accounts(), tls=tls,
                                       certificates=listener).start()
        self.broker_url = f"{'mqtts' if tls else 'mqtt'}://{local_host(host)}:{self.broker.port}"
        return self.broker

    @property
    def certificate_broker(self) -> dict | None:
        """Where devices connect by certificate, as provisioning answers it (``{"host", "port", "tls": true}``):
        the managed broker's certificate listener (None without one)."""
        if self.broker is None or self.broker.certificates is None:
            return None
        return {"host": local_host(self.broker.host), "port": self.broker.certificates.port, "tls": True}

    def certificate_broker_url(self) -> str | None:
        broker = self.certificate_broker
        return f"mqtts://{broker['host']}:{broker['port']}" if broker else None

    def https_files(self) -> tuple[str, str] | None:
        """The API's certificate and key with ``tls`` (the broker's: one certificate for both), else None."""
        if self.ca is None:
            return None
        cert, key = self.ca.server_cert(self.certificate_hosts)
        return str(cert), str(key)

    def _write_accounts(self) -> AuthFiles:
        """Mosquitto's password and ACL files from the enrolled devices (revoked ones left out)."""
        manager = ManagerAccount(username=MANAGER_USER, password_hash=hash_password(self.manager_password or ""))
        return write_auth_files(self.data_dir / "mosquitto", manager, device_accounts(self.db.list_credentials()))

    def _sync_broker(self) -> None:
        """Rewrite the managed Mosquitto's accounts and make it re-read them (no restart)."""
        if self.broker is None:
            return
        with self._lock:
            self._write_accounts()
            try:
                self.broker.reload()
            except ConfigError as exc:  # down or restarting: the supervisor's restart reads the new files
                log.warning("Mosquitto did not reload its accounts (%s); it reads them when it restarts", exc)

    # ----------------------------------------------------------------------------- enrolment
    def enroll_device(self, device_id: str, fleet: str = DEFAULT_FLEET, *, certificate: bool = False) -> dict:
        """Issue ``device_id`` a new MQTT password (replacing any earlier one), or with ``certificate`` a key and
        client certificate; what its agent.yaml needs (``manager_url`` included)."""
        return self.enroll_devices([device_id], fleet, certificate=certificate)[0]

    def enroll_devices(self, device_ids: list[str], fleet: str = DEFAULT_FLEET, *,
                       certificate: bool = False) -> list[dict]:
        """:meth:`enroll_device` for many devices with one broker reload (provisioning a batch); ids and fleet
        as ``schemas.EnrollBatch`` checks them (``device_username`` refuses others)."""
        if certificate:
            return [self._enroll_by_certificate(device_id, fleet) for device_id in device_ids]
        issued, rows, now = [], [], time.time()
        for device_id in device_ids:
            username, password = device_username(fleet, device_id), new_password()
            rows.append({"device_id": device_id, "fleet": fleet, "username": username,
                         "password_hash": hash_password(password), "created_at": now, "revoked_at": None})
            config = {"device_id": device_id, "fleet": fleet, "broker": self.device_broker_url or self.broker_url,
                      "username": username, "password": password, "update_public_key": self.key.public_key_b64(),
                      "manager_url": self.manager_url}
            if self.ca is not None:
                config["ca"] = str(self.ca.ca_file)
            issued.append(config)
        self.db.put_credentials(rows)
        self._sync_broker()
        return issued

    def _enroll_by_certificate(self, device_id: str, fleet: str) -> dict:
        """A key and client certificate for one device (nothing on the broker changes: its ACL is patterns)."""
        if self.certificates is None or self.ca is None:
            raise ValueError("certificates need the fleet's CA: start the manager with --tls")
        cert, key = self.certificates.issue_with_key(device_id)
        return {"device_id": device_id, "fleet": fleet,
                "broker": self.certificate_broker_url() or self.device_broker_url or self.broker_url,
                "update_public_key": self.key.public_key_b64(), "manager_url": self.manager_url,
                "ca": str(self.ca.ca_file), "certificate": cert.decode(), "private_key": key.decode(),
                "ca_certificate": self.ca.ca_file.read_text()}

    def revoke_device(self, device_id: str) -> dict:
        """The device's credential and certificates stop working: the broker refuses (and drops) it, the API
        answers 401."""
        password = self.db.revoke_credential(device_id, time.time())
        serials = self.certificates.revoke(device_id) if self.certificates is not None else []
        if not (password or serials):
            raise LookupError(f"device {device_id} is not enrolled (or already revoked)")
        self._sync_broker()
        if serials:
            self._close_session(device_id)
        return {"device_id": device_id, "revoked": True}

    def _close_session(self, device_id: str) -> None:
        """A revoked certificate's open connection: Mosquitto checks the CRL at the handshake only (device_certs)."""
        broker = self.certificate_broker
        if broker is not None and self.certificates is not None:
            self.certificates.kick(broker["host"], broker["port"], device_id)

    def list_enrollments(self) -> list[dict]:
        return [{k: v for k, v in c.items() if k != "password_hash"} for c in self.db.list_credentials()]

    # ---------------------------------------------------------------------------------- audit
    def record_audit(self, *entries: dict) -> None:
        """Audit entries (actor, role, action, target, remote, detail), in one transaction."""
        self.db.audit_many(list(entries))

    def list_audit(self, limit: int) -> list[dict]:
        return self.db.list_audit(limit)


def _certificate_hosts(listen_hosts: Sequence[str], extra: Sequence[str]) -> list[str]:
    """The names a server certificate must carry: loopback, this host, the given ones, and every listen
    address that is not a wildcard."""
    hosts = ["127.0.0.1", "localhost", socket.gethostname(), *extra]
    hosts += [h for h in listen_hosts if h not in ("0.0.0.0", "::", "")]
    return list(dict.fromkeys(hosts))


def local_host(listen_host: str) -> str:
    """The address this machine reaches a listener on (not the wildcard it was bound to)."""
    return "127.0.0.1" if listen_host in ("0.0.0.0", "::", "") else listen_host
