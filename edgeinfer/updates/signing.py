"""Ed25519 keys, signed update manifests and signed commands.

The fleet manager holds the private key (``edgeinfer keys init``); every agent pins the public key
in its config. A manifest is canonical JSON (sorted keys, no whitespace) so the signature covers
exactly the bytes both sides compute, whatever JSON library produced the message.

A ``cmd`` message that changes a device's state is signed too (:func:`sign_command`): the signature
covers the whole message but ``sig`` — id, command, arguments, the target ``device`` and the
``expires`` time — so it cannot be replayed on another device, altered, or kept for later than its
expiry (at most :data:`MAX_COMMAND_TTL_S` ahead); the agent's command log refuses the same id twice.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._fs import atomic_write_bytes, atomic_write_text
from .._optional import import_optional
from ..errors import CommandRejected, ConfigError, UpdateRejected

PRIVATE_KEY_FILE = "fleet-signing.key"
PUBLIC_KEY_FILE = "fleet-signing.pub"
MANIFEST_VERSION = 1
DEFAULT_MANIFEST_TTL_S = 7 * 24 * 3600
#: how far ahead a signed command may expire: a deploy lives as long as its manifest (7 days), plus a margin
MAX_COMMAND_TTL_S = 8 * 24 * 3600
#: the expiry the fleet gives a command that has no manifest to follow (rollback, restart_pipeline, ping)
COMMAND_TTL_S = 24 * 3600
#: the field of a ``cmd`` message that holds its signature (everything else in the message is signed)
SIGNATURE_FIELD = "sig"


def canonical_json(data: dict) -> bytes:
    """The exact bytes that are signed: sorted keys, compact separators, UTF-8."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: how a deployment kind's word looks (which words there are is link/vocabulary.py's DeploymentKind)
KIND_FORM = re.compile(r"[a-z][a-z_]{0,31}")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a deploy promises: this artifact (sha256, size) is version V for these targets until expiry.

    ``kind`` is the deployment's kind (link/vocabulary.py ``DeploymentKind``); None is a model, and a model's
    manifest leaves the field out (:meth:`to_dict`), so agents older than kinds, whose manifest has no such field,
    keep taking models and refuse every other kind (``bad_manifest``: an unexpected field). ``model_name`` is the
    artifact's name, whatever its kind.
    """

    deployment_id: str
    model_name: str
    version: int
    sha256: str
    size: int
    url: str
    target: str  # "all", "group:<g>" or "device:<id>[,<id>...]"
    issued_at: float
    expires_at: float
    rollback: bool = False
    manifest_version: int = MANIFEST_VERSION
    extra: dict = field(default_factory=dict)
    kind: str | None = None

    def to_dict(self) -> dict:
        """The fields as signed and sent; ``kind`` only when it is not a model's."""
        data = asdict(self)
        if data["kind"] is None:
            del data["kind"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        """Build from a decoded message; UpdateRejected('bad_manifest') when fields are wrong."""
        try:
            manifest = cls(**data)
        except TypeError as exc:
            raise UpdateRejected("bad_manifest", str(exc)) from None
        manifest.validate()
        return manifest

    def validate(self) -> None:
        """Field-level checks, independent of the signature."""
        problems = []
        hex_digits = set("0123456789abcdef")
        if not (isinstance(self.sha256, str) and len(self.sha256) == 64 and set(self.sha256) <= hex_digits):
            problems.append("sha256 must be 64 lowercase hex digits")
        if not isinstance(self.size, int) or self.size <= 0:
            problems.append("size must be a positive integer")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            problems.append("version must be a non-negative integer")
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            problems.append("url must be http(s)")
        if self.kind is not None and not (isinstance(self.kind, str) and KIND_FORM.fullmatch(self.kind)):
            problems.append("kind must be a word of a-z and _")
        if self.manifest_version != MANIFEST_VERSION:
            problems.append(f"manifest_version {self.manifest_version} is not supported")
        if problems:
            raise UpdateRejected("bad_manifest", "; ".join(problems))


def new_manifest(*, model_name: str, version: int, sha256: str, size: int, url: str, target: str,
                 deployment_id: str | None = None, ttl_s: float = DEFAULT_MANIFEST_TTL_S,
                 rollback: bool = False, now: float | None = None, kind: str | None = None) -> Manifest:
    """A fresh manifest with a new deployment id and an expiry ``ttl_s`` from now (``kind``: None for a model)."""
    issued = time.time() if now is None else now
    return Manifest(
        deployment_id=deployment_id or uuid.uuid4().hex, model_name=model_name, version=version,
        sha256=sha256, size=size, url=url, target=target, issued_at=issued, expires_at=issued + ttl_s,
        rollback=rollback, kind=kind,
    )


# ------------------------------------------------------------------------------------------ keys

def _require_cryptography() -> None:
    """MissingDependency naming the pip extra when ``cryptography`` (Ed25519) is not installed."""
    import_optional("cryptography", "fleet", "signed model updates")


class SigningKey:
    """The fleet's Ed25519 private key."""

    def __init__(self, private_key) -> None:
        self._key = private_key

    @classmethod
    def generate(cls) -> SigningKey:
        """A new random key."""
        _require_cryptography()
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike) -> SigningKey:
        """Read a PEM (PKCS8) private key; ConfigError if missing or not Ed25519."""
        _require_cryptography()
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key_path = Path(path)
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except FileNotFoundError:
            raise ConfigError(f"signing key not found: {key_path} — run `edgeinfer keys init`") from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{key_path} is not a PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"{key_path} is not an Ed25519 key")
        return cls(key)

    def save(self, directory: str | os.PathLike, *, overwrite: bool = False) -> tuple[Path, Path]:
        """Write the private key (mode 0600) and the public key; refuses to overwrite by default."""
        from cryptography.hazmat.primitives import serialization

        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        private_path, public_path = folder / PRIVATE_KEY_FILE, folder / PUBLIC_KEY_FILE
        if private_path.exists() and not overwrite:
            raise ConfigError(f"{private_path} exists — refusing to replace a fleet key (use --force)")
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        atomic_write_bytes(private_path, pem, mode=0o600)
        atomic_write_text(public_path, self.public_key_b64() + "\n")
        return private_path, public_path

    def public_key_b64(self) -> str:
        """The raw 32-byte public key, base64: what agents pin in their config."""
        from cryptography.hazmat.primitives import serialization

        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode("ascii")

    def sign(self, manifest: Manifest) -> str:
        """Base64 Ed25519 signature over the manifest's canonical JSON."""
        return self.sign_bytes(canonical_json(manifest.to_dict()))

    def sign_bytes(self, data: bytes) -> str:
        """Base64 Ed25519 signature over ``data`` (what :meth:`VerifyKey.verify_bytes` checks)."""
        return base64.b64encode(self._key.sign(data)).decode("ascii")


class VerifyKey:
    """A pinned Ed25519 public key."""

    def __init__(self, public_key_b64: str) -> None:
        # checked now (a config error at start), loaded into cryptography on the first signature to verify:
        # an agent that is never sent an update or a command never maps its Rust library
        try:
            present = importlib.util.find_spec("cryptography") is not None
        except ImportError:
            present = False
        if not present:
            _require_cryptography()  # MissingDependency with the install hint
        try:
            raw = base64.b64decode(public_key_b64.strip(), validate=True)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"not a base64 Ed25519 public key: {exc}") from None
        if len(raw) != 32:
            raise ConfigError(f"not a base64 Ed25519 public key: {len(raw)} bytes, not 32")
        self._raw = raw
        self._loaded: Any = None

    @property
    def _key(self) -> Any:
        if self._loaded is None:
            _require_cryptography()
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            self._loaded = Ed25519PublicKey.from_public_bytes(self._raw)
        return self._loaded

    @classmethod
    def from_config_value(cls, value: str) -> VerifyKey:
        """Accept the key itself or a path to a file holding it."""
        candidate = Path(value).expanduser()
        if len(value) < 200 and candidate.is_file():
            return cls(candidate.read_text())
        return cls(value)

    def verify(self, manifest_data: dict, signature_b64: str, *, now: float | None = None) -> Manifest:
        """Check the signature and expiry; return the Manifest or raise UpdateRejected."""
        try:
            data = canonical_json(manifest_data)
        except (TypeError, ValueError):  # not JSON-able: no signature can cover it
            data = None
        if data is None or not self.verify_bytes(data, signature_b64):
            raise UpdateRejected("bad_signature", "the manifest is not signed by the pinned fleet key")
        manifest = Manifest.from_dict(manifest_data)
        if (time.time() if now is None else now) > manifest.expires_at:
            raise UpdateRejected("expired", f"the manifest expired at {manifest.expires_at:.0f}")
        return manifest

    def verify_bytes(self, data: bytes, signature_b64: Any) -> bool:
        """True when ``signature_b64`` is this key's base64 Ed25519 signature of ``data``; never raises on bad input."""
        from cryptography.exceptions import InvalidSignature

        if not isinstance(signature_b64, str):
            return False
        try:
            raw = base64.b64decode(signature_b64, validate=True)
            # one spelling per signature: base64 ignores a final character's unused bits, and a second
            # spelling of a valid signature must not pass for a different message
            if base64.b64encode(raw).decode("ascii") != signature_b64:
                return False
            self._key.verify(raw, data)
        except (InvalidSignature, ValueError, TypeError):  # binascii.Error is a ValueError
            return False
        return True

    def verify_command(self, message: Mapping[str, Any], *, device_id: str, now: float | None = None,
                       max_ttl_s: float = MAX_COMMAND_TTL_S) -> None:
        """Check a ``cmd`` message's signature, target device and expiry; CommandRejected says which failed.

        The agent calls the two halves separately (:meth:`verify_command_signature`, then its duplicate
        check, then :func:`check_command_expiry`), so that a late copy of a command it already ran is
        answered as a duplicate rather than as expired.
        """
        self.verify_command_signature(message, device_id=device_id)
        check_command_expiry(message, now=now, max_ttl_s=max_ttl_s)

    def verify_command_signature(self, message: Mapping[str, Any], *, device_id: str) -> None:
        """The signature is this key's over the message (less ``sig``), for ``device_id``, with an expiry.

        Reasons: ``unsigned``, ``bad_signature``, ``wrong_device``, ``no_expiry``.
        """
        signature = message.get(SIGNATURE_FIELD)
        if signature is None:
            raise CommandRejected("unsigned", "a state-changing command must be signed by the fleet key")
        try:
            data = canonical_json({k: v for k, v in message.items() if k != SIGNATURE_FIELD})
        except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError (a lone surrogate) is a ValueError
            raise CommandRejected("bad_signature", f"the command cannot be put in canonical form: {exc}") from None
        if not self.verify_bytes(data, signature):
            raise CommandRejected("bad_signature", "the command is not signed by the pinned fleet key")
        if message.get("device") != device_id:
            raise CommandRejected("wrong_device", f"the command is signed for device {message.get('device')!r}, "
                                                  f"not {device_id!r}")
        if message.get("expires") is None:
            raise CommandRejected("no_expiry", "a signed command must carry an expiry")


def check_command_expiry(message: Mapping[str, Any], *, now: float | None = None,
                         max_ttl_s: float = MAX_COMMAND_TTL_S) -> None:
    """The command's ``expires`` is present, not past, and at most ``max_ttl_s`` ahead (a signature that
    would stay good for months is as dangerous as none). Reasons: ``no_expiry``, ``expired``, ``expiry_too_far``."""
    expires = message.get("expires")
    if isinstance(expires, bool) or not isinstance(expires, (int, float)):
        raise CommandRejected("no_expiry", "a signed command must carry an expiry (UNIX time)")
    current = time.time() if now is None else now
    if not expires >= current:  # also NaN
        raise CommandRejected("expired", f"the command expired at {expires:.0f}")
    if expires > current + max_ttl_s:
        raise CommandRejected("expiry_too_far", f"the command expires at {expires:.0f}, more than "
                                                f"{max_ttl_s:.0f} s from now")


def sign_command(key: SigningKey, message: Mapping[str, Any], *, device_id: str, expires: float) -> dict[str, Any]:
    """A copy of the ``cmd`` message bound to ``device_id`` until ``expires``, signed by ``key``.

    Any ``sig`` already there is replaced; the fleet calls this after :func:`~edgeinfer.link.protocol.make_command`.
    """
    signed = {k: v for k, v in message.items() if k != SIGNATURE_FIELD}
    signed["device"] = device_id
    signed["expires"] = expires
    signed[SIGNATURE_FIELD] = key.sign_bytes(canonical_json(signed))
    return signed
