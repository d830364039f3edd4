"""The models of the configuration routes (``api/config.py``; docs/fleet.md, *Configuration*), beside their router
as the samples' are: the edits they take and the layers, diffs and device states they answer with."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ...link.config_document import MAX_DOCUMENT_BYTES
from ..config_layers import Scope
from ..config_rollout import ConfigStatus
from .schemas import MAX_VERSION, PRINTABLE_PATTERN, DeploymentDetail, JsonObject, RolloutOptions, Strict, _integral

#: a layer's revision in a request (0: the layer was never saved)
Revision = Annotated[int, Field(ge=0, le=MAX_VERSION), BeforeValidator(_integral)]
#: the longest message a revision keeps
MAX_MESSAGE = 1000
Message = Annotated[str, Field(max_length=MAX_MESSAGE, pattern=PRINTABLE_PATTERN)]
#: a body of an edit, at most: the document's bound and room for the message and the rollout's options
MAX_EDIT_BYTES = MAX_DOCUMENT_BYTES + 16 * 1024
LAYER_DOC = ("the layer: the keys of a device's configuration it sets (GET /api/config/schema, `layer`). A key set "
             "to null removes what the layers below set; in pipelines (merged by name), {\"name\": P, \"$patch\": "
             "\"delete\"} removes pipeline P. A secret sent back as the answers masked it (rtsp://user:***@host) "
             "keeps the stored one.")


class ConfigEdit(Strict):
    """A new revision of a layer, made on the revision it was read at."""

    document: JsonObject = Field(description=LAYER_DOC)
    revision: Revision = Field(description="the layer's revision this edit was made on (0: a layer never saved); "
                                           "any other than its newest is refused (409)")
    message: Message = Field("", description="why: kept with the revision, shown in its history")
    apply: bool = Field(True, description="deploy it to the devices it reaches now (false: save it only; POST "
                                          "…/apply releases it later)")
    rollout: RolloutOptions | None = Field(None, description="how it is rolled out (waves, canary, abort rate); "
                                                             "default: as a model's")


class ConfigRollback(Strict):
    """A new revision of a layer equal to an earlier one."""

    to_revision: Annotated[int, Field(ge=1, le=MAX_VERSION), BeforeValidator(_integral)] = Field(
        description="the revision whose document the new one takes")
    revision: Revision = Field(description="the layer's newest revision, as read (another is refused: 409)")
    message: Message = Field("", description="why (default: roll back to revision N)")
    apply: bool = Field(True, description="deploy it now")
    rollout: RolloutOptions | None = Field(None, description="how it is rolled out")


class ConfigApply(Strict):
    """Release a layer's newest revision to its devices and deploy it to those that do not run it."""

    rollout: RolloutOptions | None = Field(None, description="how it is rolled out")


class ConfigCheck(Strict):
    """An edit of a layer checked as a save checks it, nothing stored (the dashboard checks as one types): one of
    ``document``, ``text`` and ``to_revision``."""

    # the document states the "one of" the route enforces (400): a body with none, or two, is not a valid one
    model_config = ConfigDict(**Strict.model_config, json_schema_extra={"oneOf": [
        {"required": ["document"], "properties": {"document": {"type": "object"}}},
        {"required": ["text"], "properties": {"text": {"type": "string"}}},
        {"required": ["to_revision"], "properties": {"to_revision": {"type": "integer"}}}]})

    document: JsonObject | None = Field(None, description=LAYER_DOC)
    text: str | None = Field(None, description="the layer as text, YAML or JSON (`format`), read by the manager "
                                               "(YAML as `fleet config set` reads a file; anchors and aliases are "
                                               "refused)")
    format: Literal["yaml", "json"] = Field("yaml", description="the form of `text`, and of the answer's `text`")
    to_revision: Annotated[int, Field(ge=1, le=MAX_VERSION), BeforeValidator(_integral)] | None = Field(
        None, description="a revision of the layer: a roll back to it, previewed (its diff from the newest)")


#: the bodies the routes read themselves (bounded first): their models are the document's (app.document)
UPLOADS = (ConfigEdit, ConfigRollback, ConfigCheck)


class DiffEntry(BaseModel):
    """One key that changed, by its path (``pipelines[main].max_fps``); values masked."""

    path: str
    op: Literal["add", "remove", "change"]
    before: Any = Field(None, description="its value before (absent for add)")
    after: Any = Field(None, description="its value after (absent for remove)")
    secret: bool = Field(False, description="only a secret in it changed (both sides show masked the same)")


class Problem(BaseModel):
    """What keeps an edit from being saved, at its key, in the words ``agent --check`` uses."""

    key: str = Field(description="the key as agent --check names it (pipelines[0].max_fps); (top level) for the "
                                 "whole document, (text) for the text's own syntax")
    words: str = Field(description="what is wrong with it (the schema's errorMessage where it has one)")


class ConfigChecked(BaseModel):
    """An edit of a layer as a save would judge it, nothing stored."""

    layer: str = Field(description="scope:name")
    revision: int = Field(description="the layer's newest revision: what the diff is from and what a save of this "
                                      "edit names (0: never saved)")
    problems: list[Problem] = Field(description="empty: a save of it is taken (unless another came first: 409)")
    diff: list[DiffEntry] = Field(description="what it changes from the newest revision, key by key (masked)")
    document: JsonObject | None = Field(description="the layer as read (a revision of it: masked); null when the "
                                                    "text cannot be read as one")
    text: str | None = Field(description="the document as text in the format asked for (null with it)")


class LayerRevision(BaseModel):
    """A revision of a layer (revision 0: never saved), its document masked."""

    scope: Scope
    name: str
    layer: str = Field(description="scope:name, as the audit log and the origins name it")
    revision: int
    document: JsonObject
    sha256: str | None = Field(description="of the stored document (secrets included)")
    message: str | None
    author: str | None
    role: str | None
    created_at: float | None
    restored_from: int | None = Field(description="a roll back: the revision it equals")
    applied_at: float | None = Field(description="when it was released to the devices (null: saved only)")
    applied_by: str | None
    diff: list[DiffEntry] | None = Field(None, description="what changed from the revision before")


class Skipped(BaseModel):
    """A device the layer reaches that the deployment left out, and why."""

    device_id: str
    reason: str


class ConfigSaved(BaseModel):
    """A save, a roll back or an apply: the revision, what it changed, and the deployment that takes it out."""

    layer: LayerRevision
    deployment: DeploymentDetail | None = Field(description="the configuration deployment (kind config) to the "
                                                            "devices it changes; null when none needs it")
    skipped: list[Skipped]


class LayerRef(BaseModel):
    layer: str
    revision: int


class DesiredConfig(BaseModel):
    """What the device's layers, as released, merge into."""

    sha256: str | None = Field(description="the document's, as sent (null: invalid)")
    problem: str | None = Field(description="why the merged document is not valid (names the key)")
    layers: list[LayerRef]


class AppliedConfig(BaseModel):
    """What the device runs: as its state reports it, else as its last successful configuration deployment gave."""

    sha256: str
    version: int | None


class RefusedConfig(BaseModel):
    """The newest configuration the device refused (or took and rolled back), in its own words."""

    sha256: str
    state: str
    reason: str | None
    deployment_id: str
    version: int


class ConfigDeploymentRef(BaseModel):
    """The newest deployment of the device's desired document, and where the device stands in it."""

    deployment_id: str
    state: str
    status: str


class DeviceConfigStatus(BaseModel):
    """Desired vs applied vs refused, for one device."""

    device_id: str
    online: bool
    status: ConfigStatus
    desired: DesiredConfig
    applied: AppliedConfig | None
    refused: RefusedConfig | None
    deployment: ConfigDeploymentRef | None


class DeviceConfig(DeviceConfigStatus):
    """A device's effective configuration: the merged document (masked) and the layer each key comes from."""

    fleet: str
    groups: list[str]
    layers: list[str] = Field(description="its layers in merge order (a later one wins)")
    document: JsonObject = Field(description="its desired document, masked")
    origins: dict[str, str] = Field(description="each key's path (pipelines[main].max_fps) → the layer that set it")
    drafts: list[str] = Field(description="its layers with a newer revision saved and not applied")
    bootstrap: list[str] = Field(description="the document's keys no layer sets: the device's agent.yaml says them")


class ConfigDevices(BaseModel):
    """Every device's configuration status."""

    counts: dict[str, int] = Field(description="devices per status")
    out_of_step: int = Field(description="devices that do not run their desired document (pending, refused, "
                                         "invalid, out of step)")
    devices: list[DeviceConfigStatus]


class ConfigSchemas(BaseModel):
    """What a form of a configuration is generated from."""

    document: JsonObject = Field(description="the JSON Schema of a device's whole document (what agent --check and "
                                             "the device check)")
    layer: JsonObject = Field(description="the JSON Schema of a layer (the document's, nothing required where keys "
                                          "merge one by one)")
    scopes: list[Scope] = Field(description="the layers' scopes, in merge order")
    statuses: list[ConfigStatus]
    max_document_bytes: int
