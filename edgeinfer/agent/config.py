"""The agent's configuration file (``agent.yaml``): frozen dataclasses, validated on load.

Every problem raises :class:`~edgeinfer.errors.ConfigError` naming the file and the key
(``agent.yaml: pipelines[0].max_fps: must be a number, got 'fast'``); unknown keys are errors
too, with a suggestion, because a typo in a daemon's config must not be silently ignored.
Relative paths (models, labels, TLS files, data_dir) are relative to the config file. The keys of a
``pipelines:`` entry are every option of :class:`edgeinfer.Pipeline` plus the agent's own
(:mod:`.pipeline_config`); the MQTT link's settings sit flat beside the agent's own top-level keys.

Example::

    device_id: cam-01                 # default: the host name
    fleet: default
    broker: mqtts://broker.example:8883
    ca: /etc/edgeinfer/ca.crt         # mqtts: verify the broker; cert + key: client certificate
    username: cam-01                  # password, or password_file (kept out of the config)
    # or, one image for many devices: a claim traded for a certificate on first boot (docs/provisioning.md)
    # claim: eic_...                  # with manager_url; serial: overrides the hardware's serial number
    data_dir: /var/lib/edgeinfer      # spool, command log, model slots
    telemetry_interval_s: 1.0
    spool_max_bytes: 64MiB
    metrics: 127.0.0.1:9108           # optional Prometheus /metrics
    profile: auto                     # device profile: auto (detect), a name, a .yaml file, or none
    sensors:
      thermal_zones: [cpu-thermal]
      throttle: [/sys/devices/platform/soc/soc:firmware/get_throttled]
    pipelines:
      - name: main
        model: /opt/models/mobilenet_v2_1.0_224_quant.tflite
        source: /dev/video0
        task: classify
"""

from __future__ import annotations

import dataclasses
import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..link.config_document import document_problems, fleet_part
from ..link.protocol import Topics
from ..link.settings import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_INFLIGHT_WINDOW,
    DEFAULT_KEEPALIVE_S,
    DEFAULT_RECONNECT_MAX_S,
    DEFAULT_RECONNECT_MIN_S,
    DEFAULT_SESSION_EXPIRY_S,
    MQTT_VERSIONS,
    LinkSettings,
    parse_broker_url,
    tls_context,
)
from ..link.spool import DEFAULT_MAX_BYTES, MIN_MAX_BYTES
from ..link.vocabulary import DEFAULT_FLEET
from ..util.config import suggestion
from .config_reader import ID_RE, ConfigReader
from .pipeline_config import PipelineConfig, read_pipeline
from .telemetry import ThrottleSensor, throttle_sensor

DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
DEFAULT_UPDATE_VALIDATE_TIMEOUT_S = 60.0
DEFAULT_UPDATE_HEALTH_FRAMES = 20
DEFAULT_UPDATE_MAX_LATENCY_FACTOR = 3.0
DEFAULT_DATA_DIR = "/var/lib/edgeinfer"
DEFAULT_TELEMETRY_INTERVAL_S = 1.0
MIN_TELEMETRY_INTERVAL_S = 0.01
MAX_TELEMETRY_INTERVAL_S = 3600.0
DEFAULT_RESTART_MIN_S = 1.0
DEFAULT_RESTART_MAX_S = 60.0


@dataclass(frozen=True, kw_only=True)
class SensorConfig:
    """Which hardware sensors telemetry reads, and under which root (``/`` on a device)."""

    root: str = "/"
    thermal_zones: tuple[str, ...] = ()
    throttle: tuple[ThrottleSensor, ...] = ()


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """The whole agent configuration."""

    path: Path | None = None
    device_id: str
    fleet: str = DEFAULT_FLEET
    #: how to reach the broker: URL, TLS files, credentials, MQTT version, timers (client id: fleet + device)
    mqtt: LinkSettings
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    telemetry_interval_s: float = DEFAULT_TELEMETRY_INTERVAL_S
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    restart_min_s: float = DEFAULT_RESTART_MIN_S
    restart_max_s: float = DEFAULT_RESTART_MAX_S
    metrics: tuple[str, int] | None = None
    #: "auto" (detect from the device), a profile name, a profile .yaml file, or "none"
    profile: str = "auto"
    sensors: SensorConfig = SensorConfig()
    pipelines: tuple[PipelineConfig, ...] = ()
    #: device groups a rollout can target (``edgeinfer deploy --group``), reported in ``state``
    groups: tuple[str, ...] = ()
    #: the fleet's Ed25519 public key (base64, or a file holding it); no key: updates are refused
    update_public_key: str | None = None
    #: seconds a new model may take to load and run once in the validation subprocess
    update_validate_timeout_s: float = DEFAULT_UPDATE_VALIDATE_TIMEOUT_S
    #: frames the new model must run healthily in the live pipeline before it is committed
    update_health_frames: int = DEFAULT_UPDATE_HEALTH_FRAMES
    #: the new model's median inference time may be at most this factor of the old one's
    update_max_latency_factor: float = DEFAULT_UPDATE_MAX_LATENCY_FACTOR
    #: the fleet manager's HTTP API (``https://fleet.example:8443``): where event evidence is uploaded
    manager_url: str | None = None
    #: a fleet's claim token (one image for many devices): traded for a certificate on first boot
    #: (agent/provisioning.py); the identity it brings (``<data_dir>/identity/``) is laid over these keys
    claim: str | None = field(default=None, repr=False)
    #: the serial number a claim names the device by (default: the hardware's, agent/identity.py)
    serial: str | None = None
    #: the mapping it was read from: a fleet revision's keys are laid over it (agent/configuration.py)
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def topics(self) -> Topics:
        return Topics(self.fleet, self.device_id)

    @property
    def client_id(self) -> str:
        """The stable MQTT client id (a persistent session is keyed by it)."""
        return self.mqtt.client_id

    @property
    def broker(self) -> str:
        return self.mqtt.url

    @property
    def username(self) -> str | None:
        return self.mqtt.username

    @property
    def password(self) -> str | None:
        return self.mqtt.password

    def link_settings(self) -> LinkSettings:
        """The MQTT link's settings."""
        return self.mqtt


# --------------------------------------------------------------------------------------- loading

# the YAML's top-level keys: the agent's own, and the MQTT link's settings flat beside them
TOP_KEYS = frozenset(({f.name for f in fields(AgentConfig)} - {"path", "mqtt", "data"})
                     | ({f.name for f in fields(LinkSettings)} - {"url", "client_id"}) | {"broker", "password_file"})
_SENSOR_KEYS = {"root", "thermal_zones", "throttle"}


def _sensors(value: Any, file: str, base: Path) -> SensorConfig:
    if value is None:
        return SensorConfig()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{file}: sensors: must be a mapping with thermal_zones and/or throttle")
    r = ConfigReader(value, "sensors.", file, base)
    r.check_unknown(_SENSOR_KEYS)
    zones = r.get("thermal_zones", [])
    if isinstance(zones, str):
        zones = [zones]
    if not isinstance(zones, list) or not all(isinstance(z, str) and z for z in zones):
        raise r.fail("thermal_zones", "must be a list of zone names (cpu-thermal, thermal_zone0) or sysfs files")
    throttle: list[ThrottleSensor] = []
    raw = r.get("throttle", [])
    for index, item in enumerate(raw if isinstance(raw, list) else [raw]):
        key = f"throttle[{index}]"
        if isinstance(item, str) and item:
            throttle.append(throttle_sensor(item))
        elif isinstance(item, Mapping) and isinstance(item.get("path"), str):
            extra = set(item) - {"path", "base", "mask", "name"}
            if extra:
                raise r.fail(key, f"unknown key {sorted(extra)[0]!r} (known: path, base, mask, name)")
            base_value, mask = item.get("base"), item.get("mask")
            if base_value not in (None, 0, 2, 8, 10, 16) or (mask is not None and not isinstance(mask, int)):
                raise r.fail(key, "base must be 0, 2, 8, 10 or 16 and mask an integer")
            throttle.append(throttle_sensor(item["path"], base=base_value, mask=mask, name=str(item.get("name", ""))))
        else:
            raise r.fail(key, f"must be a sysfs file path or a mapping with path, base, mask; got {item!r}")
    root = r.path("root") or "/"
    return SensorConfig(root=root, thermal_zones=tuple(zones), throttle=tuple(throttle))


def _metrics(value: Any, file: str) -> tuple[str, int] | None:
    if value is None or value is False:
        return None
    host, port = "127.0.0.1", value
    if isinstance(value, str):
        host, _, port_text = value.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        port = int(port_text) if port_text.isdigit() else None
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"{file}: metrics: must be PORT or HOST:PORT (e.g. 127.0.0.1:9108), got {value!r}")
    return host, port


def parse_config(data: Any, *, file: str = "agent.yaml", base: Path | None = None,
                 hostname: str | None = None) -> AgentConfig:
    """Validate a decoded YAML document and build the AgentConfig (ConfigError names file and key)."""
    base = base or Path.cwd()
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{file}: the top level must be a mapping of keys (device_id, broker, pipelines, ...)")
    r = ConfigReader(data, "", file, base)
    r.check_unknown(TOP_KEYS)
    data, provisioned = _with_identity(r, data)
    r = ConfigReader(data, "", file, base)
    # the keys a fleet document may set are checked first as the fleet's are, by the one schema (same words)
    problems = document_problems(fleet_part(data))
    if problems:
        raise ConfigError(f"{file}: {problems[0]}")

    device_id = _device_id(r, hostname)
    fleet = r.identifier("fleet", DEFAULT_FLEET)
    # a claimed device has no broker before it is provisioned: its CA (for the manager) must not need mqtt://
    broker = _broker(r, "mqtts://127.0.0.1:8883" if r.get("claim") and not provisioned else DEFAULT_BROKER)
    reconnect_min, reconnect_max = _window(r, "reconnect", DEFAULT_RECONNECT_MIN_S, DEFAULT_RECONNECT_MAX_S)
    restart_min, restart_max = _window(r, "restart", DEFAULT_RESTART_MIN_S, DEFAULT_RESTART_MAX_S)
    data_dir = Path(r.path("data_dir") or DEFAULT_DATA_DIR)
    pipelines = _with_store_dirs(_pipelines(r), data_dir)
    groups = r.get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) and ID_RE.match(g) for g in groups):
        raise r.fail("groups", f"must be a list of ids (A-Z a-z 0-9 . _ -), got {groups!r}")
    update_key = _update_key(r)
    profile = r.string("profile", "auto")
    assert profile is not None
    mqtt = LinkSettings(
        **broker, client_id=f"edgeinfer-{fleet}-{device_id}",
        mqtt_version=str(r.string("mqtt_version", "auto", choices=MQTT_VERSIONS)),
        keepalive_s=r.number("keepalive_s", DEFAULT_KEEPALIVE_S, minimum=5, maximum=65535, integer=True),
        session_expiry_s=r.number("session_expiry_s", DEFAULT_SESSION_EXPIRY_S, minimum=0, maximum=2**32 - 1,
                                  integer=True),
        reconnect_min_s=reconnect_min, reconnect_max_s=reconnect_max,
        connect_timeout_s=float(r.number("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S, above=0, maximum=600)),
        inflight_window=r.number("inflight_window", DEFAULT_INFLIGHT_WINDOW, minimum=1, maximum=1000, integer=True),
    )
    return AgentConfig(
        device_id=device_id, fleet=fleet, mqtt=mqtt,
        data_dir=data_dir,
        telemetry_interval_s=float(r.number("telemetry_interval_s", DEFAULT_TELEMETRY_INTERVAL_S,
                                            minimum=MIN_TELEMETRY_INTERVAL_S, maximum=MAX_TELEMETRY_INTERVAL_S)),
        spool_max_bytes=r.size("spool_max_bytes", DEFAULT_MAX_BYTES, minimum=MIN_MAX_BYTES),
        restart_min_s=restart_min, restart_max_s=restart_max,
        metrics=_metrics(r.get("metrics"), file),
        profile=profile,
        sensors=_sensors(r.get("sensors"), file, base),
        pipelines=pipelines,
        groups=tuple(groups),
        update_public_key=update_key,
        update_validate_timeout_s=float(r.number("update_validate_timeout_s", DEFAULT_UPDATE_VALIDATE_TIMEOUT_S,
                                                 above=0, maximum=3600)),
        update_health_frames=r.number("update_health_frames", DEFAULT_UPDATE_HEALTH_FRAMES, minimum=1,
                                      maximum=100000, integer=True),
        update_max_latency_factor=float(r.number("update_max_latency_factor", DEFAULT_UPDATE_MAX_LATENCY_FACTOR,
                                                 above=1.0, maximum=1000)),
        manager_url=_manager_url(r),
        claim=r.string("claim"),
        serial=r.string("serial"),
        data=dict(data),
    )


def _with_identity(r: ConfigReader, data: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """A claimed device's agent.yaml with its identity (``<data_dir>/identity/identity.yaml``) laid over it, and
    whether there is one (agent/identity.py)."""
    claim = r.string("claim")
    if claim is None:
        return data, False
    if r.string("manager_url") is None:
        raise r.fail("claim", "needs manager_url: the fleet manager the claim is traded with")
    from .identity import identity_dir, read_identity

    identity = read_identity(identity_dir(r.path("data_dir") or DEFAULT_DATA_DIR))
    return ({**data, **identity}, True) if identity else (data, False)


def _device_id(r: ConfigReader, hostname: str | None) -> str:
    """``device_id``, or the host name when it is a valid id."""
    device_id = r.identifier("device_id", None)
    if device_id is None:
        host = (hostname or socket.gethostname()).split(".")[0]
        if not ID_RE.match(host):
            raise r.fail("device_id", f"not set, and the host name {host!r} is not a valid id; set device_id")
        device_id = host
    return device_id


def _broker(r: ConfigReader, default: str = DEFAULT_BROKER) -> dict[str, Any]:
    """The broker's URL, TLS files (loaded once, to fail now) and credentials: LinkSettings keywords."""
    broker = r.string("broker", default)
    try:
        url = parse_broker_url(broker)
    except ValueError as exc:
        raise r.fail("broker", str(exc)) from None
    ca, cert, key = r.path("ca"), r.path("cert"), r.path("key")
    if (ca or cert or key) and not url.tls:
        raise r.fail("broker", f"ca/cert/key are set, so the broker URL must be mqtts://, got {broker!r}")
    if url.tls:
        try:
            tls_context(ca, cert, key)
        except ConfigError as exc:
            raise ConfigError(f"{r.file}: {exc}") from None
    username = r.string("username")
    password = r.get("password")
    if password is not None and not isinstance(password, str):
        raise r.fail("password", "must be a string (quote it in YAML)")
    password_file = r.path("password_file")
    if password_file:
        if password is not None:
            raise r.fail("password_file", "give password or password_file, not both")
        try:
            password = Path(password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise r.fail("password_file", f"cannot read {password_file}: {exc.strerror}") from None
    if password is not None and username is None and url.username is None:
        raise r.fail("username", "required when a password is given")
    return {"url": broker, "ca": ca, "cert": cert, "key": key, "username": username, "password": password}


def _window(r: ConfigReader, prefix: str, default_min: float, default_max: float) -> tuple[float, float]:
    """``<prefix>_min_s`` and ``<prefix>_max_s`` of a backoff, the maximum at least the minimum."""
    low = r.number(f"{prefix}_min_s", default_min, above=0, maximum=3600)
    high = r.number(f"{prefix}_max_s", max(default_max, low), above=0, maximum=86400)
    if high < low:
        raise r.fail(f"{prefix}_max_s", f"must be >= {prefix}_min_s ({low:g})")
    return float(low), float(high)


def _pipelines(r: ConfigReader) -> tuple[PipelineConfig, ...]:
    raw = r.get("pipelines", [])
    if not isinstance(raw, list):
        raise r.fail("pipelines", "must be a list of pipelines (each with name, model, source)")
    return tuple(read_pipeline(item, i, r.file, r.base) for i, item in enumerate(raw))  # names unique: the document


def _with_store_dirs(pipelines: tuple[PipelineConfig, ...], data_dir: Path) -> tuple[PipelineConfig, ...]:
    """A pipeline with event rules and no ``evidence_dir`` keeps its evidence in ``<data_dir>/evidence/<name>``;
    one with sampling rules and no ``samples_dir`` its samples in ``<data_dir>/samples/<name>``."""
    def placed(p: PipelineConfig) -> PipelineConfig:
        if p.events and p.evidence_dir is None:
            p = dataclasses.replace(p, evidence_dir=str(data_dir / "evidence" / p.name))
        if p.sample and p.samples_dir is None:
            p = dataclasses.replace(p, samples_dir=str(data_dir / "samples" / p.name))
        return p

    return tuple(placed(p) for p in pipelines)


def _manager_url(r: ConfigReader) -> str | None:
    url = r.string("manager_url")
    if url is None:
        return None
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
        raise r.fail("manager_url", f"must be http(s)://HOST[:PORT][/PATH] (the fleet manager's API), got {url!r}")
    return url.rstrip("/")


def _update_key(r: ConfigReader) -> str | None:
    """The pinned fleet key: the base64 key itself, or the path of a file holding it."""
    from ..updates.signing import VerifyKey

    value = r.string("update_public_key")
    if value is None:
        return None
    as_path = Path(os.path.expanduser(value))
    as_path = as_path if as_path.is_absolute() else r.base / as_path
    if len(value) < 4096 and as_path.is_file():
        value = str(as_path)
    try:
        VerifyKey.from_config_value(value)
    except ConfigError as exc:
        raise r.fail("update_public_key", f"{exc} — pin the key `edgeinfer keys show` prints") from None
    return value


def resolve_profile(config: AgentConfig, *, detect_now: bool = True) -> Any:
    """The device profile the config names (``auto``: detected under ``sensors.root``), or None.

    ConfigError (naming the ``profile`` key) for an unknown name or a bad profile file. With
    ``detect_now=False`` (``--check``), ``auto`` is not resolved.
    """
    from ..device.detect import detect
    from ..device.profiles import load_profile, load_profiles
    from ..errors import ProfileError

    spec = config.profile
    where = f"{config.path or 'config'}: profile"
    try:
        if spec == "none":
            return None
        if spec == "auto":
            return detect(config.sensors.root).profile if detect_now else None
        if spec.endswith((".yaml", ".yml")) or "/" in spec:
            path = Path(spec) if Path(spec).is_absolute() or config.path is None else config.path.parent / spec
            return load_profile(path)
        known = load_profiles()
        if spec not in known:
            raise ConfigError(f"{where}: no device profile named {spec!r}{suggestion(spec, sorted(known))}")
        return known[spec]
    except ProfileError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {spec}: {exc.strerror or exc}") from None


def load_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and validate an agent.yaml; ConfigError names the file and the key that is wrong."""
    import yaml

    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{file}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read the config file ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{file}: not valid YAML{where}: {problem}") from None
    config = parse_config(data, file=str(file), base=file.resolve().parent)
    return dataclasses.replace(config, path=file)
