"""Who may call the fleet manager's API: bearer tokens with a role, kept as hashes, and the audit log.

A token is ``eit_<id>_<secret>``: the id finds its row, the secret (32 random bytes) is never
stored — the database keeps the SHA-256 of the whole token, compared in constant time. A plain
hash is enough because the secret is random and long (there is nothing to guess, unlike a
password); a slow hash would only make every API call slower.

Roles are ordered: ``viewer`` reads, ``operator`` also deploys, rolls back, restarts and aborts,
``admin`` also manages tokens and enrols devices. ``fleet serve`` writes an admin token to
``<data_dir>/admin.token`` (mode 0600) on a first start, when the database holds no usable admin
token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AuthError
from ..link.vocabulary import Word
from ..updates.signing import SigningKey, VerifyKey
from ..util.fs import atomic_write_bytes
from .broker_auth import verify_password
from .db import FleetDB

log = logging.getLogger(__name__)


class Role(Word):
    """What a token may do; each role may do what the ones before it may."""

    #: reads
    VIEWER = "viewer"
    #: also deploys, rolls back, restarts and aborts
    OPERATOR = "operator"
    #: also manages tokens and enrols devices
    ADMIN = "admin"


ROLES = tuple(Role)
TOKEN_PREFIX = "eit_"
TOKEN_ID_PATTERN = r"^[0-9a-f]{12}$"
TOKEN_RE = re.compile(r"eit_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
#: a token's name
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._@-]{0,63}$"
NAME_RE = re.compile(NAME_PATTERN)
ADMIN_TOKEN_FILE = "admin.token"
#: how often last_used_at is written for one token (a write per request would slow every read)
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class Principal:
    """Who made a request: the token's id, name and role (what the audit log records)."""

    token_id: str
    name: str
    role: Role

    def may(self, role: Role) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> tuple[str, str]:
    """(token id, the whole token)."""
    token_id = secrets.token_hex(6)
    return token_id, f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"


def issue_grant(key: SigningKey, sha256: str, device_id: str, expires: float) -> str:
    """A download grant for one artifact: ``<expiry>.<device>.<signature>``, signed by the fleet key.

    It travels in the (signed) deploy command and is shown as ``?grant=`` on the artifact URL, so a
    device without an enrolled credential (an external broker) can still download that one file
    until the grant expires — a short-lived signed URL. The device id is only recorded.
    """
    body = f"{sha256}.{device_id}.{int(expires)}"
    signature = key.sign_bytes(body.encode()).replace("+", "-").replace("/", "_").rstrip("=")
    return f"{int(expires)}.{device_id}.{signature}"


def grant_allows(verify_key: VerifyKey, grant: str, sha256: str, *, now: float | None = None) -> bool:
    """Whether ``grant`` (from :func:`issue_grant`) opens ``sha256`` now."""
    expires, _, rest = (grant or "").partition(".")
    device_id, _, signature = rest.rpartition(".")
    if not expires.isdigit() or int(expires) < (time.time() if now is None else now) or not device_id:
        return False
    standard = signature.replace("-", "+").replace("_", "/")
    standard += "=" * (-len(standard) % 4)
    return bool(verify_key.verify_bytes(f"{sha256}.{device_id}.{expires}".encode(), standard))


class TokenStore:
    """Who may call the API: tokens in the fleet database (``api_tokens``), enrolled devices'
    credentials (``device_credentials``) and download grants for artifacts."""

    def __init__(self, db: FleetDB, *, grant_key: VerifyKey | None = None) -> None:
        """``grant_key``: the fleet's VerifyKey, to accept download grants (none: grants are refused)."""
        self.db = db
        self.grant_key = grant_key
        self._last_used: dict[str, float] = {}

    def grant_allows(self, grant: str, sha256: str) -> bool:
        return self.grant_key is not None and grant_allows(self.grant_key, grant, sha256)

    def create(self, *, name: str, role: Role | str, expires_in_s: float | None = None,
               created_by: str | None = None) -> dict:
        """A new token: the row as listed, plus ``token`` (the only time it is ever shown)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(r.value for r in ROLES)}, not {role!r}")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError("name must be 1-64 characters: letters, digits, space . _ @ -")
        if expires_in_s is not None and not 0 < expires_in_s <= 10 * 365 * 86_400:
            raise ValueError("expires must be within ten years")
        token_id, token = new_token()
        now = time.time()
        row = {"token_id": token_id, "name": name, "role": Role(role).value, "token_hash": token_hash(token),
               "created_at": now, "created_by": created_by, "expires_at": now + expires_in_s if expires_in_s else None}
        self.db.insert_token(row)
        return _public(row) | {"token": token}

    def list(self) -> list[dict]:
        return [_public(row) for row in self.db.list_tokens()]

    def revoke(self, token_id: str) -> dict:
        row = self.db.revoke_token(token_id, time.time())
        if row is None:
            raise LookupError(f"no token {token_id!r}")
        return _public(row)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer <token>`` header; AuthError(401) otherwise."""
        if not authorization:
            raise AuthError(401, "this API needs a token: Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        match = TOKEN_RE.fullmatch(token) if scheme.lower() == "bearer" else None
        row = self.db.get_token(match.group(1)) if match else None
        # compare even without a row, so an unknown id costs what a wrong secret costs
        expected = row["token_hash"] if row else "0" * 64
        if not hmac.compare_digest(expected, token_hash(token)) or row is None:
            raise AuthError(401, "the token is not valid")
        now = time.time()
        if row["revoked_at"] is not None:
            raise AuthError(401, f"the token {row['name']!r} was revoked")
        if row["expires_at"] is not None and row["expires_at"] < now:
            raise AuthError(401, f"the token {row['name']!r} expired")
        if now - self._last_used.get(row["token_id"], 0.0) > LAST_USED_EVERY_S:
            self._last_used[row["token_id"]] = now
            self.db.touch_token(row["token_id"], now)
        return Principal(row["token_id"], row["name"], Role(row["role"]))

    def device_login(self, username: str, password: str) -> bool:
        """Whether an enrolled, not revoked device presents its MQTT credential (artifact downloads)."""
        return self.device_identity(username, password) is not None

    def device_identity(self, username: str, password: str) -> str | None:
        """The device id of the enrolled, not revoked device whose MQTT credential this is; None otherwise.
        (An enrolled device's username is ``edgeinfer-<fleet>-<device id>``; its credential row says which.)"""
        credential = self.db.credential_for(username)
        if credential and credential["revoked_at"] is None and verify_password(password, credential["password_hash"]):
            return str(credential["device_id"])
        return None

    def has_admin(self) -> bool:
        now = time.time()
        return any(r["role"] == Role.ADMIN and r["revoked_at"] is None and (r["expires_at"] or now + 1) > now
                   for r in self.db.list_tokens())

    def ensure_admin_token(self, data_dir: Path) -> Path | None:
        """On a first start (no usable admin token): create one, write it to ``admin.token`` (0600); its path."""
        if self.has_admin():
            return None
        created = self.create(name="admin", role=Role.ADMIN, created_by="fleet serve")
        path = Path(data_dir) / ADMIN_TOKEN_FILE
        atomic_write_bytes(path, (created["token"] + "\n").encode(), mode=0o600)
        self.db.audit(actor="fleet serve", role=None, action="token.create", target=created["token_id"],
                      remote=None, detail={"name": "admin", "role": "admin", "file": str(path)})
        return path


def _public(row: dict) -> dict:
    """A token's row without its hash."""
    return {k: v for k, v in row.items() if k != "token_hash"}
