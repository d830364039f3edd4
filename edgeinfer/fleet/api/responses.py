"""What a route of the fleet API can answer besides its success, as its ``responses=`` declaration, and the
response classes of the routes that answer something other than JSON (their media type is the document's).

Every refusal is ``{"error": "..."}`` (:class:`~.schemas.ErrorBody`); a route declares each status it can
refuse with, so the OpenAPI document lists them all (``tests/fleet/test_openapi_contract.py`` holds it to
that).
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import FileResponse, StreamingResponse

from ...forms.evidence import CLIP_NAME, CONTENT_TYPES, MP4_CLIP_NAME, SNAPSHOT_NAME
from .schemas import ErrorBody

#: what each refusal means, as the document says it
REASONS = {
    400: "The request is not valid: the error names the part and what is wrong with it",
    401: "No usable credential: none, unknown, revoked or expired",
    403: "The token's role is too low for this, or a device's credential is not for this device",
    404: "No such thing",
    409: "It conflicts with what is stored or with where things stand",
    411: "A body without a Content-Length",
    413: "A body larger than this manager takes",
    429: "Too many unauthenticated requests (or bad credentials) from this address: retry after Retry-After seconds",
}
BINARY = {"type": "string", "format": "binary"}


#: a refusal's body, whatever the route answers when it does not refuse (``app.document`` adds the schema)
ERROR_CONTENT = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorBody.__name__}"}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` declaration of these refusals: ``{"error": "..."}`` as JSON, on every route (FastAPI
    would give a ``model`` the media type of the route's own answer: a file's, for a download)."""
    return {status: {"description": REASONS[status], "content": ERROR_CONTENT} for status in statuses}


def binary_body(*media_types: str) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its body itself, streamed: a file of one of ``media_types``."""
    return {"requestBody": {"required": True, "content": {m: {"schema": {**BINARY, "minLength": 1}}
                                                          for m in media_types}}}


def binary(*media_types: str, description: str) -> dict[str, Any]:
    """A success whose body is a file of one of ``media_types``."""
    return {"description": description, "content": {m: {"schema": BINARY} for m in media_types}}


class OctetStream(FileResponse):
    """A model artifact."""

    media_type = "application/octet-stream"


class Snapshot(StreamingResponse):
    media_type = CONTENT_TYPES[SNAPSHOT_NAME]


class Clip(StreamingResponse):
    media_type = CONTENT_TYPES[CLIP_NAME]


class Mp4Clip(StreamingResponse):
    media_type = CONTENT_TYPES[MP4_CLIP_NAME]


class EventStream(StreamingResponse):
    """Server-Sent Events."""

    media_type = "text/event-stream"
