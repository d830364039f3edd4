"""The device's own identity by certificate: its key, its request, what the manager signed, and its hardware's name.

Everything lives in ``<data_dir>/identity/`` (docs/provisioning.md)::

    device.key      the private key (EC P-256, PEM), made here, mode 0600 — it never leaves the device
    request.csr     the certificate request (empty subject: the manager names the device), kept so that a
                    restarted agent sends the very same request while it is pending
    device.crt      the client certificate the manager signed (CN = the device id)
    ca.crt          the fleet's CA (verifies the broker and the manager; signed the certificate)
    identity.yaml   agent.yaml keys (device_id, broker, ca, cert, key, manager_url, update_public_key, groups)
                    laid over agent.yaml — written last, so its presence says the identity is whole

Each file is written atomically (``util/fs.py``): a power cut leaves the old file or the new one, never half, and
the key and request, or the certificate and CA, are flushed together before what depends on them is written.
:func:`hardware` reads what names the board under a root folder (``/`` on a device, a fake tree in tests,
like ``device/host.py``): the serial from the device tree, ``/proc/cpuinfo`` or ``/etc/machine-id``, the
device tree's model, the MAC of the first network interface that is not the loopback.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..util.fs import atomic_write_files
from ..util.yaml_text import dump_yaml, load_yaml

IDENTITY_DIR = "identity"
KEY_FILE = "device.key"
REQUEST_FILE = "request.csr"
CERT_FILE = "device.crt"
CA_FILE = "ca.crt"
IDENTITY_FILE = "identity.yaml"
#: the agent.yaml keys an identity sets (identity.yaml's keys)
IDENTITY_KEYS = ("device_id", "broker", "ca", "cert", "key", "manager_url", "update_public_key", "groups")
#: ``serial:`` in agent.yaml, else this variable, names the device for tests and simulations
SERIAL_ENV = "EDGEINFER_SERIAL"
_SERIAL_FILES = ("proc/device-tree/serial-number", "sys/firmware/devicetree/base/serial-number")
_MODEL_FILES = ("proc/device-tree/model", "sys/firmware/devicetree/base/model")


def identity_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / IDENTITY_DIR


# ------------------------------------------------------------------------------------------ hardware
def _read(root: Path, relative: str) -> str | None:
    try:
        text = (root / relative).read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    text = text.replace("\x00", "").strip()
    return text or None


def _cpuinfo_serial(root: Path) -> str | None:
    for line in (_read(root, "proc/cpuinfo") or "").splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "serial" and value.strip().strip("0"):
            return value.strip()
    return None


def _first_mac(root: Path) -> str | None:
    try:
        interfaces = sorted(p.name for p in (root / "sys/class/net").iterdir())
    except OSError:
        return None
    for name in interfaces:
        mac = _read(root, f"sys/class/net/{name}/address")
        if name != "lo" and mac and mac.strip("0:"):
            return mac.lower()
    return None


def hardware(root: str | os.PathLike[str] = "/", *, serial: str | None = None) -> dict[str, str | None]:
    """What names this board: ``{"serial", "model", "mac"}``. ``serial`` (agent.yaml's ``serial:`` or
    ``$EDGEINFER_SERIAL``) wins over what the hardware says; ValueError when nothing gives a serial."""
    base = Path(root)
    found = (serial or os.environ.get(SERIAL_ENV) or next(filter(None, (_read(base, f) for f in _SERIAL_FILES)), None)
             or _cpuinfo_serial(base) or _read(base, "etc/machine-id"))
    if not found:
        raise ValueError(f"no serial number under {base} (device tree, /proc/cpuinfo, /etc/machine-id): "
                         f"set serial: in agent.yaml")
    model = next(filter(None, (_read(base, f) for f in _MODEL_FILES)), None)
    return {"serial": found[:128], "model": model[:128] if model else None, "mac": _first_mac(base)}


# ------------------------------------------------------------------------------------ key and request
def _load_key(folder: Path) -> Any:
    """The device's private key on disk, or None when it has none yet."""
    from cryptography.hazmat.primitives import serialization

    try:
        pem = (folder / KEY_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return serialization.load_pem_private_key(pem, password=None)


def _new_key() -> tuple[Any, bytes]:
    """A new private key (EC P-256) and its PEM: SEC 1 (``EC PRIVATE KEY``), which OpenSSL 3.0 loads in half the
    time of PKCS#8 (every TLS context that presents the device's certificate loads it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption())


def _request_pem(key: Any) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def device_key(folder: Path) -> Any:
    """The device's private key: read, or made once with its request (:func:`certificate_request`)."""
    key = _load_key(folder)
    if key is None:
        certificate_request(folder)
        key = _load_key(folder)
    return key


def certificate_request(folder: Path) -> str:
    """The PEM request for the device's key, made once and kept (a pending device asks again with the same one);
    one made for another key (the key was replaced) is made again. A device without a key makes both, written
    together (one flush of the folder): a power cut leaves neither, the key alone (the request is made again) or
    both — the request goes out only once both are on disk."""
    from cryptography import x509

    key = _load_key(folder)
    if key is None:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key, pem = _new_key()
        text = _request_pem(key)
        atomic_write_files(folder, [(KEY_FILE, pem, 0o600), (REQUEST_FILE, text.encode(), 0o644)])
        return text
    try:
        text = (folder / REQUEST_FILE).read_text()
        if x509.load_pem_x509_csr(text.encode()).public_key() == key.public_key():
            return text
    except (FileNotFoundError, ValueError):
        pass
    text = _request_pem(key)
    atomic_write_files(folder, [(REQUEST_FILE, text.encode(), 0o644)])
    return text


# ------------------------------------------------------------------------------------------ identity
def write_identity(folder: Path, answer: Mapping[str, Any]) -> dict[str, Any]:
    """Keep what the manager answered (``status: approved``): the certificate and CA, then ``identity.yaml``
    (last: its presence says the identity is whole). The agent.yaml keys it sets.

    A power cut leaves the old identity or the new one: each file is replaced atomically, the certificate and CA
    are flushed to disk with their folder before identity.yaml is renamed into place, and identity.yaml's own
    rename is flushed last. Before then a new certificate may sit beside the old identity.yaml (a renewal: the
    same key, a certificate as good), never a new identity.yaml without its certificate."""

    broker = answer["broker"]
    atomic_write_files(folder, [(CA_FILE, str(answer["ca"]).encode(), 0o644),
                                (CERT_FILE, str(answer["certificate"]).encode(), 0o644)])
    keys = {"device_id": answer["device_id"], "broker": f"mqtts://{broker['host']}:{int(broker['port'])}",
            "ca": str(folder / CA_FILE), "cert": str(folder / CERT_FILE), "key": str(folder / KEY_FILE),
            "manager_url": answer.get("manager_url"), "update_public_key": answer.get("update_key"),
            "groups": list(answer.get("groups") or [])}
    keys = {k: v for k, v in keys.items() if v is not None}
    text = dump_yaml(keys, sort_keys=False)
    atomic_write_files(folder, [(IDENTITY_FILE, text.encode(), 0o644)])
    return keys


def read_identity(folder: Path) -> dict[str, Any] | None:
    """identity.yaml's agent.yaml keys, or None when the device has no whole identity yet."""
    import yaml

    try:
        data = load_yaml((folder / IDENTITY_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError) as exc:
        from ..errors import ConfigError

        raise ConfigError(f"{folder / IDENTITY_FILE}: cannot read the device's identity ({exc})") from None
    return {k: v for k, v in (data or {}).items() if k in IDENTITY_KEYS}


def certificate_life(path: Path) -> tuple[dt.datetime, dt.datetime]:
    """(not before, not after) of the certificate in ``path`` (UTC)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def renewal_time(not_before: dt.datetime, not_after: dt.datetime) -> dt.datetime:
    """When a certificate is renewed: at two thirds of its life (a third left to retry in)."""
    return not_before + (not_after - not_before) * 2 / 3
