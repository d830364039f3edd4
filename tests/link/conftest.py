"""What the link's tests share: every message parser the protocol can run on."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["orjson+msgspec", "orjson", "json"])
def parser(request, monkeypatch) -> str:
    """decode() as the fleet extra has it (orjson parses, msgspec accepts), with orjson alone, and with the
    standard library alone (an agent without either)."""
    from edgeinfer.link import protocol, schema_fast

    monkeypatch.setattr(schema_fast, "_DECODERS", {})
    if request.param == "json":
        monkeypatch.setattr(protocol, "orjson", None)
    else:
        import orjson  # noqa: F401 - the fleet extra's parser
    if request.param == "orjson+msgspec":
        import msgspec  # noqa: F401 - the fleet extra's checker
    else:
        monkeypatch.setattr(schema_fast, "_load", lambda: False)  # as where msgspec is not installed
    return request.param
