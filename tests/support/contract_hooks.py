"""What the schema-driven fuzzer (tests/fleet/test_openapi_contract.py) must know that an OpenAPI document
cannot say: what the bytes of an ``image/jpeg`` snapshot and of a ``video/x-motion-jpeg`` or ``video/mp4`` clip
are. Without it
the fuzzer sends arbitrary bytes under those media types, and the manager rightly refuses them (400: not a
JPEG). schemathesis loads this module itself (``SCHEMATHESIS_HOOKS=support.contract_hooks``)."""

from __future__ import annotations

import base64
from typing import Any

import schemathesis
from hypothesis import strategies as st

from .jpegs import JPEGS, MP4_HEAD

schemathesis.openapi.media_type("image/jpeg", st.sampled_from(JPEGS))
schemathesis.openapi.media_type("video/x-motion-jpeg", st.lists(st.sampled_from(JPEGS), min_size=1,
                                                                 max_size=4).map(b"".join))
schemathesis.openapi.media_type("video/mp4", st.binary(max_size=64).map(lambda tail: MP4_HEAD + tail))


#: a sample's JPEG travels in JSON, base64 (``SampleUpload.jpeg``): a string the document can bound, not say is a JPEG
SAMPLE_JPEG = base64.b64encode(JPEGS[0]).decode()


@schemathesis.hook("map_body")
def real_sample_jpeg(context: Any, body: Any) -> Any:
    """A sample upload's schema-valid ``jpeg`` string becomes a real JPEG's base64; an invalid one stays invalid."""
    operation = context.operation
    if (operation is not None and operation.method.upper() == "PUT" and operation.path.endswith("/samples/{sample_id}")
            and isinstance(body, dict) and isinstance(body.get("jpeg"), str) and len(body["jpeg"]) >= 4):
        return {**body, "jpeg": SAMPLE_JPEG}
    return body
