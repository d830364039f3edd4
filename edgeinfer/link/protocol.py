"""The MQTT protocol between devices and the fleet: topic names, message schemas, validation.

Topic root ``edgeinfer/v1/<fleet>/<device>/``:

============ =============== =========== ==========================================================
topic        direction       QoS/retain  payload
============ =============== =========== ==========================================================
``state``    device → fleet  1, retained birth: online, profile, delegates, models, versions; the
                                         Last Will sets it offline
``telemetry`` device → fleet 1           a metrics window, with ``boot_id`` and a per-boot ``seq``
``events``   device → fleet  1           fallbacks, errors, restarts, command results
``cmd``      fleet → device  1           commands; each has an ``id`` and is idempotent
============ =============== =========== ==========================================================

Every payload is a UTF-8 JSON object with ``"v": 1`` and a ``"type"``. The schemas below are JSON
Schema (draft 2020-12), kept here as data so that the code, the validator and ``docs/protocol.md``
(generated from them, and checked by a test) cannot drift apart. The validator implements the
subset of JSON Schema these schemas use; it needs no third-party package, so the agent stays small.
Where orjson is installed (the ``fleet`` extra: the manager parses thousands of messages a second)
it parses payloads, seven times faster than :mod:`json`; it is also stricter — a string with a
lone UTF-16 surrogate is not valid Unicode and is refused. Where msgspec is installed too, it
accepts a valid payload in one C pass (:mod:`.schema_fast`); anything it refuses is judged by the
validator here.

Device → fleet messages allow extra properties (a v1 reader must ignore what it does not know);
``cmd`` is strict, because a device must never act on a field it does not understand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError
from ..pipeline.stats import PERCENTILES, STAGES
from . import schema_fast
from .schema_check import Check, compile_schema, nesting, schema_errors
from .vocabulary import SCHEMA_EVENT_KINDS

try:  # the fleet extra
    import orjson
except ImportError:  # pragma: no cover - the agent without the fleet extra
    orjson = None

PROTOCOL_VERSION = 1
TOPIC_PREFIX = f"edgeinfer/v{PROTOCOL_VERSION}"
KINDS = ("state", "telemetry", "events", "cmd")
#: an inbound message larger than this is refused before it is parsed
MAX_PAYLOAD_BYTES = 256 * 1024
#: objects and arrays nested deeper than this are refused: hostile input that would exhaust a
#: recursive serialiser or validator (the protocol's own messages nest 8 deep at most)
MAX_NESTING = 32

#: fleet and device ids: one MQTT topic level, no wildcards, printable, short
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_ID_RE = re.compile(ID_PATTERN)
COMMAND_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
COMMAND_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"


def check_id(value: str, what: str = "id") -> str:
    """Return ``value`` if it is a valid fleet/device id (one topic level), else raise ValueError."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not valid: use 1-64 of A-Z a-z 0-9 . _ - (starting with a letter "
                         "or digit); it becomes an MQTT topic level")
    return value


@dataclass(frozen=True)
class Topics:
    """The four topics of one device."""

    fleet: str
    device: str

    def __post_init__(self) -> None:
        check_id(self.fleet, "fleet")
        check_id(self.device, "device id")

    @property
    def root(self) -> str:
        return f"{TOPIC_PREFIX}/{self.fleet}/{self.device}"

    @property
    def state(self) -> str:
        return f"{self.root}/state"

    @property
    def telemetry(self) -> str:
        return f"{self.root}/telemetry"

    @property
    def events(self) -> str:
        return f"{self.root}/events"

    @property
    def cmd(self) -> str:
        return f"{self.root}/cmd"

    def topic(self, kind: str) -> str:
        """The topic of ``kind`` (state, telemetry, events or cmd)."""
        if kind not in KINDS:
            raise ValueError(f"unknown topic kind {kind!r}; one of {', '.join(KINDS)}")
        return f"{self.root}/{kind}"


def subscription(kind: str, fleet: str = "+", device: str = "+") -> str:
    """A subscription filter for ``kind`` across devices/fleets, e.g. ``edgeinfer/v1/+/+/telemetry``."""
    if kind not in KINDS:
        raise ValueError(f"unknown topic kind {kind!r}; one of {', '.join(KINDS)}")
    return f"{TOPIC_PREFIX}/{fleet}/{device}/{kind}"


def parse_topic(topic: str) -> tuple[str, str, str]:
    """Split an edgeinfer topic into ``(fleet, device, kind)``; ProtocolError if it is not one."""
    parts = topic.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != TOPIC_PREFIX or parts[4] not in KINDS:
        raise ProtocolError(f"topic {topic!r} is not {TOPIC_PREFIX}/<fleet>/<device>/<{'|'.join(KINDS)}>")
    if not (_ID_RE.fullmatch(parts[2]) and _ID_RE.fullmatch(parts[3])):
        raise ProtocolError(f"topic {topic!r} has an invalid fleet or device id")
    return parts[2], parts[3], parts[4]


# ------------------------------------------------------------------------------------- schemas

_NUM = {"type": "number"}
# Upper bounds keep every value storable (a PostgreSQL BIGINT, a UNIX time before 2100) and exact in
# a browser (2**53): a device cannot publish a number the fleet database would refuse.
MAX_COUNT = 2**53
MAX_TS = 4_102_444_800.0  # 2100-01-01
MAX_FPS = 1_000_000.0
_NONNEG = {"type": "number", "minimum": 0}
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_COUNT}
_SEQ = {"type": "integer", "minimum": 1, "maximum": MAX_COUNT}
_TS = {"type": "number", "minimum": 0, "maximum": MAX_TS, "description": "UNIX time, seconds"}
_ID = {"type": "string", "pattern": ID_PATTERN}
_BOOT = {"type": "string", "pattern": "^[0-9a-f]{32}$", "description": "uuid4 hex, new at every agent start"}
_NULLABLE_STR = {"type": ["string", "null"]}
_ENVELOPE = {
    "v": {"const": PROTOCOL_VERSION},
    "fleet": _ID,
    "device": _ID,
    "ts": _TS,
}
#: an output summary's labels: the most frequent of the window, each at most this long
MAX_OUTPUT_LABELS = 10
MAX_LABEL_CHARS = 128
_OUTPUTS = {
    "type": "object",
    "required": ["frames"],
    "description": "what the pipeline answered over the window (the canary analysis compares it): frames "
                   "summarised; top: the most frequent top-1 classes (classifiers) or detected labels "
                   "(detectors) with their counts; detections: detections in the window (0 for a "
                   "classifier); score_mean: the mean top-1 or detection score",
    "properties": {
        "frames": _COUNT,
        "top": {"type": "array", "maxItems": MAX_OUTPUT_LABELS,
                "items": {"type": "object", "required": ["label", "count"],
                          "properties": {"label": {"type": "string", "maxLength": MAX_LABEL_CHARS},
                                         "count": _COUNT}}},
        "detections": _COUNT,
        "score_mean": {"type": ["number", "null"]},
    },
}
#: lines and zones a pipeline reports, at most (telemetry stays small)
MAX_COUNTERS = 32
_COUNTER_NAME = {"type": "string", "minLength": 1, "maxLength": 64}
_ANALYTICS = {
    "type": "object",
    "description": "tracking, lines and zones (tasks with boxes: detect, pose, segment, obb), counted since the "
                   "pipeline started: tracks confirmed and active now; per line, confirmed tracks that crossed in "
                   "and out; per zone, "
                   "tracks inside now, entries, the mean visit in seconds",
    "properties": {
        "tracks": {"type": "object", "properties": {"confirmed": _COUNT, "active": _COUNT}},
        "lines": {"type": "array", "maxItems": MAX_COUNTERS,
                  "items": {"type": "object", "required": ["name", "in", "out"],
                            "properties": {"name": _COUNTER_NAME, "in": _COUNT, "out": _COUNT}}},
        "zones": {"type": "array", "maxItems": MAX_COUNTERS,
                  "items": {"type": "object", "required": ["name", "inside", "entries"],
                            "properties": {"name": _COUNTER_NAME, "inside": _COUNT, "entries": _COUNT,
                                           "mean_visit_s": {"type": ["number", "null"]}}}},
    },
}
#: streams a pipeline with several sources reports, at most (its config takes no more)
MAX_STREAMS = 32
_STREAMS = {
    "type": "array",
    "maxItems": MAX_STREAMS,
    "description": "a pipeline with several sources (one engine serving every stream): each stream's window, "
                   "in config order; the pipeline's frames, dropped and fps are their sums. status: running, "
                   "ended, failed (its source failed to open or died; it is opened again with backoff) or, "
                   "between runs, the pipeline's; reused: frames answered with the previous result (motion "
                   "gating), not in frames",
    "items": {
        "type": "object",
        "required": ["name", "frames", "dropped", "fps"],
        "properties": {
            "name": _ID,
            "status": {"type": "string"},
            "frames": _COUNT,
            "dropped": _COUNT,
            "fps": {"type": "number", "minimum": 0, "maximum": MAX_FPS},
            "reused": _COUNT,
            "analytics": _ANALYTICS,
        },
    },
}
_DEGRADED = {"type": "boolean", "description": "running on a fallback delegate after the wanted one failed"}
_DELEGATE_WANTED = {"type": ["string", "null"], "description": "the delegate it wants (null: not degraded)"}
_PERCENTILES = {
    "type": "object",
    "properties": dict.fromkeys(PERCENTILES, _NONNEG),
    "required": ["p50", "p95", "p99"],
}

_REVISION = {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_COUNT}
_REVISION_SUMMARY = {
    "type": ["object", "null"], "required": ["revision", "sha256"],
    "properties": {"revision": _REVISION, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                   "deployment_id": _NULLABLE_STR},
}
#: the configuration revision a device runs (agent/configuration.py; the document: link/config_document.py)
_CONFIG_STATE = {
    "type": ["object", "null"],
    "description": "the configuration the device runs: revision and sha256 of the fleet's document (null: agent.yaml "
                   "alone; source says which), the keys the revision sets over agent.yaml, the revision on trial "
                   "(being applied and judged), and the last one refused (state failed: before anything changed) or "
                   "rolled back (state rolled_back: it failed its health gate, or the agent stopped while applying "
                   "it) with its reason and detail",
    "properties": {
        "revision": _REVISION,
        "sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
        "deployment_id": _NULLABLE_STR,
        "source": {"enum": ["fleet", "agent.yaml"]},
        "keys": {"type": "array", "items": {"type": "string"}},
        "trial": _REVISION_SUMMARY,
        "refused": {"type": ["object", "null"],
                    "properties": {**_REVISION_SUMMARY["properties"], "state": {"enum": ["failed", "rolled_back"]},
                                   "reason": {"type": "string"}, "detail": {"type": "string"}, "at": _TS}},
    },
}

STATE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "state",
    "description": "Retained. Published at every (re)connect and on every change; the Last Will "
                   "replaces it with online=false.",
    "type": "object",
    "required": ["v", "type", "fleet", "device", "ts", "online", "boot_id"],
    "properties": {
        **_ENVELOPE,
        "type": {"const": "state"},
        "online": {"type": "boolean"},
        "reason": {"type": "string", "description": "why offline: shutdown, connection lost"},
        "boot_id": _BOOT,
        "started": _TS,
        "profile": _NULLABLE_STR,
        "versions": {"type": "object", "additionalProperties": _NULLABLE_STR,
                     "description": "edgeinfer, python, paho-mqtt and each runtime's version (null: absent)"},
        "delegates": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "available"],
                "properties": {"name": {"type": "string"}, "available": {"type": "boolean"},
                               "reason": _NULLABLE_STR},
            },
        },
        "pipelines": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "status"],
                "properties": {
                    "name": {"type": "string"},
                    "status": {"enum": ["starting", "running", "ended", "failed", "restarting", "stopped"]},
                    "task": {"type": "string"},
                    "source": {"type": "string"},
                    "delegate": _NULLABLE_STR,
                    "degraded": _DEGRADED,
                    "delegate_wanted": _DELEGATE_WANTED,
                    "fallback_reason": _NULLABLE_STR,
                    "error": _NULLABLE_STR,
                    "model": {
                        "type": ["object", "null"],
                        "required": ["path"],
                        "properties": {"path": {"type": "string"},
                                       "sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
                                       "version": _NULLABLE_STR, "format": _NULLABLE_STR},
                    },
                },
            },
        },
        "spool": {"type": "object"},
        "slots": {"type": ["object", "null"],
                  "description": "the updatable pipeline's model slots: pipeline, and active / previous as "
                                 "{name, version, sha256} or null"},
        "agent": {"type": ["object", "null"],
                  "description": "the agent's environment slot, when its launcher runs it: slot (a or b), version, "
                                 "sha256 of the agent bundle it was installed from (null: provisioned), trial (true "
                                 "until it has reported healthy)",
                  "properties": {"slot": {"enum": ["a", "b"]}, "version": {"type": "string"},
                                 "sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
                                 "trial": {"type": "boolean"}}},
        "config": _CONFIG_STATE,
    },
}

TELEMETRY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "telemetry",
    "description": "One window of metrics. seq starts at 1 for each boot_id and increases by one per "
                   "message, so a reader sees gaps (spool drops, reported in spool.dropped) and "
                   "duplicates (QoS 1 redelivery; de-duplicate on (boot_id, seq)).",
    "type": "object",
    "required": ["v", "type", "fleet", "device", "ts", "boot_id", "seq", "interval_s", "pipelines", "system",
                 "spool"],
    "properties": {
        **_ENVELOPE,
        "type": {"const": "telemetry"},
        "boot_id": _BOOT,
        "seq": _SEQ,
        "interval_s": {"type": "number", "exclusiveMinimum": 0, "description": "the window's length"},
        "pipelines": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "status", "frames", "dropped", "fps"],
                "properties": {
                    "name": {"type": "string"},
                    "status": {"type": "string"},
                    "delegate": _NULLABLE_STR,
                    "frames": _COUNT,
                    "dropped": _COUNT,
                    "fps": {"type": "number", "minimum": 0, "maximum": MAX_FPS},
                    "restarts": _COUNT,
                    "stages": {"type": "object", "additionalProperties": _PERCENTILES,
                               "description": "ms per stage: " + ", ".join(STAGES)},
                    "outputs": _OUTPUTS,
                    "analytics": _ANALYTICS,
                    "degraded": _DEGRADED,
                    "delegate_wanted": _DELEGATE_WANTED,
                    "streams": _STREAMS,
                },
            },
        },
        "system": {
            "type": "object",
            "required": ["cpu_percent", "rss_bytes"],
            "properties": {
                "cpu_percent": {"type": ["number", "null"], "minimum": 0,
                                "description": "whole machine, 100 = every core busy"},
                "process_cpu_percent": {"type": ["number", "null"], "minimum": 0,
                                        "description": "this agent process, 100 = one core"},
                "rss_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_COUNT},
                "temperature_c": {"type": "object", "additionalProperties": _NUM,
                                  "description": "sensor name -> degrees C, for the zones the profile names"},
                "throttled": {"type": ["boolean", "null"], "description": "null: no throttling sensor"},
                "throttle_flags": {"type": "object", "additionalProperties": {"type": "integer"}},
                "power_mw": {"type": "object", "additionalProperties": _NUM,
                             "description": "rail name -> milliwatts, for the power rails the profile names"},
            },
        },
        "spool": {
            "type": "object",
            "required": ["pending", "dropped"],
            "properties": {"pending": _COUNT, "bytes": _COUNT, "dropped": _COUNT, "dropped_events": _COUNT,
                           "rejected": _COUNT, "write_errors": _COUNT},
            "description": "dropped counts are cumulative for the spool's life (they survive restarts)",
        },
        "mqtt": {"type": "object"},
        "footprint": {
            "type": "object",
            "description": "what the agent costs the device: RSS now and at its peak, the runtimes and heavy "
                           "libraries it has loaded, and seconds from its start to the first pipeline result",
            "properties": {
                "rss_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_COUNT},
                "peak_rss_bytes": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_COUNT},
                "runtimes": {"type": "array", "maxItems": 32, "items": {"type": "string", "maxLength": 64}},
                "first_result_s": {"type": ["number", "null"], "minimum": 0},
            },
        },
    },
}

EVENT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "events",
    "description": "Something happened. seq is per boot, like telemetry's, but its own counter.",
    "type": "object",
    "required": ["v", "type", "fleet", "device", "ts", "boot_id", "seq", "event", "level", "message"],
    "properties": {
        **_ENVELOPE,
        "type": {"const": "event"},
        "boot_id": _BOOT,
        "seq": _SEQ,
        "event": {"type": "string", "pattern": COMMAND_NAME_PATTERN,
                  "description": "one of " + ", ".join(kind.value for kind in SCHEMA_EVENT_KINDS)
                                 + " (readers must accept new ones)"},
        "level": {"enum": ["info", "warning", "error"]},
        "message": {"type": "string"},
        "pipeline": _NULLABLE_STR,
        "cmd_id": _NULLABLE_STR,
        "data": {"type": "object",
                 "description": "what the event says, by its name; every time in it is wall-clock unix seconds, as "
                                "ts is — a rule_triggered event's timestamp is its frame's wall-clock time and its "
                                "source_time the same frame in the source's own clock (seconds into a file; a live "
                                "source's capture time)"},
    },
}

CMD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "cmd",
    "description": "A command to one device. The device answers on events with cmd_result or "
                   "cmd_rejected carrying the same id; a command id seen before is not run again. "
                   "A state-changing command is signed: sig is the fleet key's Ed25519 signature "
                   "(base64) over the canonical JSON of every other field, device and expires included.",
    "type": "object",
    "required": ["v", "type", "id", "cmd"],
    "additionalProperties": False,
    "properties": {
        "v": {"const": PROTOCOL_VERSION},
        "type": {"const": "cmd"},
        "id": {"type": "string", "pattern": COMMAND_ID_PATTERN},
        "cmd": {"type": "string", "pattern": COMMAND_NAME_PATTERN},
        "ts": _TS,
        "expires": {"type": "number", "minimum": 0, "description": "UNIX time after which it must not run"},
        "args": {"type": "object"},
        "device": {**_ID, "description": "the device the signature is for"},
        "sig": {"type": "string", "maxLength": 512, "description": "base64 Ed25519 signature by the fleet key"},
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "state": STATE_SCHEMA,
    "telemetry": TELEMETRY_SCHEMA,
    "events": EVENT_SCHEMA,
    "cmd": CMD_SCHEMA,
}




def validate(kind: str, message: Any) -> dict[str, Any]:
    """Check a decoded message against the schema of ``kind``; return it, or raise ProtocolError."""
    if kind not in SCHEMAS:
        raise ValueError(f"unknown message kind {kind!r}; one of {', '.join(SCHEMAS)}")
    if _CHECKS[kind](message):
        return message
    problems = schema_errors(message, SCHEMAS[kind])
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ProtocolError(f"invalid {kind} message: {shown}")
    return message


_CHECKS: dict[str, Check] = {kind: compile_schema(schema) for kind, schema in SCHEMAS.items()}


def payload_text(kind: str, payload: bytes | bytearray | str) -> str:
    """A received payload as text: ProtocolError when it is too large or not UTF-8."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"{kind} payload of {len(payload)} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
    if not isinstance(payload, (bytes, bytearray)):
        return payload
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{kind} payload is not UTF-8: {exc}") from exc


def decode(kind: str, payload: bytes | bytearray | str) -> dict[str, Any]:
    """Parse a received payload (UTF-8 JSON) and validate it; ProtocolError says what is wrong."""
    text = payload_text(kind, payload)
    try:
        # orjson, like the parse_constant hook, refuses NaN and Infinity: they are not JSON
        message = json.loads(text, parse_constant=_reject_constant) if orjson is None else orjson.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:  # orjson's error is a JSONDecodeError
        raise ProtocolError(f"{kind} payload is not JSON: {exc}") from exc
    # brackets bound the depth from above: only a payload with many is walked (none of ours nests past 8)
    if text.count("{") + text.count("[") > MAX_NESTING and nesting(message, MAX_NESTING) > MAX_NESTING:
        raise ProtocolError(f"{kind} payload nests deeper than {MAX_NESTING} levels")
    if kind in SCHEMAS and schema_fast.accepts(kind, SCHEMAS[kind], text):
        return message
    return validate(kind, message)  # the exact rules decide, and explain


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def encode(message: Mapping[str, Any]) -> bytes:
    """Serialise a message compactly (UTF-8 JSON, no NaN)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False, default=_default).encode("utf-8")


def _default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def make_command(command_id: str, cmd: str, args: Mapping[str, Any] | None = None, *, ts: float | None = None,
                 expires: float | None = None) -> dict[str, Any]:
    """Build a valid, unsigned ``cmd`` message (for the fleet side and tests); the fleet signs it afterwards
    with :func:`edgeinfer.updates.signing.sign_command`."""
    message: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": "cmd", "id": command_id, "cmd": cmd,
                               "args": dict(args or {})}
    if ts is not None:
        message["ts"] = ts
    if expires is not None:
        message["expires"] = expires
    return validate("cmd", message)


def schemas_markdown() -> str:
    """The schemas as the Markdown section of docs/protocol.md (generated, checked by a test)."""
    parts = []
    for kind, schema in SCHEMAS.items():
        parts.append(f"### `{kind}`\n\n```json\n{json.dumps(schema, indent=2, ensure_ascii=False)}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":  # pragma: no cover - regenerates the schema section of docs/protocol.md
    print(schemas_markdown(), end="")
