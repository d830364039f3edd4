"""Zero-touch provisioning (fleet/claims.py): a device's request with its claim (no token: the claim is its
credential; rate limited per address), claims (admin: create, list, revoke) and provisioning requests (admin: list,
approve, reject). Every change an admin makes is audited; a device's request is audited by the service."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from ...errors import ProvisioningRefused
from ...link.protocol import ID_PATTERN
from ..claims import CLAIM_ID_PATTERN, RequestState
from .deps import Admin, Services
from .provision_schemas import (
    MAX_PROVISION_BODY,
    Approved,
    Claim,
    ClaimCreated,
    ClaimSpec,
    Pending,
    ProvisioningRequest,
    ProvisionRequest,
)
from .rate_limit import PROVISION_PATH
from .responses import errors
from .samples import _body
from .schemas import describe_error

router = APIRouter(tags=["provisioning"])
ClaimId = Annotated[str, Path(pattern=CLAIM_ID_PATTERN, description="a claim's id")]
DeviceId = Annotated[str, Path(pattern=ID_PATTERN, description="a device id")]
#: the bodies read here (bounded first): their models are the document's (app.document)
UPLOADS = (ProvisionRequest,)

PENDING_ANSWER = {"model": Pending, "description": "Pending an operator's approval: ask again (the same request) "
                  "after Retry-After seconds", "headers": {"Retry-After": {
                      "description": "seconds to wait before asking again", "schema": {"type": "integer"}}}}


def _refused(exc: ProvisioningRefused) -> HTTPException:
    return HTTPException(exc.status, str(exc))


@router.post(PROVISION_PATH, response_model=Approved, responses={202: PENDING_ANSWER,
             **errors(400, 401, 403, 409, 411, 413, 429)}, openapi_extra={"requestBody": {
                 "required": True, "content": {"application/json": {
                     "schema": {"$ref": f"#/components/schemas/{ProvisionRequest.__name__}"}}}}},
             summary="A device trades its claim and CSR for its certificate (no token: the claim)",
             description="The same request again (same claim, serial and public key) is the poll of a pending "
                         "device, and answers the certificate again once approved. 400: a malformed body or CSR, or a "
                         "CSR with a subject (it must be empty: the manager names devices); 401: an unknown claim; "
                         "403: a claim expired, revoked or used up, a serial not on its list, a device rejected; "
                         "409: this serial was requested with another key; 429: too many requests from this "
                         "address (Retry-After).")
async def provision(request: Request, fleet: Services) -> Any:
    body = await _body(request, MAX_PROVISION_BODY)
    try:
        asked = ProvisionRequest.model_validate_json(body)
    except ValidationError as exc:
        raise HTTPException(400, describe_error(exc)) from None
    remote = request.client.host if request.client else None
    try:
        answer = await run_in_threadpool(fleet.claims.provision, asked.claim, asked.csr,
                                         asked.hardware.model_dump(), remote)
    except ProvisioningRefused as exc:
        raise _refused(exc) from None
    if answer.status == 202:
        return JSONResponse(Pending.model_validate(answer.body).model_dump(), status_code=202,
                            headers={"Retry-After": str(answer.retry_after_s)})
    return answer.body


# ------------------------------------------------------------------------------------------------ claims
@router.get("/api/claims", response_model=list[Claim], responses=errors(401, 403),
            summary="Every claim: its state, devices used of its maximum, expiry (never its token) (admin)")
def list_claims(_who: Admin, fleet: Services) -> Any:
    return fleet.claims.list()


@router.post("/api/claims", status_code=201, response_model=ClaimCreated, responses=errors(400, 401, 403, 409),
             summary="Create a claim; the answer is the only time its token is shown (admin)",
             description="Answers the agent.yaml keys of the image (claim, manager_url, ca, update_public_key) and the "
                         "CA's PEM. 409: this manager signs no device certificates (it runs without --tls).")
def create_claim(spec: ClaimSpec, who: Admin, fleet: Services) -> Any:
    try:
        created = fleet.claims.create(groups=spec.groups, expires_in_s=spec.expires_s, max_devices=spec.max_devices,
                                      approve=spec.approve, serials=spec.serials or (),
                                      name_template=spec.name_template, created_by=who.principal.name)
    except ProvisioningRefused as exc:
        raise _refused(exc) from None
    who.audit("claim.create", created["claim_id"], groups=created["groups"], approve=created["approve"],
              max_devices=created["max_devices"], serials=created["serials"], expires_at=created["expires_at"])
    return created


@router.delete("/api/claims/{claim_id}", response_model=Claim, responses=errors(400, 401, 403, 404),
               summary="Revoke a claim: it admits no new device; devices it let in are untouched (admin)")
def revoke_claim(claim_id: ClaimId, who: Admin, fleet: Services) -> Any:
    try:
        revoked = fleet.claims.revoke(claim_id)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    who.audit("claim.revoke", claim_id)
    return revoked


# -------------------------------------------------------------------------------------- requests
@router.get("/api/provisioning", response_model=list[ProvisioningRequest], responses=errors(400, 401, 403),
            summary="Devices' provisioning requests, with their hardware facts (admin)")
def list_requests(_who: Admin, fleet: Services,
                  state: Annotated[RequestState | None, Query(description="only those in this state")] = None) -> Any:
    return fleet.claims.requests(state)


@router.post("/api/provisioning/{device_id}/approve", response_model=ProvisioningRequest,
             responses=errors(400, 401, 403, 404, 409),
             summary="Approve a pending device: its certificate is signed, its next poll gets it (admin)",
             description="Approving an approved device answers it as it is; 409: it was rejected.")
def approve(device_id: DeviceId, who: Admin, fleet: Services) -> Any:
    return _decide("approve", device_id, who, fleet)


@router.post("/api/provisioning/{device_id}/reject", response_model=ProvisioningRequest,
             responses=errors(400, 401, 403, 404, 409),
             summary="Reject a pending device for good: its requests answer 403 (admin)",
             description="Rejecting a rejected device answers it as it is; 409: it was approved (revoke it instead).")
def reject(device_id: DeviceId, who: Admin, fleet: Services) -> Any:
    return _decide("reject", device_id, who, fleet)


def _decide(decision: str, device_id: str, who: Any, fleet: Any) -> Any:
    """An operator's ``decision`` ("approve" or "reject") on a device's request: 404 unknown, the refusal's status
    when it cannot be taken, audited as ``provision.<decision>``."""
    try:
        decided = getattr(fleet.claims, decision)(device_id, who.principal.name)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except ProvisioningRefused as exc:
        raise _refused(exc) from None
    who.audit(f"provision.{decision}", device_id, serial=decided["serial"], claim_id=decided["claim_id"])
    return decided
