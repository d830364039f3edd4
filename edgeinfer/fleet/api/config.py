"""``/api/config``: the configuration the fleet holds (docs/fleet.md, *Configuration*) — its layers (fleet, group,
device) in revisions, saved against the revision they were read at, their history and roll back, their rollout to
the devices, and each device's effective document with desired vs applied vs refused.

Viewers read; operators save, roll back and apply; every change is in the audit log (what changed, never a value:
documents hold secrets). A body is read here, bounded first (413), its form judged by its model (400), then its
document by the device's own check: what the OpenAPI document cannot state is refused as a conflict (409) in the
device's words, naming the key as ``agent --check`` does — as a pipeline's lines and zones are (``api/live_view.py``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from ...errors import ConfigError, RevisionConflict
from ...link.config_document import CONFIG_SCHEMA, MAX_DOCUMENT_BYTES, encode_document
from ...link.protocol import ID_PATTERN
from ..config_layers import LAYER_SCHEMA, LayerKey, Scope
from ..config_rollout import ConfigStatus
from ..configs import Author
from .config_schemas import (
    MAX_EDIT_BYTES,
    UPLOADS,
    ConfigApply,
    ConfigCheck,
    ConfigChecked,
    ConfigDevices,
    ConfigEdit,
    ConfigRollback,
    ConfigSaved,
    ConfigSchemas,
    DeviceConfig,
    LayerRevision,
)
from .deps import Caller, Operator, Services, Viewer
from .responses import ERROR_CONTENT, errors
from .samples import _body
from .schemas import describe_error, or_empty

__all__ = ["UPLOADS", "router"]

router = APIRouter(prefix="/api/config", tags=["configuration"])
ScopeParam = Annotated[Scope, Path(description="fleet (a fleet's devices), group or device")]
Name = Annotated[str, Path(pattern=ID_PATTERN, description="the fleet's, the group's or the device's name")]
LAYER = "/layers/{scope}/{name}"
ETAG = {"ETag": {"description": "the revision, quoted: what an edit's `revision` names", "schema": {"type": "string"}}}
#: an edit's conflicts: with the layer's newest revision, or with the device's check of the document it makes
CONFLICTS = {409: {"description": "The layer is at another revision than the one the edit names (read it again), or "
                                  "the document is one a device would refuse: the key named in agent --check's "
                                  "words (a key out of bounds, unknown or only agent.yaml sets; a masked secret that "
                                  "masks nothing stored)", "content": ERROR_CONTENT}}


def _body_of(model: type) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


async def _parse(request: Request, model: type) -> Any:
    body = await _body(request, MAX_EDIT_BYTES)
    try:
        parsed = model.model_validate_json(body)
    except ValidationError as exc:
        raise HTTPException(400, describe_error(exc)) from None
    document = getattr(parsed, "document", None)
    if document is not None and len(encode_document(document)) > MAX_DOCUMENT_BYTES:
        raise HTTPException(413, f"(top level): the document is {len(encode_document(document))} bytes; at most "
                                 f"{MAX_DOCUMENT_BYTES} are taken")
    return parsed


def _author(who: Caller) -> Author:
    return Author(who.principal.name, who.principal.role.value)


def _audit(who: Caller, action: str, key: LayerKey, saved: dict, **detail: Any) -> None:
    """The audit entry of a change: the revision and the keys it changed (never their values: secrets)."""
    layer, deployment = saved["layer"], saved["deployment"]
    who.audit(action, key.label, revision=layer["revision"], message=layer["message"],
              changed=[entry["path"] for entry in layer.get("diff") or []][:200],
              deployment=deployment["deployment_id"] if deployment else None,
              devices=len(deployment["devices"]) if deployment else 0, **detail)


def _changed(call: Any, *args: Any, **kwargs: Any) -> dict:
    """A change, its refusals as answers: 404, 409 (a stale revision; a key the device's check refuses, a masked
    secret that masks nothing)."""
    try:
        return call(*args, **kwargs)
    except ConfigError as exc:
        raise HTTPException(409, str(exc)) from None
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    except RevisionConflict as exc:
        raise HTTPException(409, str(exc)) from None


@router.get("/schema", response_model=ConfigSchemas, responses=errors(401),
            summary="The JSON Schemas of a configuration document and of a layer (a form is generated from them)")
def config_schema(_who: Viewer) -> Any:
    return {"document": CONFIG_SCHEMA, "layer": LAYER_SCHEMA, "scopes": list(Scope), "statuses": list(ConfigStatus),
            "max_document_bytes": MAX_DOCUMENT_BYTES}


@router.get("/layers", response_model=list[LayerRevision], responses=errors(401),
            summary="Every layer saved, at its newest revision (documents masked)")
def list_layers(_who: Viewer, fleet: Services) -> Any:
    return fleet.configs.layers()


@router.get(LAYER, response_model=LayerRevision, responses={200: {"headers": ETAG}, **errors(400, 401)},
            summary="A layer at its newest revision, its document masked (revision 0 and {}: never saved)")
def get_layer(scope: ScopeParam, name: Name, response: Response, _who: Viewer, fleet: Services) -> Any:
    found = fleet.configs.layer(LayerKey(scope, name))
    response.headers["ETag"] = f'"{found["revision"]}"'
    return found


@router.put(LAYER, response_model=ConfigSaved, responses={**errors(400, 401, 403, 411, 413), **CONFLICTS},
            openapi_extra=_body_of(ConfigEdit), summary="Save a layer's next revision and roll it out (operator)",
            description="Body: ConfigEdit — the layer's document, the revision it was read at (another save since: "
                        "409), why, and the rollout. The document is checked as the device checks its own (what "
                        "it refuses is a 409 naming the key, in agent --check's words; GET /api/config/schema's "
                        "layer states it); over the size bound 413. Saved, it is deployed "
                        "(kind config: each device its merged document, signed for it; waves, canary, abort rate "
                        "as a model) to the devices it reaches that do not run it; offline ones get it when they "
                        "come back.")
async def put_layer(scope: ScopeParam, name: Name, request: Request, who: Operator, fleet: Services) -> Any:
    edit = await _parse(request, ConfigEdit)
    key = LayerKey(scope, name)
    saved = await run_in_threadpool(_changed, fleet.configs.save, key, edit.document, base=edit.revision,
                                    message=edit.message, author=_author(who), apply=edit.apply, rollout=edit.rollout)
    await run_in_threadpool(_audit, who, "config.save", key, saved, applied=edit.apply)
    return saved


@router.get(LAYER + "/history", response_model=list[LayerRevision], responses=errors(400, 401),
            summary="A layer's revisions, newest first, each with its diff from the one before (masked)")
def layer_history(scope: ScopeParam, name: Name, _who: Viewer, fleet: Services,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    return fleet.configs.history(LayerKey(scope, name), limit)


@router.get(LAYER + "/revisions/{revision}", response_model=LayerRevision, responses=errors(400, 401, 404),
            summary="One revision of a layer with its diff from the one before (masked)")
def layer_revision(scope: ScopeParam, name: Name, revision: Annotated[int, Path(ge=1, le=2**31 - 1)], _who: Viewer,
                   fleet: Services) -> Any:
    try:
        return fleet.configs.revision(LayerKey(scope, name), revision)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None


@router.post(LAYER + "/check", response_model=ConfigChecked, responses=errors(400, 401, 404, 411, 413),
             openapi_extra=_body_of(ConfigCheck),
             summary="Check an edit of a layer without saving it: its problems, its diff, it as text (viewer)",
             description="Body: ConfigCheck — one of the layer's `document`, its `text` (YAML or JSON, `format`) or "
                         "`to_revision` (a roll back, previewed). Judged as a save judges it (the device's own check, "
                         "a masked secret put back): its problems at their keys in agent --check's words, its diff "
                         "from the newest revision (masked), the document read and it as text. Nothing is stored or "
                         "sent: what the dashboard shows as one types, and before a save or a roll back.")
async def check_layer(scope: ScopeParam, name: Name, request: Request, _who: Viewer, fleet: Services) -> Any:
    edit = await _parse(request, ConfigCheck)
    if (edit.document is not None) + (edit.text is not None) + (edit.to_revision is not None) != 1:
        raise HTTPException(400, "give one of document, text and to_revision")
    if edit.text is not None and len(edit.text.encode("utf-8")) > MAX_DOCUMENT_BYTES:
        raise HTTPException(413, f"text: {len(edit.text.encode('utf-8'))} bytes; at most {MAX_DOCUMENT_BYTES} are "
                                 "taken")
    return await run_in_threadpool(_changed, fleet.configs.check, LayerKey(scope, name), edit.document,
                                   text=edit.text, fmt=edit.format, to_revision=edit.to_revision)


@router.post(LAYER + "/rollback", response_model=ConfigSaved,
             responses={**errors(400, 401, 403, 404, 411, 413), **CONFLICTS},
             openapi_extra=_body_of(ConfigRollback),
             summary="Roll a layer back: a new revision equal to an earlier one, rolled out (operator)",
             description="Body: ConfigRollback — the revision to go back to, the layer's newest as read (409 "
                         "otherwise), why, the rollout.")
async def rollback_layer(scope: ScopeParam, name: Name, request: Request, who: Operator, fleet: Services) -> Any:
    back = await _parse(request, ConfigRollback)
    key = LayerKey(scope, name)
    saved = await run_in_threadpool(_changed, fleet.configs.roll_back, key, back.to_revision, base=back.revision,
                                    message=back.message, author=_author(who), apply=back.apply, rollout=back.rollout)
    await run_in_threadpool(_audit, who, "config.rollback", key, saved, to_revision=back.to_revision)
    return saved


@router.post(LAYER + "/apply", response_model=ConfigSaved, responses=errors(400, 401, 403, 404),
             summary="Release a layer's newest revision and deploy it to the devices that do not run it (operator)")
def apply_layer(scope: ScopeParam, name: Name, who: Operator, fleet: Services,
                body: Annotated[ConfigApply | None, Body()] = None) -> Any:
    key = LayerKey(scope, name)
    applied = _changed(fleet.configs.apply, key, author=_author(who), rollout=body.rollout if body else None)
    _audit(who, "config.apply", key, applied)
    return applied


@router.get("/devices", response_model=ConfigDevices, responses=errors(400, 401),
            summary="Every device's configuration: desired vs applied vs refused, and the counts")
def config_devices(_who: Viewer, fleet: Services,
                   group: Annotated[str | None, Query(pattern=or_empty(ID_PATTERN))] = None,
                   fleet_name: Annotated[str | None, Query(alias="fleet", pattern=or_empty(ID_PATTERN))] = None) -> Any:
    return fleet.configs.devices(fleet=fleet_name or None, group=group or None)


@router.get("/devices/{device_id}", response_model=DeviceConfig, responses=errors(400, 401, 404),
            summary="A device's effective configuration (masked), each key's layer, desired vs applied vs refused")
def device_config(device_id: Annotated[str, Path(pattern=ID_PATTERN)], _who: Viewer, fleet: Services) -> Any:
    try:
        return fleet.configs.device(device_id)
    except LookupError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
