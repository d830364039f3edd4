"""msgspec as the first judge of a payload: it may only accept what the schema accepts."""

from __future__ import annotations

import json

import msgspec
import pytest

from edgeinfer.errors import ProtocolError
from edgeinfer.link import schema_fast
from edgeinfer.link.protocol import SCHEMAS, decode, schema_errors


def accepted(schema: dict, value: object) -> bool:
    fast = schema_fast.decoder(schema)
    assert fast is not None
    try:
        fast.decode(json.dumps(value))
    except msgspec.MsgspecError:
        return False
    return True


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_message_kind_has_a_fast_decoder(kind):
    assert schema_fast.decoder(SCHEMAS[kind]) is not None


@pytest.mark.parametrize(("schema", "value", "fast", "exact"), [
    ({"type": "string", "pattern": "b"}, "abc", True, True),  # search, not match, as JSON Schema means it
    ({"type": "string", "maxLength": 2}, "\u00e9\u00e9", True, True),  # characters, not bytes
    ({"type": "number", "minimum": 0}, 3, True, True),  # an integer is a number
    ({"type": "number"}, True, False, False),  # a boolean is not
    ({"type": "integer"}, 1.5, False, False),
    ({"type": ["string", "null"]}, None, True, True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
     {"a": 1, "b": 2}, False, False),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1, "b": [2]}, True, True),
    ({"type": "object", "required": ["a"], "properties": {"a": {}}}, {}, False, False),
    ({"type": "object", "additionalProperties": {"type": "number"}}, {"x": "1"}, False, False),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, [1, 2], False, False),
    # stricter than the schema, never looser: these go on to the exact check, which accepts them
    ({"const": 1}, 1.0, False, True),
    ({"type": "integer"}, 2**70, True, True),  # Python's integers: no 64-bit limit on either side
])
def test_the_fast_decoder_is_the_schema_or_stricter(schema, value, fast, exact):
    assert accepted(schema, value) is fast
    assert (not schema_errors(value, schema)) is exact


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
    {"type": "object", "properties": {"not-an-identifier": {}}},
    {"oneOf": [{"type": "string"}]},
    {"minimum": 3},  # a bound without a type applies to numbers only
    {"enum": [1, "a", 1.5]},
])
def test_what_it_cannot_express_gets_no_decoder(schema):
    assert schema_fast.decoder(schema) is None


def test_a_payload_the_fast_path_refuses_is_judged_by_the_exact_rules():
    """A message msgspec refuses for a stricter reason is still accepted, and the errors still explain."""
    command = {"v": 1, "type": "cmd", "id": "c1", "cmd": "ping", "ts": 1.0}
    payload = json.dumps(command).replace('"v": 1', '"v": 1.0')  # 1.0 == 1: valid, but not to msgspec's Literal
    assert not schema_fast.accepts("cmd", SCHEMAS["cmd"], payload)
    assert decode("cmd", payload) == command
    with pytest.raises(ProtocolError, match=r"\$\.cmd"):
        decode("cmd", json.dumps({**command, "cmd": "Ping!"}))


def test_deep_nesting_is_refused_not_raised():
    """A payload nested deeper than Python's recursion limit (orjson takes 1024 levels) is not the fast
    path's to judge: it returns False instead of a RecursionError escaping; decode() refuses anything
    nested past MAX_NESTING, whatever the schema allows there (a free-form ``args``)."""
    depth = 1020
    payload = '{"v": 1, "type": "cmd", "id": "c1", "cmd": "ping", "args": {"x": ' + "[" * depth + "]" * depth + "}}"
    assert schema_fast.accepts("cmd", SCHEMAS["cmd"], payload) is False
    with pytest.raises(ProtocolError, match="nests deeper than 32"):
        decode("cmd", payload)
    within = '{"v": 1, "type": "cmd", "id": "c1", "cmd": "ping", "args": {"x": ' + "[" * 30 + "]" * 30 + "}}"
    assert json.dumps(decode("cmd", within)["args"]["x"]) == "[" * 30 + "]" * 30
