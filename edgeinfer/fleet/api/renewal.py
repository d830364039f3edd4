"""``POST /api/v1/provision/renew``: a device renews its client certificate, authenticated by the one it has.

The TLS handshake verified the certificate (``fleet/http.py``); :func:`~.deps.certificate_device` says whose it
is, or 401 (revoked, expired, not a device's). The request must have an empty subject (the manager names the
device: the new certificate's CN is the current one's). The answer is the one a first boot's approval gives
(docs/provisioning.md), so the agent keeps it the same way (``agent/identity.py``).
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from ...errors import ProvisioningRefused
from ..device_certs import MAX_CSR_BYTES
from .deps import Services, certificate_device
from .responses import errors

router = APIRouter(tags=["provisioning"])


class RenewRequest(BaseModel):
    """A certificate request (PEM PKCS#10, empty subject) for the device's key."""

    model_config = ConfigDict(strict=True, extra="ignore")
    csr: str = Field(min_length=1, max_length=MAX_CSR_BYTES)


class BrokerAddress(BaseModel):
    host: str
    port: int
    tls: bool


class ProvisionedIdentity(BaseModel):
    """What a device keeps: its certificate (PEM, CN = device id), the CA, where the broker and the manager are,
    the fleet's update key, its groups, and when the certificate expires (ISO 8601)."""

    model_config = ConfigDict(extra="allow")
    status: Literal["approved"]
    device_id: str
    certificate: str
    ca: str
    broker: BrokerAddress | None
    manager_url: str | None
    update_key: str
    groups: list[str]
    not_after: str


def identity_answer(fleet: Any, device_id: str, certificate: Any, groups: list[str]) -> dict[str, Any]:
    """The approved answer for ``device_id``'s new ``certificate`` (a cryptography Certificate)."""
    from cryptography.hazmat.primitives import serialization

    access = fleet.access
    return {"status": "approved", "device_id": device_id,
            "certificate": certificate.public_bytes(serialization.Encoding.PEM).decode(),
            "ca": access.ca.ca_file.read_text(), "broker": access.certificate_broker,
            "manager_url": access.manager_url, "update_key": access.key.public_key_b64(), "groups": groups,
            "not_after": certificate.not_valid_after_utc.astimezone(dt.timezone.utc).isoformat()}


def renewing_device(request: Request, fleet: Services) -> str:
    """The device whose certificate the handshake verified (a dependency: before the body is read); 401 without."""
    device_id = certificate_device(request, fleet)
    if device_id is None or fleet.access.certificates is None:
        raise HTTPException(401, "renewal needs the device's current client certificate (over https)")
    return device_id


@router.post("/api/v1/provision/renew", response_model=ProvisionedIdentity, responses=errors(400, 401),
             summary="A device renews its client certificate (its current certificate authenticates it)",
             description="Over HTTPS with the device's client certificate (valid, not revoked); the body is a "
                         "request with an empty subject. Answers as a first boot's approval does.")
def renew(body: RenewRequest, device_id: Annotated[str, Depends(renewing_device)], fleet: Services) -> Any:
    try:
        certificate = fleet.access.certificates.issue(device_id, body.csr)
    except ProvisioningRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None
    device = fleet.access.db.get_device(device_id)
    return identity_answer(fleet, device_id, certificate, list((device or {}).get("groups") or []))
