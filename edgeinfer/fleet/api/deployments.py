"""``/api/deployments``: rollouts — start one from a :class:`~..schemas.DeploymentSpec`, follow, abort."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path

from ...link.vocabulary import DeploymentKind
from ..auth import Role
from ..schemas import DEPLOYMENT_ID_PATTERN, Deployment, DeploymentDetail, DeploymentSpec
from .deps import Operator, Services, Viewer
from .responses import errors

router = APIRouter(prefix="/api/deployments", tags=["deployments"])
DeploymentId = Annotated[str, Path(pattern=DEPLOYMENT_ID_PATTERN, description="a deployment id")]


@router.get("", response_model=list[Deployment], responses=errors(401),
            summary="Every deployment with per-state device counts")
def list_deployments(_who: Viewer, fleet: Services) -> Any:
    return fleet.deployments.list()


@router.post("", status_code=201, response_model=DeploymentDetail, responses=errors(400, 401, 403, 404),
             summary="Start a rollout (operator)",
             description="The artifact (uploaded first), its kind (a model, or an agent bundle: that needs an "
                         "admin, 403 otherwise), its version and the targets; waves, a canary first, judged on its "
                         "telemetry (docs/fleet.md, Canary analysis). 404 when the artifact or a named device is "
                         "unknown, or no device matches the target.")
def create_deployment(spec: DeploymentSpec, who: Operator, fleet: Services) -> Any:
    if spec.kind == DeploymentKind.AGENT and not who.principal.may(Role.ADMIN):  # it replaces the devices' code
        raise HTTPException(403, f"the token {who.principal.name!r} is a {who.principal.role.value}; updating the "
                                 "agent needs admin")
    try:
        created = fleet.deployments.create(spec)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    who.audit("deployment.create", created["deployment_id"], kind=created["kind"], model_name=created["model_name"],
              version=created["version"], sha256=created["sha256"], devices=len(created["devices"]))
    return created


@router.get("/{deployment_id}", response_model=DeploymentDetail, responses=errors(400, 401, 404),
            summary="One deployment and every target's state")
def get_deployment(deployment_id: DeploymentId, _who: Viewer, fleet: Services) -> Any:
    found = fleet.deployments.get(deployment_id)
    if found is None:
        raise HTTPException(404, f"no deployment {deployment_id}")
    return found


@router.post("/{deployment_id}/abort", response_model=DeploymentDetail, responses=errors(400, 401, 403, 404, 409),
             summary="Stop a running rollout: no later wave (operator)")
def abort(deployment_id: DeploymentId, who: Operator, fleet: Services) -> Any:
    try:
        aborted = fleet.deployments.abort(deployment_id, f"aborted by {who.principal.name}")
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except ValueError as exc:
        raise HTTPException(409, str(exc)) from None
    who.audit("deployment.abort", deployment_id)
    return aborted
