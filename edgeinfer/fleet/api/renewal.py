"""``POST /api/v1/provision/renew``: a device renews its client certificate, authenticated by the one it has.

The TLS handshake verified the certificate (``fleet/http.py``); :func:`~.deps.certificate_device` says whose it
is, or 401 (revoked, expired, not a device's). The request must have an empty subject (the manager names the
device: the new certificate's CN is the current one's). The answer is the one a first boot's approval gives
(docs/provisioning.md), so the agent keeps it the same way (``agent/identity.py``).
"""

from __future__ import annotations

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


def renewing_device(request: Request, fleet: Services) -> str:
    """The device whose certificate the handshake verified (a dependency: before the body is read); 401 without."""
    device_id = certificate_device(request, fleet)
    if device_id is None or fleet.access.certificates is None:
        raise HTTPException(401, "renewal needs the device's current client certificate (over https)")
    return device_id


@router.post("/api/v1/provision/renew", response_model=ProvisionedIdentity, responses=errors(400, 401, 409),
             summary="A device renews its client certificate (its current certificate authenticates it)",
             description="Over HTTPS with the device's client certificate (valid, not revoked); the body is a "
                         "request with an empty subject. Answers as a first boot's approval does.")
def renew(body: RenewRequest, device_id: Annotated[str, Depends(renewing_device)], fleet: Services) -> Any:
    try:
        return fleet.claims.renew(device_id, body.csr)  # the answer of a first boot's approval (fleet/claims.py)
    except ProvisioningRefused as exc:
        raise HTTPException(exc.status, str(exc)) from None
