"""Hostile MQTT payloads: bytes that the protocol must refuse for a message kind.

``hostile_payloads(kind)`` (kind: ``state``, ``telemetry``, ``events`` or ``cmd``), a Hypothesis strategy, and
``seeded_payload(kind, rng)``, the same generators making their choices from a seeded ``random.Random``
(``support.choices``: a hundred thousand payloads cost a quarter of what Hypothesis's draws of them do), make them from
these families:

- ``random_bytes``: arbitrary bytes;
- ``invalid_utf8``: a known-good message with a malformed UTF-8 sequence spliced in (a stray byte, an
  overlong form, an encoded surrogate, a truncated sequence, a code point past U+10FFFF);
- ``not_json``: a known-good message truncated, with trailing garbage, single quotes, a trailing comma, a
  comment, a BOM; two messages back to back; arbitrary text;
- ``wrong_top_level``: JSON that is not an object (the message in a list, a string, a number, null...);
- ``non_finite``: a known-good message with NaN / Infinity / -Infinity as one of its values;
- ``huge_numbers``: a bounded number replaced by one past every bound (1e400, 400-digit integers, 2**64...);
- ``deep_nesting``: arrays or objects nested a few, ~1000 (the parsers' limits) or up to ~130,000 levels deep
  (at the top level, in place of a typed value, or in a free-form object of an otherwise broken message);
- ``oversized``: a message just past the protocol's MAX_PAYLOAD_BYTES (some with multi-byte characters:
  fewer characters than the limit, more bytes);
- ``lone_surrogates``: a string or key holding a lone UTF-16 surrogate, as a JSON escape (orjson refuses it)
  or as its raw (CESU-8) bytes (not UTF-8);
- ``mutated``: a known-good message with one required field removed, one value of the wrong type or out
  of its range or pattern, or an unknown key where the schema forbids it (``additionalProperties``);
- ``wrong_envelope``: a wrong ``v`` or ``type``;
- ``other_kinds``: a known-good message of another kind, as it is or relabelled as this kind.

Every payload is checked with :func:`refused`: the protocol's own parser (orjson where the protocol uses it)
and its *exact* (explaining) validator, ``schema_errors`` against ``SCHEMAS[kind]`` — not the fast paths
(msgspec, the compiled checks) that the code under test takes. A payload that passes is filtered out: a valid
message would legitimately change state.

Not here, on purpose:

- the empty payload on ``state`` (and ``cmd``): an empty retained message is MQTT's way to clear one, which
  the fleet manager acknowledges without counting it invalid;
- a ``device``/``fleet`` in the body that differs from the topic's: the protocol's validator does not
  compare them (the fleet manager files a message under its topic's ids), so such a message is valid.

The families make few, small choices per payload — the big payloads built from them — so that lists of a hundred
fit in one Hypothesis test case (its budget: 8 KiB of choices).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from hypothesis import strategies as st

from edgeinfer.link import protocol
from edgeinfer.link.protocol import MAX_COUNT, MAX_PAYLOAD_BYTES, SCHEMAS, make_command, schema_errors

from .choices import Choices, Drawn, Seeded

KINDS = tuple(SCHEMAS)  # state, telemetry, events, cmd
_BOOT = "0123456789abcdef" * 2
_STAGES = {"latency": {"p50": 5.0, "p95": 9.0, "p99": 12.0}, "inference": {"p50": 3.0, "p95": 4.0, "p99": 6.5}}

#: known-good messages of each kind: the required fields only, and (nearly) every optional field
KNOWN_GOOD: dict[str, list[dict[str, Any]]] = {
    "state": [
        {"v": 1, "type": "state", "fleet": "f", "device": "cam-1", "ts": 1_700_000_000.0, "online": False,
         "boot_id": _BOOT},
        {"v": 1, "type": "state", "fleet": "f", "device": "cam-1", "ts": 1_700_000_000.5, "online": True,
         "boot_id": _BOOT, "reason": "connected", "started": 1_699_999_000.0, "profile": "rpi5",
         "versions": {"edgeinfer": "0.1", "python": "3.11.7", "tensorrt": None},
         "delegates": [{"name": "xnnpack", "available": True, "reason": None},
                       {"name": "edgetpu", "available": False, "reason": "no device"}],
         "pipelines": [{"name": "main", "status": "running", "task": "classify", "source": "/dev/video0",
                        "delegate": "xnnpack", "fallback_reason": None, "error": None,
                        "model": {"path": "/m/mobilenet.tflite", "sha256": "a" * 64, "version": "3",
                                  "format": "tflite"}}],
         "spool": {"pending": 0}},
    ],
    "telemetry": [
        {"v": 1, "type": "telemetry", "fleet": "f", "device": "cam-1", "ts": 1_700_000_000.0, "boot_id": _BOOT,
         "seq": 1, "interval_s": 1.0, "pipelines": [], "system": {"cpu_percent": None, "rss_bytes": None},
         "spool": {"pending": 0, "dropped": 0}},
        {"v": 1, "type": "telemetry", "fleet": "f", "device": "cam-1", "ts": 1_700_000_001.0, "boot_id": _BOOT,
         "seq": 2, "interval_s": 10.0,
         "pipelines": [{"name": "main", "status": "running", "delegate": "xnnpack", "frames": 300, "dropped": 2,
                        "fps": 29.9, "restarts": 0, "stages": _STAGES}],
         "system": {"cpu_percent": 35.5, "process_cpu_percent": 80.0, "rss_bytes": 123_456_789,
                    "temperature_c": {"cpu": 55.5}, "throttled": False, "throttle_flags": {"under_voltage": 0},
                    "power_mw": {"vdd_in": 4200.0}},
         "spool": {"pending": 1, "bytes": 300, "dropped": 0, "dropped_events": 0, "rejected": 0, "write_errors": 0},
         "mqtt": {"reconnects": 1}},
    ],
    "events": [
        {"v": 1, "type": "event", "fleet": "f", "device": "cam-1", "ts": 1_700_000_000.0, "boot_id": _BOOT, "seq": 1,
         "event": "agent_started", "level": "info", "message": "agent started"},
        {"v": 1, "type": "event", "fleet": "f", "device": "cam-1", "ts": 1_700_000_002.0, "boot_id": _BOOT, "seq": 2,
         "event": "cmd_result", "level": "warning", "message": "done", "pipeline": "main", "cmd_id": "c-1",
         "data": {"ok": True, "took_s": 1.5}},
    ],
    "cmd": [
        make_command("c-1", "ping"),
        make_command("deploy-42.cam-1", "deploy", {"manifest": {"version": 2}}, ts=1_700_000_000.0,
                     expires=1_700_000_600.0),
    ],
}

for _kind, _samples in KNOWN_GOOD.items():  # a stale sample would make every mutation of it meaningless
    for _sample in _samples:
        assert not schema_errors(_sample, SCHEMAS[_kind]), (_kind, schema_errors(_sample, SCHEMAS[_kind]))


# ------------------------------------------------------------------------------------------------- the oracle

def _parse(text: str) -> Any:
    """The JSON parser the protocol uses (orjson where it is installed, else json refusing NaN/Infinity)."""
    if protocol.orjson is not None:
        return protocol.orjson.loads(text)
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def refused(kind: str, payload: bytes) -> bool:
    """True when ``payload`` is not a valid ``kind`` message by the protocol's exact rules: too large, not
    UTF-8, not JSON (to the protocol's parser), or breaking ``SCHEMAS[kind]`` by ``schema_errors``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        return True
    try:
        message = _parse(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # orjson's JSONDecodeError is a ValueError
        return True
    try:
        return bool(schema_errors(message, SCHEMAS[kind]))
    except RecursionError:  # it was describing an error: the repr of a wrong, deeply nested const/enum value
        return True


# ---------------------------------------------------------------------------------------- known-good anatomy

Path = tuple[Any, ...]
_HOLE = "@@hostile-hole@@"  # a string no sample holds: replaced in the encoded text by a raw JSON fragment
_HOLE_JSON = json.dumps(_HOLE)


def _walk(value: Any, schema: Mapping[str, Any], path: Path = ()):
    """``(path, schema, value)`` for every node of a message, with the sub-schema that applies to it."""
    yield path, schema, value
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, Mapping) else {})
            yield from _walk(item, sub, (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _walk(item, schema["items"], (*path, index))


_CONSTRAINTS = ("type", "const", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "minLength",
                "maxLength", "minItems", "maxItems", "required")


class Anatomy:
    """Where one known-good message can be broken, and how."""

    def __init__(self, kind: str, sample: dict[str, Any]) -> None:
        self.kind = kind
        self.sample = sample
        nodes = list(_walk(sample, SCHEMAS[kind]))
        #: (parent path, key) of every required key present
        self.required = [(path, key) for path, schema, value in nodes if isinstance(value, dict)
                         for key in schema.get("required", ()) if key in value]
        #: (path, schema) of every value whose schema constrains it (a wrong value there breaks the message)
        self.typed = [(path, schema) for path, schema, _ in nodes if path and any(k in schema for k in _CONSTRAINTS)]
        #: ... of those whose schema allows no array (nested arrays there are wrong at any depth)
        self.scalar = [(path, schema) for path, schema in self.typed if "const" in schema or "enum" in schema
                       or (_types(schema) and not {"array", "object"} & set(_types(schema)))]
        #: (path, schema) of numbers with an upper bound (every bound is <= 2**53)
        self.bounded = [(path, schema) for path, schema, value in nodes
                        if "maximum" in schema and isinstance(value, (int, float)) and not isinstance(value, bool)]
        #: (path, schema) of objects that forbid unknown keys or constrain their values
        self.closed = [(path, schema) for path, schema, value in nodes if isinstance(value, dict)
                       and (schema.get("additionalProperties") is False
                            or isinstance(schema.get("additionalProperties"), Mapping))]
        #: paths of free-form objects (any content is valid there)
        self.free = [path for path, schema, value in nodes if isinstance(value, dict) and path
                     and not schema.get("properties") and "additionalProperties" not in schema]
        #: paths of every string value
        self.strings = [path for path, _, value in nodes if isinstance(value, str)]
        #: paths of every number value
        self.numbers = [path for path, _, value in nodes
                        if isinstance(value, (int, float)) and not isinstance(value, bool)]

    def replaced(self, path: Path, value: Any) -> dict[str, Any]:
        message = _copy(self.sample)
        *parents, last = path
        target = message
        for step in parents:
            target = target[step]
        target[last] = value
        return message

    def removed(self, parent: Path, key: str) -> dict[str, Any]:
        message = _copy(self.sample)
        target = message
        for step in parent:
            target = target[step]
        del target[key]
        return message

    def with_fragment(self, path: Path, fragment: str, *, ensure_ascii: bool = True) -> bytes:
        """The message with the value at ``path`` replaced by the raw JSON text ``fragment``."""
        text = json.dumps(self.replaced(path, _HOLE), ensure_ascii=ensure_ascii)
        return text.replace(_HOLE_JSON, fragment, 1).encode("utf-8", "surrogatepass")


def _copy(message: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a JSON message (a JSON round trip: several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(message))


def _types(schema: Mapping[str, Any]) -> list[str]:
    names = schema.get("type", [])
    return names if isinstance(names, list) else [names]


ANATOMY: dict[str, list[Anatomy]] = {kind: [Anatomy(kind, s) for s in samples] for kind, samples in KNOWN_GOOD.items()}


def _encode(message: Any, ascii_only: bool = True) -> bytes:
    return json.dumps(message, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------------------------- wrong values
# Generators take their choices from a ``Choices`` (support.choices): Hypothesis's draws, or a seeded Random.

def _json_leaf(c: Choices) -> Any:
    how = c.integer(0, 4)
    if how == 0:
        return None
    if how == 1:
        return c.boolean()
    if how == 2:
        return c.integer(-(2**70), 2**70)
    if how == 3:
        return c.floating()
    return c.text(12)


def _json_value(c: Choices, depth: int = 0) -> Any:
    """A small JSON value of any type: a leaf, or a list or object of up to three values (two levels at most)."""
    how = c.integer(0, 2) if depth < 2 else 0
    if how == 0:
        return _json_leaf(c)
    if how == 1:
        return [_json_value(c, depth + 1) for _ in range(c.integer(0, 3))]
    return {c.text(6): _json_value(c, depth + 1) for _ in range(c.integer(0, 3))}


#: values of each JSON type (a float is never an integer here: the validator wants a Python int)
_OF_TYPE: dict[str, Callable[[Choices], Any]] = {
    "null": lambda c: None,
    "boolean": lambda c: c.boolean(),
    "integer": lambda c: c.integer(-(2**70), 2**70),
    "number": lambda c: c.floating(),
    "string": lambda c: c.text(12),
    "array": lambda c: [_json_leaf(c) for _ in range(c.integer(0, 3))],
    "object": lambda c: {c.text(6): _json_leaf(c) for _ in range(c.integer(0, 3))},
}
_EDGES = [None, True, False, 0, -1, 1, 1.5, -0.5, 2**53 + 1, 2**63, -(2**63) - 1, 1e308, -1e308, 5e-324, "", "1",
          "x" * 200, "null", "true", [], [None], {}, {"": None}, "\u0000", "\u202e", "A" * 65]
#: characters that no id, name, hash or boot id pattern of the protocol allows first (or at all)
_FOREIGN = " /+#!$\u00e9\u0000\ufeff\n"
Option = Callable[[Choices], Any]


def _one_of(values: list[Any]) -> Option:
    return lambda c: c.pick(values)


@cache
def _wrong_options(schema_json: str) -> tuple[Option, ...]:
    """Ways to make a value that breaks the schema by construction (so the check behind them rarely retries)."""
    schema = json.loads(schema_json)

    def breaking(values: list[Any]) -> list[Any]:
        return [v for v in values if schema_errors(v, schema)]

    options: list[Option] = []
    allowed = _types(schema)
    if allowed:
        others = [make for name, make in _OF_TYPE.items()
                  if name not in allowed and not (name == "integer" and "number" in allowed)]
        options.append(lambda c: c.pick(others)(c))
    if ("const" in schema or "enum" in schema) and (near := breaking(
            [v for value in ([schema["const"]] if "const" in schema else list(schema["enum"])) for v in _near(value)])):
        options.append(_one_of(near))
    if "minimum" in schema or "exclusiveMinimum" in schema:
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        options.append(lambda c: c.integer(None, low - 1) if c.boolean() else c.floating(None, low - 1e-9))
        if "exclusiveMinimum" in schema:
            options.append(_one_of([schema["exclusiveMinimum"]]))
    if "maximum" in schema:
        high = schema["maximum"]
        options.append(lambda c: c.integer(int(high) + 1, None) if c.boolean() else
                       c.floating(high * 1.000001 + 1, None))
    if "integer" in allowed and (fractions := breaking([0.5, 1.25, 2.0**60 + 0.5, 3.5e15, 1.0, "7", True])):
        options.append(_one_of(fractions))
    if "pattern" in schema:
        near_pattern = breaking(_near_pattern(schema["pattern"]))
        options.append(lambda c: c.pick(near_pattern) if c.boolean() else c.text(8, alphabet=_FOREIGN))
    if edges := breaking(_EDGES):
        options.append(_one_of(edges))
    return tuple(options)


def wrong_value(c: Choices, schema: Mapping[str, Any]) -> Any:
    """A value (as decoded JSON) that breaks ``schema`` by the exact validator (tried again while it does not; the
    payload's own check, :func:`refused`, catches one that never did)."""
    options = _wrong_options(json.dumps(schema, sort_keys=True))
    for _ in range(20):
        value = c.pick(options)(c)
        if schema_errors(value, schema):
            break
    return value


def _near(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [value.upper(), value + " ", " " + value, value[:-1], value + "s", "", None, [value], {"v": value}]
    return [value + 1, value - 1, -value, str(value), [value], None, False, value + 0.5]


def _near_pattern(pattern: str) -> list[str]:
    """Strings that look like what ``pattern`` wants and are not: a character too many, a wrong character..."""
    good = {"^[0-9a-f]{32}$": _BOOT, "^[0-9a-f]{64}$": "a" * 64}.get(pattern, "cam-1")
    return [good + "0" * 70, good.upper(), "-" + good, "." + good, good + "/x", good + "+", good + "#", good + " ",
            good[:-1] + "\u00e9", "\ufeff" + good, good + "\u0000", "a" * 129, "Ping!", "1abc", "", good + "\n\n"]


# ------------------------------------------------------------------------------------------------ families
# Each family is a function of (choices, kind): the same definition draws through Hypothesis (hostile_payloads)
# or expands a seed (seeded_payload). Choices are indexes into tuples built once.

def random_bytes(c: Choices, kind: str) -> bytes:
    return c.binary(1, 48)


_BAD_UTF8 = (b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
             b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3")


def invalid_utf8(c: Choices, kind: str) -> bytes:
    encoded = _encode(c.pick(ANATOMY[kind]).sample)
    at = c.integer(0, len(encoded))
    return encoded[:at] + c.pick(_BAD_UTF8) + encoded[at:]


_NOT_JSON_TEXT = ("{", "}", "[", "{}}", "{,}", "{'v': 1}", "{v: 1}", "undefined", "None", "True", "0x10", "+1", ".5",
                  "01", "1.", "--1", '"unterminated', "\\u0041", "/* */{}", "{} // c", '{"a" 1}', "\ufeff{}",
                  '{"a":1,}', "[1,]", "\u0000", " ")
_TRAILERS = ("x", "}", "]", ",", ",{}", "\u0000", "//", "{}", "1")


def not_json(c: Choices, kind: str) -> bytes:
    sample = c.pick(ANATOMY[kind]).sample
    text = json.dumps(sample)
    how = c.integer(0, 9)
    if how == 0:  # truncated
        return text[: c.integer(1, len(text) - 1)].encode()
    if how == 1:  # trailing garbage
        return (text + c.pick(_TRAILERS)).encode()
    if how == 2:  # single quotes
        return text.replace('"', "'").encode()
    if how == 3:  # a trailing comma
        return (text[:-1] + ",}").encode()
    if how == 4:  # a comment
        return ("/* hostile */" + text).encode()
    if how == 5:  # a byte order mark
        return ("\ufeff" + text).encode()
    if how == 6:  # two documents
        return (text + text).encode()
    if how == 7:  # Python's repr
        return repr(sample).encode()
    if how == 8:
        return c.pick(_NOT_JSON_TEXT).encode()
    return c.text(24, low=1).encode("utf-8", "surrogatepass")


@cache
def _top_levels(kind: str) -> tuple[Any, ...]:
    sample = KNOWN_GOOD[kind][-1]
    return ([sample], [], "", json.dumps(sample), 1, -1.5, 0, True, False, None, [[sample]], {"message": sample},
            [1, 2, 3])


def wrong_top_level(c: Choices, kind: str) -> bytes:
    value = c.pick(_top_levels(kind)) if c.boolean() else _json_value(c)
    return _encode(value)


_NON_FINITE = ("NaN", "Infinity", "-Infinity", "-NaN", "nan", "inf", "-inf", "+Infinity", "[NaN]", '{"x": Infinity}')


def non_finite(c: Choices, kind: str) -> bytes:
    anatomy = c.pick(ANATOMY[kind])
    path = c.pick(anatomy.numbers or [p for p, _ in anatomy.typed])
    return anatomy.with_fragment(path, c.pick(_NON_FINITE))


def _huge(digits: int) -> tuple[str, ...]:
    """Numbers past every bound of the protocol (all <= 2**53, all minimums >= 0) or past a double's range."""
    return ("1e400", "-1e400", "2e308", "1" + "0" * digits, "-" + "9" * digits, str(2**63), str(2**64),
            str(-(2**63) - 1), str(MAX_COUNT + 1), "1" + "0" * digits + ".5", "9" * digits + "e9",
            "1.7976931348623157e309")


def huge_numbers(c: Choices, kind: str) -> bytes:
    anatomy = c.pick(ANATOMY[kind])
    path = c.pick([p for p, _ in anatomy.bounded] or [("ts",)])  # every schema bounds its ts
    return anatomy.with_fragment(path, c.pick(_huge(c.integer(17, 400))))


_NESTS = (("[", "]", 1), ('{"a":', "}", 1), ('{"a":[', "]}", 2))  # (opener, closer, levels each)
_INNER = ("", "1", "null", '"x"')
_BAD_V = (2, 0, "1", None)
#: levels of nesting: a few; at and around the parsers' limits (orjson's 1024, Python's recursion limit of 1000,
#: which C decoders share with the caller's stack), each of those levels as likely; or many
_LIMITS = (255, 256, 257, 511, 512, 513, *range(985, 1_030))


def _levels(c: Choices) -> int:
    how = c.integer(0, 2)
    return c.pick(_LIMITS) if how == 0 else c.integer(1, 64) if how == 1 else c.integer(1_030, 130_000)


def deep_nesting(c: Choices, kind: str) -> bytes:
    anatomy = c.pick(ANATOMY[kind])
    levels = _levels(c)
    opener, closer, each = c.pick(_NESTS)
    depth = min(levels // each or 1, 300_000 // len(opener + closer))  # at most ~300 kB: past the limit, not far
    inner = c.pick(_INNER) or ("1" if opener == '{"a":' else "")
    nested = opener * depth + inner + closer * depth
    where = c.integer(0, 2)
    if where == 0:  # at the top level: not an object, or not this message
        return nested.encode()
    if where == 1:  # in place of a value that cannot be an array or an object
        return anatomy.with_fragment(c.pick(anatomy.scalar)[0], nested)
    # in a free-form object ("data", "spool", "args"...) of a message broken elsewhere (its v)
    broken = Anatomy(kind, anatomy.replaced(("v",), c.pick(_BAD_V)))
    if not anatomy.free:
        return broken.with_fragment(c.pick(anatomy.scalar)[0], nested)
    return broken.with_fragment((*c.pick(anatomy.free), "deep"), nested)


_PAD_CHARS = ("x", " ", "\u00e9", "\u20ac", "\U0001f600")  # 1 to 4 bytes in UTF-8


def oversized(c: Choices, kind: str) -> bytes:
    sample = c.pick(ANATOMY[kind]).sample
    char = c.pick(_PAD_CHARS)
    room = MAX_PAYLOAD_BYTES - len(_encode({**sample, "pad": ""}, ascii_only=False)) + c.integer(1, 4096)
    filler = char * -(-room // len(char.encode()))  # bytes just past the limit: fewer characters than that
    return _encode({**sample, "pad": filler}, ascii_only=False)


_SURROGATE_ESCAPES = ("\\ud800", "\\udbff", "\\udc00", "\\udfff", "\\udc00\\ud800", "x\\ud83d", "\\ud83dx",
                      "\\ud83d\\ud83d\\ude00")


def lone_surrogates(c: Choices, kind: str) -> bytes:
    anatomy = c.pick(ANATOMY[kind])
    escaped = f'"{c.pick(_SURROGATE_ESCAPES)}"'
    raw = protocol.orjson is None or c.boolean()  # json (no orjson) reads escapes as valid strings
    if c.boolean():  # in a string value
        payload = anatomy.with_fragment(c.pick(anatomy.strings), escaped)
    else:  # in a key
        parent = c.pick([(), *anatomy.free])
        text = json.dumps(anatomy.replaced((*parent, _HOLE), 1)).replace(_HOLE_JSON, escaped, 1)
        payload = text.encode()
    return _raw_surrogates(payload.decode()) if raw else payload


def _raw_surrogates(text: str) -> bytes:
    """The text with each ``\\udXXX`` escape written as the surrogate's own three bytes (not UTF-8)."""
    raw = re.sub(r"\\u(d[89a-f][0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
    return raw.encode("utf-8", "surrogatepass")


_EXTRA_KEYS = ("sudo", "extra", "", "__proto__", "constructor", "x" * 100, "$where", "\u00e9")


def mutated(c: Choices, kind: str) -> bytes:
    anatomy = c.pick(ANATOMY[kind])
    op = c.integer(0, 2 if anatomy.closed else 1)
    if op == 0:  # a required key removed
        message = anatomy.removed(*c.pick(anatomy.required))
    elif op == 1:  # a value of the wrong type, out of range, not matching its pattern, not its const/enum
        path, schema = c.pick(anatomy.typed)
        message = anatomy.replaced(path, wrong_value(c, schema))
    else:  # an unknown key where the schema forbids it, or one whose value breaks additionalProperties
        path, schema = c.pick(anatomy.closed)
        extra = schema["additionalProperties"]
        key = c.pick(_EXTRA_KEYS)
        if key in schema.get("properties", {}):
            key += "_"
        message = anatomy.replaced((*path, key), _json_value(c) if extra is False else wrong_value(c, extra))
    return _encode(message, ascii_only=c.boolean())


_WRONG_TYPES = ("state", "telemetry", "event", "events", "cmd", "command", "STATE", "Telemetry", "", None, 1)
_WRONG_VERSIONS = (0, 2, -1, 1.5, "1", "v1", None, [1], {"v": 1}, 10**20)


def wrong_envelope(c: Choices, kind: str) -> bytes:
    anatomy = c.pick(ANATOMY[kind])
    if c.boolean():
        const = SCHEMAS[kind]["properties"]["type"]["const"]
        return _encode(anatomy.replaced(("type",), c.pick([t for t in _WRONG_TYPES if t != const])))
    return _encode(anatomy.replaced(("v",), c.pick(_WRONG_VERSIONS)))


def other_kinds(c: Choices, kind: str) -> bytes:
    sample = dict(c.pick(KNOWN_GOOD[c.pick([k for k in KINDS if k != kind])]))
    if c.boolean():
        sample["type"] = SCHEMAS[kind]["properties"]["type"]["const"]  # relabelled: the rest is still wrong
    return _encode(sample)


Family = Callable[[Choices, str], bytes]
#: family -> (its generator, weight): the large payloads (oversized, deep) rarer, to keep batches fast
FAMILIES: dict[str, tuple[Family, int]] = {
    "random_bytes": (random_bytes, 2),
    "invalid_utf8": (invalid_utf8, 2),
    "not_json": (not_json, 3),
    "wrong_top_level": (wrong_top_level, 2),
    "non_finite": (non_finite, 2),
    "huge_numbers": (huge_numbers, 2),
    "deep_nesting": (deep_nesting, 3),
    "oversized": (oversized, 1),
    "lone_surrogates": (lone_surrogates, 2),
    "mutated": (mutated, 6),
    "wrong_envelope": (wrong_envelope, 2),
    "other_kinds": (other_kinds, 2),
}
#: every family's name as often as its weight (Hypothesis's st.sampled_from of it draws by weight)
WEIGHTED: tuple[str, ...] = tuple(name for name, (_, weight) in FAMILIES.items() for _ in range(weight))


def _table(kind: str, families: tuple[str, ...] | None) -> tuple[Family, ...]:
    if kind not in SCHEMAS:
        raise ValueError(f"unknown message kind {kind!r}; one of {', '.join(SCHEMAS)}")
    return tuple(FAMILIES[name][0] for name in (families or WEIGHTED))


def _hostile(kind: str, payload: bytes) -> bool:
    return payload != b"" and refused(kind, payload)


@cache
def hostile_payloads(kind: str, families: tuple[str, ...] | None = None) -> st.SearchStrategy[bytes]:
    """Payloads that the protocol must refuse as ``kind`` messages (each checked with :func:`refused`), drawn by
    Hypothesis; ``families``: only those of :data:`FAMILIES` (default: all, weighted)."""
    table = _table(kind, families)

    @st.composite
    def payloads(draw: Callable) -> bytes:
        c = Drawn(draw)
        return c.pick(table)(c, kind)

    return payloads().filter(lambda payload: _hostile(kind, payload))


def seeded_payload(kind: str, rng: random.Random, families: tuple[str, ...] | None = None) -> bytes:
    """A payload the protocol must refuse as a ``kind`` message (checked with :func:`refused`), made by the same
    families from ``rng``'s choices: the same state of ``rng``, the same payload."""
    table, c = _table(kind, families), Seeded(rng)
    for _ in range(1000):  # a family's rare miss (a wrong value that was right after all) is made again
        payload = c.pick(table)(c, kind)
        if _hostile(kind, payload):
            return payload
    raise AssertionError(f"{families or 'the families'} made no payload that {kind} refuses in 1000 tries")
