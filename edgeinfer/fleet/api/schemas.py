"""What crosses the fleet manager's HTTP API, as pydantic models: the requests it takes, the answers it gives.

The OpenAPI document (``/openapi.json``) is generated from these models and from the routes that use
them, so it is the contract: every bound the server enforces on a request is a constraint here (and so
in the document), and every answer is validated against its model on its way out. Request models are
strict — a JSON string is not a number, ``true`` is not ``1`` — because the document says so.

:class:`DeploymentSpec` is the one definition of a rollout: the API validates with it, ``edgeinfer deploy``
builds its request body through it, and the dashboard's form reads its bounds from the document.
Answers carry the rows as the database keeps them; a model names the fields a client can rely on and
lets the rest through (``extra="allow"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from ...forms import regions
from ...forms.evidence import EVENT_ID_FORM, EVENT_ID_PATTERN
from ...forms.samples import PHASH_PATTERN
from ...link.protocol import COMMAND_ID_PATTERN, COMMAND_NAME_PATTERN, ID_PATTERN
from ...link.vocabulary import DEFAULT_FLEET, DeploymentKind, TargetState
from ..auth import NAME_PATTERN, TOKEN_ID_PATTERN, Role
from ..canary import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_MAX_FPS_DROP,
    DEFAULT_MAX_LATENCY_REGRESSION,
    DEFAULT_MAX_OUTPUT_DRIFT,
    DEFAULT_MIN_WINDOWS,
    DEFAULT_WINDOW_S,
    Thresholds,
)
from ..claims import MAC_PATTERN, SERIAL_PATTERN, TEMPLATE_PATTERN
from ..rollout import DEFAULT_CANARY_PCT, DEFAULT_DEVICE_TIMEOUT_S, DeployableKind, DeploymentStatus

SHA256_PATTERN = r"^[0-9a-f]{64}$"
#: a name a person gives (a model, a group, a pipeline): no control characters (PostgreSQL keeps no NUL)
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f]*$"
#: a deployment id: ours are uuid4 hex; anything id-like is looked up (and not found)
DEPLOYMENT_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
#: the newest version a deployment may carry (the database keeps a 32-bit integer)
MAX_VERSION = 2**31 - 1
#: devices named in one deployment, or enrolled in one request
MAX_DEVICES = 10_000
#: the longest a device may take to answer a deploy command, and a canary window
MAX_WAIT_S = 7 * 86_400.0
#: how an id, a hash or a name must look, in words (the 400 answer for a value that does not match)
PATTERN_WORDS = {
    ID_PATTERN: "1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit)",
    EVENT_ID_PATTERN: f"an event id ({EVENT_ID_FORM})",
    SHA256_PATTERN: "a sha256: 64 hex digits, lower case",
    DEPLOYMENT_ID_PATTERN: "a deployment id: 1-64 of A-Z a-z 0-9 . _ -",
    TOKEN_ID_PATTERN: "a token id: 12 hex digits",
    NAME_PATTERN: "1-64 characters: letters, digits, space . _ @ - (starting with a letter or digit)",
    COMMAND_NAME_PATTERN: "an event name: 1-32 of a-z 0-9 _, starting with a letter",
    COMMAND_ID_PATTERN: "a command id: 1-128 of A-Z a-z 0-9 . _ : - (starting with a letter or digit)",
    PRINTABLE_PATTERN: "text without control characters",
    # SAMPLE_ID_PATTERN is ID_PATTERN's form (the same key: its words are ID_PATTERN's)
    PHASH_PATTERN: "a perceptual hash: 16 hex digits, lower case",
    regions.NAME_PATTERN: regions.NAME_FORM,
    SERIAL_PATTERN: "a serial: 1-64 of A-Z a-z 0-9 . _ : -",
    TEMPLATE_PATTERN: "a name template: letters, digits, . _ - around one {serial}",
    MAC_PATTERN: "a MAC address (six hex pairs, : or - between)",
}

def _integral(value: Any) -> Any:
    """2.0 is the integer 2, as JSON Schema counts (strict pydantic would refuse it); 2.5 and "2" stay refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: integers in a request, as JSON Schema means them (the bounds before the validator: pydantic writes them into the
#: document only then)
Version = Annotated[int, Field(ge=0, le=MAX_VERSION), BeforeValidator(_integral)]
WaveSize = Annotated[int, Field(ge=1, le=MAX_DEVICES), BeforeValidator(_integral)]
MinWindows = Annotated[int, Field(ge=1, le=100_000), BeforeValidator(_integral)]
DeviceId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
FleetName = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
Sha256 = Annotated[str, StringConstraints(pattern=SHA256_PATTERN)]
PipelineName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=PRINTABLE_PATTERN)]
JsonObject = dict[str, Any]


def or_empty(pattern: str) -> str:
    """``pattern``, or nothing at all (a query filter given empty is no filter)."""
    return f"^$|{pattern}"


def describe(errors: Sequence[Any]) -> str:
    """The first of pydantic's errors as one line a person can act on: where, and what is wrong."""
    first = dict(errors[0]) if errors else {}
    loc = [str(part) for part in first.get("loc", ())]
    if loc and loc[0] in ("path", "query", "header"):  # a parameter: named as a person would say it
        where = " ".join(loc[1:]).replace("_", " ")
    else:
        where = ".".join(loc[1:] if loc[:1] == ["body"] else loc) or "the request body"
    context = first.get("ctx") or {}
    pattern = str(context.get("pattern")).removeprefix("^$|")
    if first.get("type") == "string_pattern_mismatch" and pattern in PATTERN_WORDS:
        if loc[-1:] == ["[key]"]:  # a mapping's key: a line's name
            return f"{'.'.join(loc[1:-2])}: {first.get('input')!r} is not {PATTERN_WORDS[pattern]}"
        return f"{where} must be {PATTERN_WORDS[pattern]}, not {first.get('input')!r}"
    if first.get("type") == "value_error" and "error" in context:  # a validator's own words
        return f"{where}: {context['error']}" if loc[1:] else str(context["error"])
    return f"{where}: {first.get('msg', 'invalid')}"


def describe_error(exc: ValidationError) -> str:
    return describe(exc.errors())


class Strict(BaseModel):
    """A request: types as the document states them, unknown keys ignored (as they always were)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class Row(BaseModel):
    """An answer: the fields a client can rely on, and whatever else the row holds."""

    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------------------------------- errors

class ErrorBody(BaseModel):
    """Every refusal: what is wrong, in one line (the CLI shows it as it is)."""

    error: str


# ---------------------------------------------------------------------------------------- deployments

class RolloutOptions(Strict):
    """How a rollout goes, whatever it deploys (a model, an agent, a configuration): waves with a canary first, the
    failure rate that stops it, how long a device has, and the canary analysis."""

    canary_pct: float = Field(DEFAULT_CANARY_PCT, ge=0, le=100, description="percent of the targets in wave 0")
    wave_size: WaveSize | None = Field(None, description="devices per later wave (default: all the rest)")
    abort_failure_pct: float | None = Field(None, ge=0, le=100, description="stop when more than this percent of "
                                                                           "finished devices failed")
    abort_failure_rate: float | None = Field(None, ge=0, le=1, description="the same as a fraction (0-1); "
                                                                          "abort_failure_pct wins")
    device_timeout_s: float = Field(DEFAULT_DEVICE_TIMEOUT_S, gt=0, le=MAX_WAIT_S, description="seconds a device has")
    canary_analysis: bool = Field(True, description="judge the canary on its telemetry (docs/fleet.md, Canary "
                                                    "analysis)")
    # the canary analysis's thresholds: null is the default
    canary_window_s: float | None = Field(DEFAULT_WINDOW_S, ge=1, le=MAX_WAIT_S,
                                          description="seconds of telemetry watched before the canary is judged")
    canary_min_windows: MinWindows | None = Field(DEFAULT_MIN_WINDOWS,
                                                  description="telemetry windows per group, at least")
    max_latency_regression: float | None = Field(DEFAULT_MAX_LATENCY_REGRESSION, ge=0, le=100_000,
                                                 description="percent the canary's p95 infer latency may rise")
    max_fps_drop: float | None = Field(DEFAULT_MAX_FPS_DROP, ge=0, le=100,
                                       description="percent the canary's fps may drop")
    max_output_drift: float | None = Field(DEFAULT_MAX_OUTPUT_DRIFT, ge=0, le=1,
                                           description="the total variation distance the canary's outputs may drift")
    max_error_rate: float | None = Field(DEFAULT_MAX_ERROR_RATE, ge=0, le=100,
                                         description="percentage points the canary's error rate may rise")

    def abort_fraction(self) -> float:
        """The failure rate that aborts the rollout, as a fraction: ``abort_failure_pct`` (what the CLI and the
        dashboard send) or ``abort_failure_rate``."""
        if self.abort_failure_pct is not None:
            return self.abort_failure_pct / 100
        return self.abort_failure_rate or 0.0

    def thresholds(self) -> Thresholds:
        """The canary analysis this spec asks for (defaults where it says nothing)."""
        given = {"window_s": self.canary_window_s, "min_windows": self.canary_min_windows,
                 "max_latency_regression": self.max_latency_regression, "max_fps_drop": self.max_fps_drop,
                 "max_output_drift": self.max_output_drift, "max_error_rate": self.max_error_rate}
        return Thresholds(enabled=self.canary_analysis, **{k: v for k, v in given.items() if v is not None})


class DeploymentSpec(RolloutOptions):
    """A rollout: a stored artifact as a version, to devices / a group / all (the first given wins; none given
    matches no device), in waves with a canary first (:class:`RolloutOptions`)."""

    sha256: Sha256 = Field(description="an artifact uploaded with PUT /api/artifacts")
    kind: DeployableKind = Field("model", description="what it is: a model, or an agent bundle (docs/fleet.md)")
    version: Version = Field(description="the new version number (devices refuse a downgrade unless rollback)")
    model_name: str | None = Field(None, max_length=256, pattern=PRINTABLE_PATTERN,
                                   description="the artifact's name, shown with the version (default: the sha256)")
    devices: list[DeviceId] | None = Field(None, max_length=MAX_DEVICES, description="target devices by id")
    group: str | None = Field(None, min_length=1, max_length=128, pattern=PRINTABLE_PATTERN,
                              description="every device in this group")
    all: bool = Field(False, description="every known device")
    rollback: bool = Field(False, description="allow going back to an older version")
    pipeline: PipelineName | None = Field(None, description="which of the agent's pipelines (default: its first)")


class Target(Row):
    """One device of a deployment: its wave and where it stands."""

    deployment_id: str
    device_id: str
    wave: int
    state: TargetState
    detail: str | None = None
    updated_at: float
    notified_at: float | None = None


class Deployment(Row):
    """A deployment with its device count per state (``counts``) and the canary verdict (``analysis``)."""

    deployment_id: str
    kind: DeploymentKind = DeploymentKind.MODEL
    model_name: str
    version: int
    sha256: str
    size: int
    target: str
    options: JsonObject
    status: DeploymentStatus
    detail: str | None = None
    created_at: float
    updated_at: float
    analysis: JsonObject | None = None
    counts: dict[str, int]


class DeploymentDetail(Deployment):
    """A deployment and every target."""

    devices: list[Target]


# -------------------------------------------------------------------------------------------- devices

class PipelineArgs(Strict):
    """Which pipeline a command is for (rollback: the agent's updatable one when none is named)."""

    pipeline: PipelineName | None = None


class RestartArgs(Strict):
    """The pipeline to restart."""

    pipeline: PipelineName


class SampleArgs(Strict):
    """Keep the next ``frames`` frames of a pipeline (one stream, or each) as samples."""

    pipeline: PipelineName
    frames: Annotated[int, Field(ge=1, le=1000), BeforeValidator(_integral)] = 10
    stream: Annotated[str, StringConstraints(max_length=64, pattern=PRINTABLE_PATTERN)] = ""


class CommandSent(BaseModel):
    """A signed command queued for a device (QoS 1, spooled until the broker has it)."""

    command_id: str
    cmd: str
    device_id: str
    args: JsonObject


#: a line's or a zone's name, a coordinate in the source frame's pixels: forms.regions' form, as the device checks it
RegionName = Annotated[str, StringConstraints(pattern=regions.NAME_PATTERN), Field(description=regions.NAME_FORM)]
Coordinate = Annotated[float, Field(ge=0, le=regions.MAX_COORDINATE, allow_inf_nan=False)]
Point = Annotated[list[Coordinate], Field(min_length=2, max_length=2)]  # [x, y]
_NAMED = {"additionalProperties": False}  # a key the name pattern refuses is no key at all


class AnalyticsSpec(Strict):
    """A pipeline's counting lines and zones in source pixels: a line is its two end points, a zone three points or
    more (closed). What the document cannot state is 409 in the device's words (:meth:`problem`, the route)."""

    stream: PipelineName | None = Field(default=None, description="the stream of a multi-stream pipeline")
    lines: dict[RegionName, Annotated[list[Point], Field(min_length=2, max_length=2,
                                                         json_schema_extra={"uniqueItems": True})]] = Field(
        default_factory=dict, max_length=regions.MAX_LINES, description="name: [[x1, y1], [x2, y2]]",
        json_schema_extra=_NAMED)
    zones: dict[RegionName, Annotated[list[Point], Field(min_length=regions.MIN_ZONE_POINTS,
                                                         max_length=regions.MAX_ZONE_POINTS)]] = Field(
        default_factory=dict, max_length=regions.MAX_ZONES, description="name: [[x, y], ...], three points or more",
        json_schema_extra=_NAMED)

    def device_lines(self) -> dict[str, list[float]]:  # as the device takes them: [x1, y1, x2, y2]
        return {name: [*a, *b] for name, (a, b) in self.lines.items()}

    def problem(self) -> str | None:
        """Why the device would refuse these lines and zones (``forms.regions``, in its words), or None."""
        return regions.regions_problem(self.device_lines(), self.zones)


class AnalyticsSent(BaseModel):
    """The signed set_analytics command queued for the device, and the revision it carries."""

    command_id: str
    device_id: str
    revision: int
    args: JsonObject


class Device(Row):
    """A device as the fleet last heard of it: its state (retained birth message), last telemetry, model."""

    device_id: str
    fleet: str
    groups: list[str]
    online: bool
    state: JsonObject | None = None
    model_name: str | None = None
    model_version: int | None = None
    model_sha256: str | None = None
    delegate: str | None = None
    last_telemetry: JsonObject | None = None
    first_seen: float
    last_seen: float
    last_telemetry_ts: float | None = None


class EvidenceFlags(BaseModel):
    """An event's evidence: which files are stored, their sizes, the clip's frames."""

    event_id: str | None
    snapshot: bool
    clip: bool
    snapshot_bytes: int | None
    clip_bytes: int | None
    frames: int | None
    #: the snapshot as the camera gave it, without the drawing, is stored too
    plain_snapshot: bool = False
    #: the clip's file: clip.mp4 (H.264, a <video> plays it) or clip.mjpeg (played with ?play=1); None: none yet
    clip_name: str | None = None


class Event(Row):
    """A device's ``events`` message as it sent it, with its device, its row id and its evidence."""

    id: int | None = None
    device_id: str
    event: str | None = None
    level: str | None = None
    message: str | None = None
    ts: float | None = None
    data: JsonObject | None = None
    evidence: EvidenceFlags


class Rollup(Row):
    """A minute of a device's telemetry, summed."""

    minute: int
    samples: int
    fps_sum: float
    fps_mean: float
    latency_p95_max_ms: float | None = None
    dropped_sum: int


class DeviceDetail(Device):
    """A device with its recent events (and their evidence), its model slots and the last hour of roll-ups."""

    events: list[Event]
    slots: JsonObject | None = None
    rollups: list[Rollup]


# --------------------------------------------------------------------------------------------- access

class TokenSpec(Strict):
    """A new API token."""

    name: str = Field(pattern=NAME_PATTERN, description="who or what uses it (shown in the audit log)")
    role: Annotated[Role, Field(strict=False)]  # its value, as JSON gives it
    expires_s: float | None = Field(None, gt=0, le=10 * 365 * 86_400.0, description="its lifetime in seconds "
                                                                                    "(default: until revoked)")


class Token(Row):
    """An API token as listed: never the token itself (the manager keeps a hash)."""

    token_id: str
    name: str
    role: Role
    created_at: float
    created_by: str | None = None
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None


class TokenCreated(Token):
    """A new token: the only answer that shows it."""

    token: str


class EnrollArgs(Strict):
    """The fleet a device is enrolled in, and its identity: a password, or a client certificate."""

    fleet: FleetName = DEFAULT_FLEET
    certificate: bool = Field(False, description="issue a key and a client certificate of the fleet's CA (the "
                                                 "manager needs --tls) instead of a password")


class EnrollBatch(Strict):
    """Devices to enrol with one broker reload."""

    devices: list[DeviceId] = Field(min_length=1, max_length=MAX_DEVICES, json_schema_extra={"uniqueItems": True})
    fleet: FleetName = DEFAULT_FLEET
    certificate: bool = Field(False, description="as EnrollArgs.certificate")

    @field_validator("devices")
    @classmethod
    def _once_each(cls, devices: list[str]) -> list[str]:
        if len(set(devices)) != len(devices):
            raise ValueError("a device id appears twice")
        return devices


class Enrolled(Row):
    """A device's credential: what goes into its agent.yaml (the password, or the private key, is shown only here).
    A password: ``username`` and ``password``. A certificate: ``certificate``, ``private_key`` and
    ``ca_certificate`` (PEM: the files the agent's ``cert``, ``key`` and ``ca`` keys name)."""

    device_id: str
    fleet: str
    broker: str | None
    username: str | None = None
    password: str | None = None
    update_public_key: str
    manager_url: str | None = None
    ca: str | None = None
    certificate: str | None = None
    private_key: str | None = None
    ca_certificate: str | None = None


class Enrollment(Row):
    """An enrolled device's MQTT account (no password)."""

    device_id: str
    fleet: str
    username: str
    created_at: float
    revoked_at: float | None = None


class Revoked(BaseModel):
    device_id: str
    revoked: bool


class AuditEntry(Row):
    """Who did what through the API, when, from where."""

    id: int
    ts: float
    actor: str
    role: str | None = None
    action: str
    target: str | None = None
    remote: str | None = None
    detail: JsonObject


# ------------------------------------------------------------------------------------------ artifacts

class ArtifactStored(BaseModel):
    """An uploaded model file, by content."""

    sha256: str
    size: int


class EvidenceStored(BaseModel):
    """An event's stored snapshot or clip."""

    device_id: str
    event_id: str
    file: str
    size: int
    sha256: str


class EvidenceConflict(ErrorBody, EvidenceStored):
    """Other bytes are stored under this name already: evidence is immutable."""


# ------------------------------------------------------------------------------------------- overview

class DeviceCounts(BaseModel):
    total: int
    online: int
    offline: int
    degraded: int


class Fallback(BaseModel):
    device_id: str
    pipeline: str | None
    delegate: str | None
    reason: str | None


class ConfigCounts(BaseModel):
    """Devices per configuration status, and how many do not run their desired document (docs/fleet.md,
    Configuration)."""

    counts: dict[str, int]
    out_of_step: int


class Overview(BaseModel):
    """The fleet at a glance (from the device rows and the newest events)."""

    devices: DeviceCounts
    versions: dict[str, int]
    delegates: dict[str, int]
    fallbacks: list[Fallback]
    throttling: list[str]
    hot: list[str]
    backlogged: list[str]
    silent: list[str]
    events: list[JsonObject]
    config: ConfigCounts | None = None


class WhoAmI(BaseModel):
    token_id: str
    name: str
    role: Role


class Health(BaseModel):
    ok: bool
