"""Who may reach the fleet (admin): API tokens, devices' MQTT credentials (enrolment, revocation), the
audit log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query

from ...link.protocol import ID_PATTERN
from ..auth import TOKEN_ID_PATTERN
from .deps import Admin, Services
from .responses import errors
from .schemas import (
    MAX_DEVICES,
    AuditEntry,
    EnrollArgs,
    EnrollBatch,
    Enrolled,
    Enrollment,
    Revoked,
    Token,
    TokenCreated,
    TokenSpec,
)

MAX_AUDIT_LIMIT = 10_000

router = APIRouter(tags=["access"])
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]


@router.get("/api/tokens", response_model=list[Token], responses=errors(401, 403),
            summary="Every API token (never the token itself) (admin)")
def list_tokens(_who: Admin, fleet: Services) -> Any:
    return fleet.access.tokens.list()


@router.post("/api/tokens", status_code=201, response_model=TokenCreated, responses=errors(400, 401, 403),
             summary="Create a token; the answer is the only time it is shown (admin)")
def create_token(spec: TokenSpec, who: Admin, fleet: Services) -> Any:
    created = fleet.access.tokens.create(name=spec.name, role=spec.role, expires_in_s=spec.expires_s,
                                         created_by=who.principal.name)
    who.audit("token.create", created["token_id"], name=created["name"], role=created["role"],
              expires_at=created["expires_at"])
    return created


@router.delete("/api/tokens/{token_id}", response_model=Token, responses=errors(400, 401, 403, 404),
               summary="Revoke a token (admin)")
def revoke_token(token_id: Annotated[str, Path(pattern=TOKEN_ID_PATTERN, description="a token's id")], who: Admin,
                 fleet: Services) -> Any:
    try:
        revoked = fleet.access.tokens.revoke(token_id)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    who.audit("token.revoke", token_id, name=revoked["name"])
    return revoked


@router.get("/api/enrollments", response_model=list[Enrollment], responses=errors(401, 403),
            summary="Every enrolled device's MQTT account (no passwords) (admin)")
def list_enrollments(_who: Admin, fleet: Services) -> Any:
    return fleet.access.list_enrollments()


# exclude_none: the answer is what goes into agent.yaml, so an identity's keys only (no `certificate: null`)
@router.post("/api/devices/{device_id}/enroll", status_code=201, response_model=Enrolled,
             response_model_exclude_none=True,
             responses=errors(400, 401, 403, 409), summary="Issue a device's MQTT credential (admin)",
             description="Answers what goes into the device's agent.yaml; the password (or, with `certificate`, "
                         "the private key) is shown only here. Enrolling again issues a new one.")
def enroll(device_id: DeviceId, who: Admin, fleet: Services,
           body: Annotated[EnrollArgs | None, Body()] = None) -> Any:
    args = body or EnrollArgs()
    issued = _enrolled(lambda: fleet.access.enroll_device(device_id, args.fleet, certificate=args.certificate))
    who.audit("device.enroll", device_id, fleet=issued["fleet"], certificate=args.certificate)
    return issued


def _enrolled(enroll: Any) -> Any:
    """What ``enroll()`` issues; 409 when it cannot where things stand (a certificate from a manager without the
    fleet's CA, a device id the fleet keeps for its own names)."""
    try:
        return enroll()
    except ValueError as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("/api/enrollments", status_code=201, response_model=list[Enrolled],
             response_model_exclude_none=True,
             responses=errors(400, 401, 403, 409),
             summary="Enrol many devices with one broker reload (admin)",
             description=f"At most {MAX_DEVICES:,} devices; answers a list, each entry what "
                         "/api/devices/{device_id}/enroll answers.")
def enroll_many(batch: EnrollBatch, who: Admin, fleet: Services) -> Any:
    issued = _enrolled(lambda: fleet.access.enroll_devices(batch.devices, batch.fleet, certificate=batch.certificate))
    fleet.access.record_audit(*(who.entry("device.enroll", e["device_id"], fleet=e["fleet"],
                                          certificate=batch.certificate) for e in issued))
    return issued


@router.post("/api/devices/{device_id}/revoke", response_model=Revoked, responses=errors(400, 401, 403, 404),
             summary="Revoke a device's MQTT credential: it can no longer connect or download (admin)")
def revoke_device(device_id: DeviceId, who: Admin, fleet: Services) -> Any:
    try:
        result = fleet.access.revoke_device(device_id)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    who.audit("device.revoke", device_id)
    return result


@router.get("/api/audit", response_model=list[AuditEntry], responses=errors(400, 401, 403),
            summary="The audit log, newest last: who, what, when, from where (admin)")
def audit_log(_who: Admin, fleet: Services, limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_LIMIT)] = 100) -> Any:
    return fleet.access.list_audit(limit)
