"""Who may reach the fleet: the API's tokens, the audit log, devices' MQTT accounts on the managed
Mosquitto, and the fleet's CA (``fleet serve --tls``). The manager owns one :class:`FleetAccess`;
the API's access routes call it (``api/access.py``)."""

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
from .broker import ManagedMosquitto, free_port
from .broker_auth import (
    AuthFiles,
    FleetCA,
    ManagerAccount,
    device_accounts,
    device_username,
    hash_password,
    new_password,
    write_auth_files,
)
from .db import FleetDB

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

    # ------------------------------------------------------------------------- the managed broker
    def start_broker(self, host: str, port: int) -> ManagedMosquitto:
        """The managed Mosquitto: accounts for the manager and every enrolled device, no anonymous client."""
        self.manager_password = new_password()  # a new one at every start: only this process needs it
        tls = self.ca.tls_files(self.certificate_hosts) if self.ca is not None else None
        self.broker = ManagedMosquitto(self.data_dir, host=host, port=port or free_port(),
                                       auth=self._write_accounts(), tls=tls).start()
        self.broker_url = f"{'mqtts' if tls else 'mqtt'}://{local_host(host)}:{self.broker.port}"
        return self.broker

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
    def enroll_device(self, device_id: str, fleet: str = DEFAULT_FLEET) -> dict:
        """Issue ``device_id`` a new MQTT password (replacing any earlier one); what its agent.yaml needs."""
        return self.enroll_devices([device_id], fleet)[0]

    def enroll_devices(self, device_ids: list[str], fleet: str = DEFAULT_FLEET) -> list[dict]:
        """:meth:`enroll_device` for many devices with one broker reload (provisioning a batch); ids and fleet
        as ``schemas.EnrollBatch`` checks them (``device_username`` refuses others)."""
        issued, rows, now = [], [], time.time()
        for device_id in device_ids:
            username, password = device_username(fleet, device_id), new_password()
            rows.append({"device_id": device_id, "fleet": fleet, "username": username,
                         "password_hash": hash_password(password), "created_at": now, "revoked_at": None})
            config = {"device_id": device_id, "fleet": fleet, "broker": self.device_broker_url or self.broker_url,
                      "username": username, "password": password, "update_public_key": self.key.public_key_b64()}
            if self.ca is not None:
                config["ca"] = str(self.ca.ca_file)
            issued.append(config)
        self.db.put_credentials(rows)
        self._sync_broker()
        return issued

    def revoke_device(self, device_id: str) -> dict:
        """The device's credential stops working: the broker refuses (and drops) it, downloads answer 401."""
        if not self.db.revoke_credential(device_id, time.time()):
            raise LookupError(f"device {device_id} is not enrolled (or already revoked)")
        self._sync_broker()
        return {"device_id": device_id, "revoked": True}

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
