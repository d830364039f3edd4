"""What crosses the API for zero-touch provisioning (fleet/claims.py): a device's request with its claim and CSR, the
answers it gets (approved with its certificate, or pending), a claim as an admin creates and lists it, and a
provisioning request as an operator sees it. The bounds are declared here once: the manager validates by them, the
OpenAPI document states them, the dashboard reads them from it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, StringConstraints, field_validator

from ...link.protocol import ID_PATTERN
from ..claims import (
    CLAIM_STATES,
    CSR_FORMAT,
    DEFAULT_CLAIM_S,
    DEFAULT_TEMPLATE,
    MAC_PATTERN,
    MAX_CLAIM_S,
    MAX_SERIALS,
    SERIAL_PATTERN,
    TEMPLATE_PATTERN,
    Approval,
    RequestState,
)
from ..device_certs import MAX_CSR_BYTES
from .schemas import PRINTABLE_PATTERN, Row, Strict, _integral

#: how a device's request body may be at most (its CSR, its claim, its hardware)
MAX_PROVISION_BODY = 16_384
#: the groups a claim puts its devices in
MAX_GROUPS = 32
#: the most devices one claim may admit
MAX_CLAIM_DEVICES = 1_000_000

Serial = Annotated[str, StringConstraints(pattern=SERIAL_PATTERN)]
GroupName = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


class Hardware(Strict):
    """What identifies the device's hardware: its serial (one request per serial) and, to show an operator, its model
    (the device tree's) and MAC."""

    serial: Serial = Field(description="the board's serial number (the device tree's serial-number)")
    model: Annotated[str, StringConstraints(max_length=128, pattern=PRINTABLE_PATTERN)] | None = None
    mac: Annotated[str, StringConstraints(pattern=MAC_PATTERN)] | None = None


class ProvisionRequest(Strict):
    """A device with a claim and no identity asks for its certificate; the same request again is its poll."""

    claim: Annotated[str, StringConstraints(min_length=1, max_length=128)] = Field(
        description="the claim token baked into the image (edgeinfer fleet claim create)")
    csr: Annotated[str, StringConstraints(min_length=1, max_length=MAX_CSR_BYTES)] = Field(
        json_schema_extra={"format": CSR_FORMAT},
        description="a PEM PKCS#10 request for the device's own key, with an empty subject (the manager names the "
                    "device)")
    hardware: Hardware


class BrokerAddress(BaseModel):
    host: str
    port: int
    tls: bool


class Approved(BaseModel):
    """The device's identity: its certificate (CN = its id), the CA, where to connect, the update key, its groups."""

    status: Literal["approved"]
    device_id: str
    certificate: str = Field(description="PEM, CN = device_id, clientAuth")
    ca: str = Field(description="the fleet CA (PEM): it signed the broker's and the API's certificates")
    broker: BrokerAddress
    manager_url: str
    update_key: str = Field(description="the fleet's update key, as agent.yaml's update_public_key takes it")
    groups: list[str]
    not_after: str = Field(description="when the certificate expires (ISO 8601, UTC)")


class Pending(BaseModel):
    """The request waits for an operator: ask again after ``retry_after_s`` (also the Retry-After header)."""

    status: Literal["pending"]
    device_id: str
    retry_after_s: int


class ClaimSpec(Strict):
    """A new claim: the groups its devices join, how long it admits devices, how many, how they are approved,
    which serials (none: any) and how they are named."""

    groups: list[GroupName] = Field(min_length=1, max_length=MAX_GROUPS)
    expires_s: float | None = Field(DEFAULT_CLAIM_S, gt=0, le=MAX_CLAIM_S,
                                    description="its lifetime in seconds (null: until revoked)")
    max_devices: Annotated[int, Field(ge=1, le=MAX_CLAIM_DEVICES), BeforeValidator(_integral)] | None = None
    approve: Annotated[Approval, Field(strict=False)] = Approval.AUTO
    serials: list[Serial] | None = Field(None, min_length=1, max_length=MAX_SERIALS,
                                         description="only these serials (null: any)")
    name_template: str = Field(DEFAULT_TEMPLATE, pattern=TEMPLATE_PATTERN,
                               description="the device id: {serial} replaced by the serial (a ':' written '-')")

    @field_validator("groups")
    @classmethod
    def _once_each(cls, groups: list[str]) -> list[str]:
        if len(set(groups)) != len(groups):
            raise ValueError("a group appears twice")
        return groups


class Claim(Row):
    """A claim as listed: never its token (the manager keeps a hash)."""

    claim_id: str
    fleet: str
    groups: list[str]
    approve: Approval
    max_devices: int | None = None
    name_template: str
    created_at: float
    created_by: str | None = None
    expires_at: float | None = None
    revoked_at: float | None = None
    used: int = Field(description="its pending and approved devices")
    serials: int = Field(description="how many serials it lists (0: any)")
    state: Literal[CLAIM_STATES]  # type: ignore[valid-type]


class ClaimCreated(Claim):
    """A new claim: the only answer that shows its token, with the agent.yaml keys of the image."""

    token: str
    agent_config: dict[str, Any] = Field(description="the image's agent.yaml keys: claim, manager_url, ca, "
                                                     "update_public_key")
    ca_pem: str = Field(description="the fleet CA (PEM): the file agent_config's ca names, beside agent.yaml")


class ProvisioningRequest(Row):
    """A device's provisioning request as an operator sees it: the hardware facts, where it came from, its state."""

    device_id: str
    serial: str
    claim_id: str
    fleet: str
    groups: list[str]
    state: RequestState
    public_key_sha256: str
    hardware: dict[str, Any]
    remote: str | None = None
    requested_at: float
    decided_at: float | None = None
    decided_by: str | None = None
    cert_serial: str | None = None
    not_after: float | None = None
