"""A device's side of zero-touch provisioning as the tests play it: its own key, a CSR with an empty subject, and
``POST /api/v1/provision`` over HTTPS with the fleet CA (tests/fleet/test_claims.py, test_dashboard_pending.py)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from edgeinfer.fleet.api.rate_limit import PROVISION_PATH

#: what a Raspberry Pi says of itself besides its serial
HARDWARE = {"model": "Raspberry Pi 4 Model B Rev 1.5", "mac": "dc:a6:32:01:02:03"}


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def csr_of(key, subject: x509.Name | None = None) -> str:
    request = x509.CertificateSigningRequestBuilder().subject_name(subject or x509.Name([])).sign(key, hashes.SHA256())
    return request.public_bytes(serialization.Encoding.PEM).decode()


def provision(fleet, claim: str, serial: str, key=None, *, csr: str | None = None, body: bytes | None = None,
              hardware: dict | None = None) -> tuple[int, dict, Any]:
    """POST /api/v1/provision as a device does, over HTTPS with the fleet CA: (status, body, headers)."""
    document = {"claim": claim, "csr": csr if csr is not None else csr_of(key or new_key()),
                "hardware": {"serial": serial, **HARDWARE, **(hardware or {})}}
    request = urllib.request.Request(f"{fleet.http.url}{PROVISION_PATH}", method="POST",
                                     data=body if body is not None else json.dumps(document).encode(),
                                     headers={"Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=str(fleet.access.ca.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), exc.headers
