"""Model artifacts: ``PUT /api/artifacts`` (streamed to disk while hashed), ``GET|HEAD /artifacts/{sha256}``
(with Range, so agents resume interrupted downloads)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from ..artifacts import UploadTooLarge
from .deps import ArtifactReader, Operator, Services
from .responses import ERROR_CONTENT, REASONS, OctetStream, binary, binary_body, errors
from .schemas import SHA256_PATTERN, ArtifactStored

router = APIRouter(tags=["artifacts"])
Sha256 = Annotated[str, Path(pattern=SHA256_PATTERN, description="the artifact's sha256")]
READERS = ("Open to a viewer token, to an enrolled device with its MQTT user name and password (Basic), or with "
           "?grant= from a deploy command (a short-lived signed URL). A configuration document (it may hold "
           "secrets) opens to its grant and to the devices it was given to only: 403 to every token.")
#: Range is HTTP's own header, read by Starlette's FileResponse, which answers a malformed one (400) and one past
#: the end (416) in plain text
RANGE = ("Honours Range (bytes=FIRST-[LAST], bytes=-SUFFIX, several: multipart/byteranges), so agents resume "
         "interrupted downloads: 206 with the part; 416 (plain text, Content-Range: bytes */SIZE) when it starts "
         "past the end; 400 (plain text) when it is malformed.")
PLAIN = {"text/plain": {"schema": {"type": "string"}}}
RANGE_REFUSALS = {400: {"description": f"{REASONS[400]}; a malformed Range: plain text",
                        "content": {**ERROR_CONTENT, **PLAIN}},
                  416: {"description": "A Range that starts past the end of the file", "content": PLAIN}}


@router.put("/api/artifacts", status_code=201, response_model=ArtifactStored,
            responses=errors(400, 401, 403, 411, 413), openapi_extra=binary_body("application/octet-stream"),
            summary="Upload a model file (operator)",
            description="The body is the file, with a Content-Length (411 without one; an empty file is a 400); "
                        "answers its sha256 and size. Streamed to disk while hashing: a model is never held in memory.")
async def upload(request: Request, who: Operator, fleet: Services) -> Any:
    length = request.headers.get("content-length")
    if length is None or not length.isdigit():
        raise HTTPException(411, "send the file with a Content-Length")
    if int(length) == 0:  # a length, and nothing to store: the request is wrong, not its framing
        raise HTTPException(400, "the body is empty: send the model file")
    limit = fleet.max_upload_bytes
    if int(length) > limit:
        raise HTTPException(413, f"the file is larger than the {limit}-byte limit")
    try:
        sha256, size = await fleet.artifacts.receive(request.stream(), expected=int(length), max_bytes=limit)
    except UploadTooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except (ValueError, ClientDisconnect) as exc:  # cut short, or longer than announced; nothing was kept
        raise HTTPException(400, str(exc) or "the client went away during the upload") from None
    await run_in_threadpool(who.audit, "artifact.upload", sha256, size=size)
    return ArtifactStored(sha256=sha256, size=size)


def _artifact(fleet: Services, sha256: str) -> OctetStream:
    path = fleet.artifacts.get(sha256)
    if path is None:
        raise HTTPException(404, f"no artifact {sha256}")
    return OctetStream(path)


@router.get("/artifacts/{sha256}", response_class=OctetStream, summary="A model artifact by sha256",
            responses={200: binary("application/octet-stream", description="The file"),
                       206: binary("application/octet-stream", "multipart/byteranges",
                                   description="The parts of the file Range asked for"),
                       **errors(401, 403, 404), **RANGE_REFUSALS},
            description=f"{RANGE} {READERS}")
def download(sha256: Sha256, _ok: ArtifactReader, fleet: Services) -> OctetStream:
    return _artifact(fleet, sha256)


@router.head("/artifacts/{sha256}", response_class=OctetStream, responses=errors(400, 401, 403, 404),
             summary="A model artifact's size (Content-Length), without its bytes", description=READERS)
def size(sha256: Sha256, _ok: ArtifactReader, fleet: Services) -> OctetStream:
    return _artifact(fleet, sha256)
