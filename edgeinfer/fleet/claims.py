"""Zero-touch provisioning, the manager's side (docs/provisioning.md, *Claims*): a **claim** is a token baked into one
image for many devices; a device that has it and no identity sends a certificate request with it
(``POST /api/v1/provision``), and the manager names the device, keeps the request, and — at once (``auto``) or when
an operator approves it (``manual``) — signs a client certificate for the device's own key with the fleet CA.

A claim token is ``eic_<id>_<secret>`` (32 random bytes): the id finds the claim's row, the database keeps only the
SHA-256 of the whole token, compared in constant time (``auth.py``'s reasoning: a random secret needs no slow hash).
A claim admits a new request while it is not revoked, not expired, under its ``max_devices`` (pending and approved
requests count; a rejected one frees its place) and, when it lists serials, for a serial on its list. A request,
once made, lives by its own state: the same request again (same claim, serial and public key) is the device's poll
— pending (202), approved (200: the certificate again, so a restarted agent resumes), rejected (403) — whatever has
become of the claim since; revoking a claim stops new devices, and never touches those it let in.

The manager names devices, never the device: the CSR's subject must be empty, and the certificate's CN is the
name the claim's template gives (``cam-{serial}``, a ``:`` of the serial written ``-``). A name another device,
credential or request holds already gets a suffix (``cam-X-2``, ``-3``, …): a different serial never takes over an
existing device's name. A serial is one piece of hardware: a second request for it with another key is refused (409).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ..errors import ProvisioningRefused
from ..link.protocol import ID_PATTERN
from ..link.settings import parse_broker_url
from ..link.vocabulary import DEFAULT_FLEET, Word
from ..util.group_commit import GroupCommit
from .access import FleetAccess
from .broker_auth import DEVICE_CERT_DAYS
from .db import FleetDB
from .device_certs import read_csr


class Approval(Word):
    """How a claim's requests are approved."""

    #: signed at once
    AUTO = "auto"
    #: pending until an operator approves or rejects them
    MANUAL = "manual"


class RequestState(Word):
    """Where a device's provisioning request stands."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


CLAIM_STATES = ("active", "expired", "revoked", "exhausted")
CLAIM_ID_PATTERN = r"^[0-9a-f]{12}$"
CLAIM_TOKEN_RE = re.compile(r"eic_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
#: a serial: what identifies one piece of hardware (the device tree's serial-number, a board's)
SERIAL_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
SERIAL_RE = re.compile(SERIAL_PATTERN)
#: a MAC address as the device reads it (colons or dashes)
MAC_PATTERN = r"^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$"
#: a name template: letters, digits, . _ - around one {serial}
TEMPLATE_PATTERN = r"^[A-Za-z0-9._-]{0,40}\{serial\}[A-Za-z0-9._-]{0,40}$"
DEFAULT_TEMPLATE = "cam-{serial}"
#: the OpenAPI format of a CSR's PEM (what JSON Schema cannot check: the contract test's fuzzer is told how to make one)
CSR_FORMAT = "pem-pkcs10"
#: serials one claim may list
MAX_SERIALS = 100_000
#: how long a pending device waits between two polls (its Retry-After)
PENDING_RETRY_S = 30
#: the longest a claim may live, and its lifetime when none is given
MAX_CLAIM_S = 10 * 365 * 86_400.0
DEFAULT_CLAIM_S = 30 * 86_400.0
#: where the image keeps the fleet CA, beside its agent.yaml (what the agent.yaml lines name)
CA_FILE_NAME = "fleet-ca.crt"
_ID_RE = re.compile(ID_PATTERN)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def device_names(template: str, serial: str) -> Iterator[str]:
    """The names a device with ``serial`` may get, in order: the template's, then with ``-2``, ``-3``, … (each at
    most 64 characters). ProvisioningRefused(400) when the template gives no id for this serial."""
    base = template.replace("{serial}", serial.replace(":", "-"))[:64]
    if not _ID_RE.fullmatch(base):
        raise ProvisioningRefused(400, f"hardware.serial {serial!r} gives the device id {base!r}, which is not an id "
                                       "(it must start with a letter or digit)")
    yield base
    n = 2
    while True:
        suffix = f"-{n}"
        yield base[:64 - len(suffix)] + suffix
        n += 1


def public_key_sha256(csr: x509.CertificateSigningRequest) -> str:
    """The SHA-256 of the request's SubjectPublicKeyInfo (DER): what makes a repeated request the same one."""
    der = csr.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def claim_state(claim: dict, used: int, now: float) -> str:
    """active, revoked, expired or exhausted (its pending and approved requests at ``max_devices``)."""
    if claim["revoked_at"] is not None:
        return "revoked"
    if claim["expires_at"] is not None and claim["expires_at"] <= now:
        return "expired"
    if claim["max_devices"] is not None and used >= claim["max_devices"]:
        return "exhausted"
    return "active"


@dataclass(frozen=True)
class Provisioned:
    """The answer to a provisioning request: 200 (approved, with the certificate) or 202 (pending)."""

    status: int
    body: dict[str, Any]
    retry_after_s: int | None = None


class ClaimService:
    """Claims (create, list, revoke) and devices' provisioning requests (made, approved, rejected)."""

    def __init__(self, db: FleetDB, access: FleetAccess, public_url: Callable[[], str], *,
                 cert_days: float = DEVICE_CERT_DAYS, pending_retry_s: int = PENDING_RETRY_S) -> None:
        """``public_url``: how devices reach this manager's API (asked when needed: known once it listens)."""
        self.db = db
        self.rows = db.claims
        self.access = access
        self.public_url = public_url
        self.cert_days = cert_days
        self.pending_retry_s = pending_retry_s
        self._batches = _RequestBatches(self)

    # ------------------------------------------------------------------------------------------ claims
    def _broker(self, status: int = 409) -> dict[str, Any]:
        """Where a provisioned device connects (the managed broker's certificate listener, else the URL enrolled
        devices are told), as the answer says it;
        ProvisioningRefused(``status``) on a manager that cannot sign certificates."""
        listener = self.access.certificate_broker  # the managed broker's: where a certificate is the identity
        if listener is not None and self.access.device_broker_url is None:
            return listener
        url = self.access.device_broker_url or self.access.broker_url
        parsed = parse_broker_url(url) if url else None
        if parsed is None or not parsed.tls or self.access.ca is None:
            raise ProvisioningRefused(status, "this manager signs no device certificates: it needs its CA and an "
                                              "mqtts:// broker (start it with --tls)")
        return {"host": parsed.host, "port": parsed.port, "tls": True}

    def create(self, *, groups: Sequence[str], expires_in_s: float | None = DEFAULT_CLAIM_S,
               max_devices: int | None = None, approve: Approval | str = Approval.AUTO,
               serials: Sequence[str] = (), name_template: str = DEFAULT_TEMPLATE, fleet: str = DEFAULT_FLEET,
               created_by: str | None = None) -> dict:
        """A new claim: its row as listed, ``token`` (the only time it is shown), and ``agent_config``, the keys of
        the image's agent.yaml, with ``ca_pem`` (the file its ``ca`` names). ProvisioningRefused(409) on a manager
        that signs no certificates."""
        self._broker()
        assert self.access.ca is not None
        claim_id = secrets.token_hex(6)
        token = f"eic_{claim_id}_{secrets.token_urlsafe(32)}"
        now = time.time()
        row = {"claim_id": claim_id, "token_hash": token_hash(token), "fleet": fleet, "groups": list(groups),
               "approve": Approval(approve).value, "max_devices": max_devices, "has_serials": bool(serials),
               "name_template": name_template, "created_at": now, "created_by": created_by,
               "expires_at": now + expires_in_s if expires_in_s else None, "revoked_at": None}
        self.rows.insert_claim(row, serials)
        agent_config = {"claim": token, "manager_url": self.public_url(), "ca": CA_FILE_NAME,
                        "update_public_key": self.access.key.public_key_b64()}
        return {**_listed(row, 0, len(set(serials)), now), "token": token, "agent_config": agent_config,
                "ca_pem": self.access.ca.ca_file.read_text()}

    def list(self) -> list[dict]:
        now = time.time()
        return [_listed(row, row.pop("used"), row.pop("serials"), now) for row in self.rows.list_claims()]

    def revoke(self, claim_id: str) -> dict:
        """The claim admits no new device; those it let in (and its pending requests) are untouched."""
        if not self.rows.revoke_claim(claim_id, time.time()):
            raise LookupError(f"no claim {claim_id!r}")
        return next(c for c in self.list() if c["claim_id"] == claim_id)

    # ------------------------------------------------------------------------------------ provisioning
    def provision(self, claim_token: str, csr_pem: str, hardware: dict[str, Any], remote: str | None) -> Provisioned:
        """A device's request (or its poll): see the module's docstring; ProvisioningRefused otherwise. What can be
        checked alone is checked here, on the caller's thread; the rest is decided with the requests of other
        devices asking at the same time, in one transaction (:class:`_RequestBatches`)."""
        match = CLAIM_TOKEN_RE.fullmatch(claim_token)
        if match is None:
            _check_token(None, claim_token)  # raises 401, after what an unknown claim costs
        csr = read_csr(csr_pem)
        self._broker(403)
        asked = _Asked(claim_token, match.group(1), csr_pem, csr, public_key_sha256(csr), hardware, remote)
        request, claim = self._batches.decide(asked)
        return self._answer_existing(request, claim, asked.key_sha256)

    def _answer_existing(self, request: dict, claim: dict, key_sha256: str) -> Provisioned:
        """The answer to a request already stored: a poll of it, or another device's (409)."""
        if request["public_key_sha256"] != key_sha256 or request["claim_id"] != claim["claim_id"]:
            raise ProvisioningRefused(409, f"hardware.serial {request['serial']!r} is {request['device_id']}'s, "
                                           "requested with another key: one request per piece of hardware")
        if request["state"] == RequestState.PENDING and claim["approve"] == Approval.AUTO:
            request = self._approve(request["device_id"], f"claim {claim['claim_id']} (auto)")
            self.access.record_audit(_device_entry("provision.approve", request, claim["approve"]))
        if request["state"] == RequestState.REJECTED:
            raise ProvisioningRefused(403, f"{request['device_id']} was rejected by an operator")
        if request["state"] == RequestState.PENDING:
            return Provisioned(202, {"status": "pending", "device_id": request["device_id"],
                                     "retry_after_s": self.pending_retry_s}, self.pending_retry_s)
        return Provisioned(200, self._approved(request))

    def _approved(self, request: dict) -> dict[str, Any]:
        return self.identity(request["device_id"], request["certificate"], request["not_after"], request["groups"])

    def identity(self, device_id: str, certificate_pem: str, not_after: float, groups: Sequence[str]) -> dict[str, Any]:
        """What a device keeps (docs/provisioning.md): the one answer of an approval and of a renewal
        (``api/renewal.py``), so that a renewed identity tells the same broker, manager and groups."""
        assert self.access.ca is not None
        return {"status": "approved", "device_id": device_id, "certificate": certificate_pem,
                "ca": self.access.ca.ca_file.read_text(), "broker": self._broker(), "manager_url": self.public_url(),
                "update_key": self.access.key.public_key_b64(), "groups": list(groups), "not_after": _iso(not_after)}

    def renew(self, device_id: str, csr_pem: str) -> dict[str, Any]:
        """A new certificate for the key of ``csr_pem`` (``device_id``'s, its current certificate authenticated it)
        and the answer a first boot got, its groups those its claim gave it (enrolled by hand: those it reports).
        ProvisioningRefused: 400 for a bad request, 409 on a manager that cannot tell it a broker."""
        self._broker()  # said before a certificate is signed
        assert self.access.certificates is not None
        certificate = self.access.certificates.issue(device_id, csr_pem)
        request = self.rows.request(device_id)
        groups = request["groups"] if request is not None else (self.db.get_device(device_id) or {}).get("groups")
        return self.identity(device_id, certificate.public_bytes(serialization.Encoding.PEM).decode("ascii"),
                             certificate.not_valid_after_utc.timestamp(), list(groups or []))

    def _approve(self, device_id: str, by: str) -> dict:
        request = self.rows.request(device_id)
        if request is None:
            raise LookupError(f"no provisioning request for {device_id!r}")
        if request["state"] != RequestState.PENDING:
            return request
        self._broker()  # a manager that cannot sign says so before the request changes
        cert, columns = self._signed(x509.load_pem_x509_csr(request["csr"].encode("ascii")), device_id, by)
        assert self.access.certificates is not None  # with the CA (checked above)
        self.access.certificates.record(device_id, cert)  # revocable: the CRL lists what was recorded
        decided = self.rows.decide(device_id, RequestState.APPROVED.value, columns)
        assert decided is not None
        return decided

    def _signed(self, csr: x509.CertificateSigningRequest, device_id: str,
                by: str) -> tuple[x509.Certificate, dict[str, Any]]:
        """The certificate for ``device_id``'s request, and the request's columns once approved with it."""
        assert self.access.ca is not None
        cert = self.access.ca.sign_csr(csr, device_id, days=self.cert_days)
        return cert, {"decided_at": time.time(), "decided_by": by,
                      "certificate": cert.public_bytes(serialization.Encoding.PEM).decode("ascii"),
                      "cert_serial": format(cert.serial_number, "x"),
                      "not_after": cert.not_valid_after_utc.timestamp()}

    def approve(self, device_id: str, by: str) -> dict:
        """Sign a pending device's certificate (its next poll gets it). LookupError: no such request;
        ProvisioningRefused(409): it was rejected."""
        decided = self._approve(device_id, by)
        if decided["state"] == RequestState.REJECTED:
            raise ProvisioningRefused(409, f"{device_id} was rejected: it cannot be approved")
        return _request_listed(decided)

    def reject(self, device_id: str, by: str) -> dict:
        """Refuse a pending device for good (its polls answer 403). LookupError; ProvisioningRefused(409) when it was
        approved already (revoke its certificate instead)."""
        decided = self.rows.decide(device_id, RequestState.REJECTED.value, {"decided_at": time.time(),
                                                                           "decided_by": by})
        if decided is None:
            raise LookupError(f"no provisioning request for {device_id!r}")
        if decided["state"] == RequestState.APPROVED:
            raise ProvisioningRefused(409, f"{device_id} was approved already: revoke its certificate instead")
        return _request_listed(decided)

    def requests(self, state: RequestState | str | None = None) -> list[dict]:
        return self.rows.list_requests(None if state is None else RequestState(state).value)


@dataclass(eq=False)
class _Asked:
    """One device's request, checked as far as it can be alone (its token's form, its CSR), waiting for its batch."""

    token: str
    claim_id: str
    csr_pem: str
    csr: x509.CertificateSigningRequest
    key_sha256: str
    hardware: dict[str, Any]
    remote: str | None
    #: (its request's row, its claim's row) once decided, or why it was refused
    outcome: tuple[dict, dict] | ProvisioningRefused | None = None

    @property
    def serial(self) -> str:
        return self.hardware["serial"]


class _RequestBatches:
    """Devices' requests decided a batch at a time (``util/group_commit.py``): a fleet flashed from one image asks by
    the thousand, and one transaction for many requests — their claims and earlier requests read in one statement
    each, the claim's places taken in one ``UPDATE``, the names checked in one, the rows written in one each — costs
    the manager and the database a fraction of a transaction each. A batch admits and names its devices in the order
    they asked, exactly as one at a time would."""

    MAX_BATCH = 64
    #: a batch that lost a race to another manager (a serial or a name it took first) is decided again, this often
    ATTEMPTS = 3

    def __init__(self, service: ClaimService) -> None:
        self.service = service
        self.commit: GroupCommit[_Asked] = GroupCommit(self._decide, max_batch=self.MAX_BATCH)

    def decide(self, asked: _Asked) -> tuple[dict, dict]:
        """The request's row and its claim's, once its batch is decided; ProvisioningRefused."""
        self.commit.run(asked)
        if isinstance(asked.outcome, ProvisioningRefused):
            raise asked.outcome
        assert asked.outcome is not None
        return asked.outcome

    def _decide(self, batch: Sequence[_Asked]) -> None:
        waiting = list(batch)
        while waiting:  # a second request for one serial waits for the first's: it is then a poll, or refused
            now, later, serials = [], [], set()
            for asked in waiting:
                (later if asked.serial in serials else now).append(asked)
                serials.add(asked.serial)
            for _attempt in range(self.ATTEMPTS):
                now = self._decide_once(now)
                if not now:
                    break
            for asked in now:
                asked.outcome = ProvisioningRefused(409, f"hardware.serial {asked.serial!r}: requests for it keep "
                                                         "colliding; ask again")
            waiting = later

    def _decide_once(self, batch: list[_Asked]) -> list[_Asked]:
        """Decide a batch of distinct serials in one transaction; those to decide again (another manager's request
        took a serial or a name first: nothing was written)."""
        with self.service.rows.batch() as tx:
            claims = tx.claims(asked.claim_id for asked in batch)
            earlier = tx.requests(asked.serial for asked in batch)
            new: dict[str, list[_Asked]] = {}
            for asked in batch:
                try:
                    claim = _check_token(claims.get(asked.claim_id), asked.token)
                    if asked.serial in earlier:
                        asked.outcome = (earlier[asked.serial], claim)  # a poll, or another device's serial
                        continue
                    next(device_names(claim["name_template"], asked.serial))  # a 400 before a place is taken
                    new.setdefault(asked.claim_id, []).append(asked)
                except ProvisioningRefused as exc:
                    asked.outcome = exc
            if not new:
                return []
            written: list[tuple[_Asked, dict, dict]] = []
            rows: dict[str, list[dict]] = {"requests": [], "certificates": [], "audit": []}
            for claim_id, asking in new.items():
                claim = self._admit(tx, claim_id, asking)
                admitted = [asked for asked in asking if asked.outcome is None]
                for asked, name in self._names(tx, claim, admitted).items():
                    written.append((asked, self._row(asked, claim, name, rows), claim))
            if not tx.write(rows["requests"], rows["certificates"], rows["audit"]):
                return [asked for asked, _row, _claim in written]
        for asked, row, claim in written:
            asked.outcome = (row, claim)
        return []

    @staticmethod
    def _admit(tx: Any, claim_id: str, asking: list[_Asked]) -> dict:
        """Take the claim's places for ``asking``, refuse (their outcome) those it does not admit, in order, and give
        their places back; the claim's row."""
        claim = tx.take_places(claim_id, len(asking))
        listed = tx.listed(claim_id, (asked.serial for asked in asking)) if claim["has_serials"] else set()
        used = claim["used"] - len(asking)
        for asked in asking:
            try:
                _admit(claim, used, asked.serial in listed)
                used += 1
            except ProvisioningRefused as exc:
                asked.outcome = exc
        tx.give_back(claim_id, claim["used"] - used)
        return claim

    @staticmethod
    def _names(tx: Any, claim: dict, asking: list[_Asked]) -> dict[_Asked, str]:
        """Each device's name: the first of :func:`device_names` no device, credential or request holds, nor a device
        of the batch that asked before it."""
        names = {asked: device_names(claim["name_template"], asked.serial) for asked in asking}
        wanted = {asked: next(names[asked]) for asked in asking}
        given: dict[_Asked, str] = {}
        while wanted:
            held = tx.holders(wanted.values()) | set(given.values())
            for asked, name in list(wanted.items()):
                if name in held:
                    wanted[asked] = next(names[asked])
                    continue
                given[asked] = name
                held.add(name)
                del wanted[asked]
        return {asked: given[asked] for asked in asking}

    def _row(self, asked: _Asked, claim: dict, name: str, rows: dict[str, list[dict]]) -> dict:
        """The request's row (approved with its certificate when the claim approves at once); its certificate's and
        its audit rows added to ``rows``."""
        service = self.service
        row = {"device_id": name, "serial": asked.serial, "claim_id": claim["claim_id"], "fleet": claim["fleet"],
               "groups": claim["groups"], "state": RequestState.PENDING.value, "public_key_sha256": asked.key_sha256,
               "csr": asked.csr_pem, "hardware": asked.hardware, "remote": asked.remote, "requested_at": time.time()}
        actions = ["provision.request"]
        if claim["approve"] == Approval.AUTO:
            assert service.access.certificates is not None  # with the CA (ClaimService.provision checked _broker)
            cert, columns = service._signed(asked.csr, name, f"claim {claim['claim_id']} (auto)")
            row.update(columns, state=RequestState.APPROVED.value)
            rows["certificates"].append(service.access.certificates.row(name, cert))
            actions.append("provision.approve")
        rows["requests"].append(row)
        rows["audit"] += service.access.db.audit_rows([_device_entry(action, row, claim["approve"])
                                                       for action in actions])
        return row


def _check_token(claim: dict | None, token: str) -> dict:
    """``claim``, when ``token`` is its token; else ProvisioningRefused(401). Compared even without a claim, so that an
    unknown id costs what a wrong secret costs."""
    if not hmac.compare_digest(claim["token_hash"] if claim else "0" * 64, token_hash(token)) or claim is None:
        raise ProvisioningRefused(401, "claim: not a claim this manager issued")
    return claim


def _admit(claim: dict, used: int, listed: bool) -> None:
    """Whether the claim admits one more device (raised: why not)."""
    state = claim_state(claim, used, time.time())
    if state == "exhausted":
        raise ProvisioningRefused(403, f"claim: it admits {claim['max_devices']} devices and has them (exhausted)")
    if state != "active":
        raise ProvisioningRefused(403, f"claim: it was {state}")
    if claim["has_serials"] and not listed:
        raise ProvisioningRefused(403, "hardware.serial: not on the claim's list of serials")


def _listed(row: dict, used: int, serials: int, now: float) -> dict:
    """A claim as listed: never its hash; its state, how many devices it holds, how many serials it lists."""
    public = {k: v for k, v in row.items() if k != "token_hash"}
    return {**public, "used": used, "serials": serials, "state": claim_state(row, used, now)}


def _request_listed(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("csr", "certificate")}


def _device_entry(action: str, request: dict, approve: str) -> dict:
    return {"actor": f"claim {request['claim_id']}", "role": None, "action": action, "target": request["device_id"],
            "remote": request["remote"], "detail": {"serial": request["serial"], "approve": approve,
                                                   "hardware": request["hardware"]}}


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat().replace("+00:00", "Z")
