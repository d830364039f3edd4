"""What the schema-driven fuzzer (tests/fleet/test_openapi_contract.py) must know that an OpenAPI document cannot
say, and how it reads an answer that never ends. schemathesis loads this module itself
(``SCHEMATHESIS_HOOKS=support.contract_hooks``).

- The bytes of what a media type or a format names: an ``image/jpeg`` snapshot, a ``video/x-motion-jpeg`` or
  ``video/mp4`` clip, an ``application/zip`` of YOLO labels, a string of format ``jpeg-base64`` (a sample's frame in
  JSON), one of format ``pem-pkcs10`` (a device's certificate request, for its own key, with an empty subject).
  Without them the fuzzer sends arbitrary bytes under those names, and the manager rightly refuses them.
- That the annotations of a COCO document name an image and a category of that document, each with as many keypoints
  as its category names and a flag for each (JSON Schema has no way to say so): an annotation's id that names none is
  made to name one, its keypoints as many as they must be; what is invalid stays invalid.
- A ``multipart/x-mixed-replace`` answer (a live view, a clip played) goes on until the client goes: it is read up to
  its first whole part, for at most :data:`PART_WAIT_S`, and then closed. (A ``text/event-stream`` answer needs no
  help: schemathesis reads a few events of it, as its configuration says.)
- Every answer is written down (``CONTRACT_ANSWERS``: one JSON line each, the operation, its status and the id of the
  token it carried), so that the test sees each operation was exercised with the token it needs.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
import zipfile
from typing import Any

import schemathesis
from hypothesis import strategies as st

from edgeinfer.fleet.api.sample_schemas import JPEG_BASE64
from edgeinfer.fleet.claims import CSR_FORMAT

from .jpegs import JPEGS, MP4_HEAD
from .provisioning import csr_of, new_key

#: the longest a multipart/x-mixed-replace answer is read
PART_WAIT_S = 2.0
MIXED_REPLACE = "multipart/x-mixed-replace"

#: what each media type's bytes are
MEDIA_TYPES = {
    "image/jpeg": st.sampled_from(JPEGS),
    "video/x-motion-jpeg": st.lists(st.sampled_from(JPEGS), min_size=1, max_size=4).map(b"".join),
    "video/mp4": st.binary(max_size=64).map(lambda tail: MP4_HEAD + tail),
}
schemathesis.openapi.format(JPEG_BASE64, st.sampled_from([base64.b64encode(jpeg).decode() for jpeg in JPEGS]))
#: a device's certificate request: four keys' (a serial asked for again with another one is a conflict, 409)
schemathesis.openapi.format(CSR_FORMAT, st.sampled_from([csr_of(new_key()) for _ in range(4)]))

_NAMES = st.lists(st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=12),
                  min_size=1, max_size=4, unique=True)
_STEM = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,15}\Z")
_BOX = st.tuples(*[st.floats(0, 1, allow_nan=False)] * 4)


@st.composite
def yolo_zips(draw: Any) -> bytes:
    """A zip of ``data.yaml`` and ``labels/<device>/<sample>.txt`` files, each line ``class cx cy w h`` (0..1)."""
    names = draw(_NAMES)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("data.yaml", "names:\n" + "".join(f"  {i}: {json.dumps(n)}\n" for i, n in enumerate(names)))
        for device, sample in draw(st.lists(st.tuples(_STEM, _STEM), max_size=3, unique=True)):
            lines = draw(st.lists(st.tuples(st.integers(0, len(names) - 1), _BOX), max_size=3))
            zipped.writestr(f"labels/{device}/{sample}.txt",
                            "".join(f"{c} {cx:.4f} {cy:.4f} {w:.4f} {h:.4f}\n" for c, (cx, cy, w, h) in lines))
    return archive.getvalue()


MEDIA_TYPES["application/zip"] = yolo_zips()
for _media_type, _strategy in MEDIA_TYPES.items():
    schemathesis.openapi.media_type(_media_type, _strategy)


def _ids(items: Any) -> list[int] | None:
    """The integer ids of a list of objects, or None when the list is not one (a negative case's)."""
    if not isinstance(items, list) or not all(isinstance(item, dict) and type(item.get("id")) is int
                                              for item in items):
        return None
    return [item["id"] for item in items]


def whole_coco_document(body: Any) -> Any:
    """A COCO document's annotations name an image and a category of the document: an integer id that names none
    becomes one that does (an annotation with nothing to name is left out)."""
    if not isinstance(body, dict) or not isinstance(body.get("annotations"), list):
        return body
    images, categories = _ids(body.get("images")), _ids(body.get("categories"))
    if images is None or categories is None:
        return body
    whole = []
    for index, annotation in enumerate(body["annotations"]):
        if not isinstance(annotation, dict):
            whole.append(annotation)
            continue
        annotation = dict(annotation)
        for key, ids in (("image_id", images), ("category_id", categories)):
            if type(annotation.get(key)) is int and annotation[key] not in ids:
                annotation[key] = ids[index % len(ids)] if ids else None
        if None not in (annotation.get("image_id", 0), annotation.get("category_id", 0)):
            whole.append(_whole_keypoints(annotation, body["categories"]))
    return body if whole == body["annotations"] else {**body, "annotations": whole}


def _whole_keypoints(annotation: dict, categories: list[dict]) -> dict:
    """An annotation's keypoints (x, y, v flat), as many as its category names (or whole triples), each v a flag."""
    values = annotation.get("keypoints")
    if not isinstance(values, list) or not all(type(v) in (int, float) and v >= 0 for v in values):
        return annotation
    names = next((c.get("keypoints") for c in categories if c["id"] == annotation.get("category_id")), None)
    count = len(names) if isinstance(names, list) else len(values) // 3
    values = (values + [0] * (3 * count))[:3 * count]
    return {**annotation, "keypoints": [v if i % 3 != 2 or v in (0, 1, 2) else 2 for i, v in enumerate(values)]}


def _first_part(response: Any, **_: Any) -> Any:
    """A multipart/x-mixed-replace answer read up to its first whole part (or for PART_WAIT_S), then closed."""
    if not response.headers.get("Content-Type", "").startswith(MIXED_REPLACE):
        return response
    connection = getattr(response.raw, "connection", None)
    if connection is not None and connection.sock is not None:
        connection.sock.settimeout(PART_WAIT_S)
    body, deadline = bytearray(), time.monotonic() + PART_WAIT_S
    try:
        while not _has_part(body) and time.monotonic() < deadline and (chunk := response.raw.read1(1 << 16)):
            body += chunk
    except Exception:  # the wait is over (a read timeout), or the server went: what came is the answer
        pass
    response.raw.close()  # the connection goes with it: it is in the middle of an answer
    response._content, response._content_consumed = bytes(body), True
    return response


def _has_part(body: bytes) -> bool:
    """Whether ``body`` holds a whole part: its headers and as many bytes as their Content-Length."""
    head_end = body.find(b"\r\n\r\n")
    if head_end < 0:
        return False
    for line in body[:head_end].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= head_end + 4 + int(value)
    return False


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Every phase's requests (a ``map_body`` hook sees the fuzzing phase's only). The body is set only when it
    changes: schemathesis judges a body set here again, and to it a JPEG's bytes are no JSON Schema string — it would
    take a valid upload for an invalid one, and expect it refused."""
    whole = whole_coco_document(case.body)
    if whole is not case.body:
        case.body = whole
    kwargs["hooks"] = {"response": [_first_part]}


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    path = os.environ.get("CONTRACT_ANSWERS")
    if not path:
        return
    auth = response.request.headers.get("Authorization", "")
    token = auth.removeprefix("Bearer ").split("_")[1] if auth.startswith("Bearer eit_") else None
    with open(path, "a") as answers:
        answers.write(json.dumps({"operation": f"{case.method.upper()} {case.operation.path}",
                                  "status": response.status_code, "token_id": token}) + "\n")
