"""The fleet database's tables at the newest migration (SQLAlchemy Core).

This module describes the schema the code queries; ``edgeinfer/fleet/migrations`` builds it, step
by step, in a real database. ``tests/fleet/test_migrations.py`` compares the two, so they cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tables:
    metadata: Any
    devices: Any
    telemetry: Any
    rollups: Any
    events: Any
    deployments: Any
    targets: Any
    tokens: Any
    audit: Any
    credentials: Any
    evidence: Any
    evidence_chunks: Any
    live_frames: Any
    analytics: Any
    samples: Any
    commands: Any
    command_samples: Any
    device_logs: Any
    diagnosis: Any
    config_revisions: Any
    config_targets: Any
    claims: Any
    claim_serials: Any
    provisioning: Any
    certificates: Any


def tables(sa: Any) -> Tables:
    metadata = sa.MetaData()
    devices = sa.Table(
        "devices", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("online", sa.Boolean, nullable=False),
        sa.Column("state", sa.JSON),
        sa.Column("model_name", sa.String(256)),
        sa.Column("model_version", sa.Integer),
        sa.Column("model_sha256", sa.String(64)),
        sa.Column("delegate", sa.String(64)),
        sa.Column("last_telemetry", sa.JSON),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("last_telemetry_ts", sa.Float),
    )
    telemetry = sa.Table(
        "telemetry", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False, index=True),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False, index=True),
        sa.Column("fps", sa.Float),
        sa.Column("latency_p95_ms", sa.Float),
        sa.Column("dropped", sa.Integer),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.UniqueConstraint("device_id", "boot_id", "seq", name="telemetry_once"),
    )
    rollups = sa.Table(
        "telemetry_rollup", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("fps_sum", sa.Float, nullable=False),
        sa.Column("latency_p95_max_ms", sa.Float),
        sa.Column("dropped_sum", sa.BigInteger, nullable=False),
        sa.Index("ix_telemetry_rollup_minute", "minute"),
    )
    events = sa.Table(
        "events", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False, index=True),
        sa.Column("ts", sa.Float, nullable=False, index=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("event_id", sa.String(64)),  # data.event_id of an event with evidence (rule_triggered)
        sa.Index("ix_events_device_event", "device_id", "event_id"),
    )
    deployments = sa.Table(
        "deployments", metadata,
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        # link/vocabulary.py DeploymentKind (migration 0011; rows from before are models)
        sa.Column("kind", sa.String(16), nullable=False, server_default="model"),
        sa.Column("model_name", sa.String(256), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("target", sa.String(1024), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("manifest", sa.JSON, nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("lease_owner", sa.String(128)),
        sa.Column("lease_until", sa.Float),
        sa.Column("analysis", sa.JSON),
    )
    targets = sa.Table(
        "deployment_devices", metadata,
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("wave", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("notified_at", sa.Float),
    )
    tokens = sa.Table(
        "api_tokens", metadata,
        sa.Column("token_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(128)),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
        sa.Column("last_used_at", sa.Float),
    )
    audit = sa.Table(
        "audit_log", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False, index=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16)),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256)),
        sa.Column("remote", sa.String(128)),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    credentials = sa.Table(
        "device_credentials", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("username", sa.String(128), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )
    evidence = sa.Table(  # one row per stored file of an event's evidence (fleet/evidence.py)
        "evidence", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("file", sa.String(16), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("chunks", sa.Integer, nullable=False),
        sa.Column("frames", sa.Integer),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Index("ix_evidence_created_at", "created_at"),
    )
    evidence_chunks = sa.Table(  # the file's bytes, EVIDENCE_CHUNK bytes a row, in order of seq
        "evidence_chunks", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("event_id", sa.String(64), primary_key=True),
        sa.Column("file", sa.String(16), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    live_frames = sa.Table(  # the newest frame of a watched (device, pipeline, stream): fleet/live_view.py
        "live_frames", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("stream", sa.String(64), primary_key=True),
        sa.Column("watched_until", sa.Float, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("jpeg", sa.LargeBinary),
        sa.Column("width", sa.Integer),
        sa.Column("height", sa.Integer),
        sa.Column("frame_time", sa.Float),
        sa.Column("frame_id", sa.String(64)),
        sa.Column("received_at", sa.Float),
    )
    analytics = sa.Table(  # a pipeline's lines and zones: last sent (set_analytics) and as the device applied them
        "analytics", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("stream", sa.String(64), primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("lines", sa.JSON, nullable=False),
        sa.Column("zones", sa.JSON, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("command_id", sa.String(128)),  # the command that sent them (migration 0009)
        sa.Column("applied_revision", sa.BigInteger),  # what the device's analytics_changed event said it applied
        sa.Column("applied_lines", sa.JSON),
        sa.Column("applied_zones", sa.JSON),
        sa.Column("applied_at", sa.Float),
    )
    samples = sa.Table(  # a sample for datasets (fleet/samples.py; migration 0008)
        "samples", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("sample_id", sa.String(64), primary_key=True),
        *(sa.Column(name, sa.String(size), nullable=False) for name, size in (
            ("pipeline", 64), ("stream", 64), ("rule", 128), ("model_name", 128), ("model_sha256", 64),
            ("model_version", 128))),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("captured_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("phash", sa.String(16), nullable=False),
        sa.Column("jpeg", sa.LargeBinary, nullable=False),
        sa.Column("detections", sa.JSON, nullable=False),
        sa.Column("labels", sa.JSON),
        sa.Column("label_names", sa.Text, nullable=False),  # " person car ": the label filter's LIKE
        sa.Column("reviewed", sa.Boolean, nullable=False),
        sa.Column("reviewed_at", sa.Float),
        sa.Index("ix_samples_created_at", "created_at"),
        sa.Index("ix_samples_scene", "device_id", "pipeline", "stream", "created_at"),
    )
    commands = sa.Table(  # each command the manager sent and the device's verdict (fleet/verdicts.py; migration 0009)
        "commands", metadata,
        sa.Column("command_id", sa.String(128), primary_key=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("cmd", sa.String(32), nullable=False),
        sa.Column("pipeline", sa.String(64)),
        sa.Column("summary", sa.JSON, nullable=False),  # its arguments, small and without secrets
        sa.Column("sent_by", sa.String(128), nullable=False),
        sa.Column("sent_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),  # sent, applied, refused (expired: read from expires_at)
        sa.Column("reason", sa.String(64)),
        sa.Column("message", sa.Text),
        sa.Column("result", sa.JSON),
        sa.Column("answered_at", sa.Float),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Index("ix_commands_device", "device_id", "sent_at"),
        sa.Index("ix_commands_updated_at", "updated_at"),
        sa.Index("ix_commands_expires_at", "expires_at"),
    )
    command_samples = sa.Table(  # what the manager did with each sample a command (capture) produced
        "command_samples", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("sample_id", sa.String(64), primary_key=True),
        sa.Column("command_id", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),  # stored, duplicate
        sa.Column("received_at", sa.Float, nullable=False),
        sa.Index("ix_command_samples_command", "command_id"),
    )
    device_logs, diagnosis = diagnosis_tables(sa, metadata)
    return Tables(metadata, devices, telemetry, rollups, events, deployments, targets, tokens, audit, credentials,
                  evidence, evidence_chunks, live_frames, analytics, samples, commands, command_samples, device_logs,
                  diagnosis, *config_tables(sa, metadata), *claim_tables(sa, metadata),
                  certificate_table(sa, metadata))


def certificate_table(sa: Any, metadata: Any) -> Any:
    """Every client certificate the fleet's CA issued to a device (fleet/device_certs.py): revoked ones make the CRL."""
    return sa.Table(
        "device_certificates", metadata,
        sa.Column("serial", sa.String(64), primary_key=True),  # hex, as the CRL lists it
        sa.Column("device_id", sa.String(128), nullable=False, index=True),
        sa.Column("issued_at", sa.Float, nullable=False),
        sa.Column("not_after", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )


def diagnosis_tables(sa: Any, metadata: Any) -> tuple[Any, Any]:
    """A device's log lines as it sent them on request, and where each device's logs and doctor requests stand
    (fleet/diagnosis.py; migration 0010)."""
    device_logs = sa.Table(
        "device_logs", metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("boot_id", sa.String(32), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("level", sa.SmallInteger, nullable=False),
        sa.Column("logger", sa.String(128), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
        sa.UniqueConstraint("device_id", "boot_id", "seq", name="device_logs_once"),
        sa.Index("ix_device_logs_device", "device_id", "id"),
        sa.Index("ix_device_logs_ts", "ts"),
    )
    diagnosis = sa.Table(
        "diagnosis", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("logs_requested_at", sa.Float),
        sa.Column("logs_command_id", sa.String(64)),
        sa.Column("follow_until", sa.Float),
        sa.Column("logs_received_at", sa.Float),
        sa.Column("logs_complete", sa.Boolean),
        sa.Column("logs_dropped", sa.BigInteger),
        sa.Column("doctor_requested_at", sa.Float),
        sa.Column("doctor_command_id", sa.String(64)),
        sa.Column("doctor_received_at", sa.Float),
        sa.Column("doctor_result", sa.Text),  # the device's upload as JSON text: exit code, report, error
    )
    return device_logs, diagnosis


def config_tables(sa: Any, metadata: Any) -> tuple[Any, Any]:
    """The fleet's configuration layers, one row per revision, and which document each device of a configuration
    deployment was given (fleet/configs.py; migration 0012)."""
    revisions = sa.Table(
        "config_revisions", metadata,
        sa.Column("scope", sa.String(16), primary_key=True),  # fleet, group, device (config_layers.Scope)
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("revision", sa.Integer, primary_key=True),  # 1, 2, ... per layer: the primary key is the lock
        sa.Column("document", sa.JSON, nullable=False),  # as the operator set it, secrets included
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("restored_from", sa.Integer),  # a roll back: the revision it equals
        sa.Column("applied_at", sa.Float),  # when it was released to the devices (null: saved, not applied yet)
        sa.Column("applied_by", sa.String(128)),
        sa.Index("ix_config_revisions_created_at", "created_at"),
    )
    targets = sa.Table(
        "config_targets", metadata,
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(128), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),  # the device's effective document (an artifact)
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("layers", sa.JSON, nullable=False),  # [[label, revision], ...]: what it was merged from
        sa.Index("ix_config_targets_device", "device_id"),
        sa.Index("ix_config_targets_sha256", "sha256"),
    )
    return revisions, targets


def claim_tables(sa: Any, metadata: Any) -> tuple[Any, Any, Any]:
    """Claims (a token baked into an image: the hash only), the serials a claim admits when it names them, and each
    device's provisioning request, pending, approved or rejected (fleet/claims.py; migrations 0013, 0015)."""
    claims = sa.Table(
        "claims", metadata,
        sa.Column("claim_id", sa.String(32), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),  # SHA-256 of the whole token, never the token
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("approve", sa.String(16), nullable=False),  # auto, manual (claims.Approval)
        sa.Column("max_devices", sa.Integer),  # null: no bound
        sa.Column("has_serials", sa.Boolean, nullable=False),  # only the serials in claim_serials
        sa.Column("name_template", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(128)),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
        # its pending and approved requests (migration 0015): what its max_devices bounds, kept by fleet/db/claims.py
        sa.Column("used", sa.Integer, nullable=False, server_default="0"),
    )
    serials = sa.Table(
        "claim_serials", metadata,
        sa.Column("claim_id", sa.String(32), primary_key=True),
        sa.Column("serial", sa.String(64), primary_key=True),
    )
    provisioning = sa.Table(
        "provisioning", metadata,
        sa.Column("device_id", sa.String(128), primary_key=True),  # the name the manager gave it
        sa.Column("serial", sa.String(64), nullable=False, unique=True),  # one request per piece of hardware
        sa.Column("claim_id", sa.String(32), nullable=False, index=True),
        sa.Column("fleet", sa.String(128), nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),  # pending, approved, rejected (claims.RequestState)
        sa.Column("public_key_sha256", sa.String(64), nullable=False),  # the CSR's SubjectPublicKeyInfo
        sa.Column("csr", sa.Text, nullable=False),
        sa.Column("hardware", sa.JSON, nullable=False),  # serial, model, mac as the device sent them
        sa.Column("remote", sa.String(128)),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("decided_at", sa.Float),
        sa.Column("decided_by", sa.String(128)),
        sa.Column("certificate", sa.Text),  # PEM, once approved (public: answered again to a restarted agent)
        sa.Column("cert_serial", sa.String(64)),  # hex
        sa.Column("not_after", sa.Float),
    )
    return claims, serials, provisioning
