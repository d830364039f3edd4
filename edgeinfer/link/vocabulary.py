"""The words both ends of the link use, defined once: the commands a fleet sends, the kinds of event a
device reports, the kinds of deployment and the states a device passes through in one, and the fleet a device
is in by default.

The agent and the fleet manager import these; ``docs/protocol.md`` (generated from ``protocol.py``) and
the fleet's OpenAPI document derive their lists from them. Each is a ``str`` enum whose value is the word
on the wire: a payload is built with ``.value`` and reads the same as before the enum existed, and a word
read from the wire compares equal to its member (``"active" == TargetState.ACTIVE``).

The form of an event id, which the pipeline shares too, lives in ``edgeinfer/_evidence.py``: the pipeline
is below the link in the layers.
"""

from __future__ import annotations

from enum import Enum

from ..pipeline import failover, streams

#: the fleet an agent and an enrolled device belong to unless told otherwise
DEFAULT_FLEET = "default"


class Word(str, Enum):
    """A word of the protocol: ``str()`` and f-strings give its value on every Python (3.10's and 3.12's
    ``format()`` of a mixed-in enum differ)."""

    def __str__(self) -> str:
        return str(self.value)


class Command(Word):
    """What a ``cmd`` message asks a device to do (``cmd``); docs/protocol.md, *Commands*."""

    #: answer with the boot id and uptime (unsigned allowed: it changes nothing)
    PING = "ping"
    #: restart one pipeline now (``args.pipeline``)
    RESTART_PIPELINE = "restart_pipeline"
    #: install a signed model update (``args.manifest``, ``args.signature``, ``args.pipeline``, ``args.grant``)
    DEPLOY = "deploy"
    #: go back to the previous model (``args.pipeline``)
    ROLLBACK = "rollback"
    #: push annotated JPEG frames of one pipeline's stream to the fleet manager until ``args.until`` (a unix
    #: time; the manager sends it again while someone watches): ``args.pipeline``, ``args.stream`` ("" for a
    #: single source), ``args.fps``, ``args.width``, ``args.max_kbps``, ``args.url`` (where to POST frames)
    LIVE_VIEW = "live_view"
    #: replace one pipeline's counting lines and zones without restarting it (kept across agent restarts):
    #: ``args.pipeline``, ``args.lines`` {name: [x1, y1, x2, y2]}, ``args.zones`` {name: [[x, y], ...]},
    #: ``args.revision``
    SET_ANALYTICS = "set_analytics"
    #: keep the next ``args.frames`` frames of one pipeline (``args.pipeline``; ``args.stream``: one stream, else
    #: each) as capture samples, whatever the rules say — the dashboard's "capture the next N frames"
    CAPTURE = "capture"
    #: send the agent's recent log lines (redacted, from its in-memory ring) after ``args.after`` of boot
    #: ``args.boot_id`` to ``args.url``; with ``args.until`` (a unix time) go on sending new lines until then
    LOGS = "logs"
    #: run ``edgeinfer doctor --json`` in a subprocess and send its report to ``args.url``
    DOCTOR = "doctor"


class EventKind(Word):
    """What an ``events`` message reports (``event``); docs/protocol.md, *Events*. In the order the
    protocol lists them; readers must accept kinds they do not know. What a running pipeline reports of
    its delegates and streams it names itself (the pipeline is below the link): those members take its words."""

    AGENT_STARTED = "agent_started"
    AGENT_STOPPING = "agent_stopping"
    PIPELINE_STARTED = "pipeline_started"
    PIPELINE_ENDED = "pipeline_ended"
    PIPELINE_FAILED = "pipeline_failed"
    PIPELINE_RESTARTING = "pipeline_restarting"
    FALLBACK = "fallback"
    DELEGATE_FALLBACK = failover.FALLBACK
    DELEGATE_RESTORED = failover.RESTORED
    STREAM_FAILED = streams.STREAM_FAILED
    STREAM_RESTORED = streams.STREAM_RESTORED
    STREAM_ENDED = streams.STREAM_ENDED
    RULE_TRIGGERED = "rule_triggered"
    #: a pipeline's lines and zones were replaced (``data.pipeline``, ``data.revision``, ``data.lines``, ``data.zones``)
    ANALYTICS_CHANGED = "analytics_changed"
    EVIDENCE_UPLOAD_FAILED = "evidence_upload_failed"
    #: the fleet manager refused a capture sample for good (``data.sample_id``, ``data.status``, ``data.error``)
    SAMPLE_UPLOAD_FAILED = "sample_upload_failed"
    #: a capture sample could not be written on the device (a full disk): ``data.error``, ``data.stream``,
    #: ``data.rule`` (at most one a minute per pipeline; the samples stored stay)
    CAPTURE_FAILED = "capture_failed"
    MQTT_RECONNECTED = "mqtt_reconnected"
    CMD_RESULT = "cmd_result"
    CMD_REJECTED = "cmd_rejected"
    ERROR = "error"
    #: a deploy command's progress (``data.deployment_id``, ``data.state``: a :class:`TargetState`)
    UPDATE = "update"


#: the kinds the ``events`` schema's description lists (docs/protocol.md is generated from it and does not
#: change: ``update`` is described with the deploy command in docs/fleet.md)
SCHEMA_EVENT_KINDS = tuple(kind for kind in EventKind if kind is not EventKind.UPDATE)


class DeploymentKind(Word):
    """What a deployment installs on a device: the kind of its artifact. The signed manifest names it (``kind``);
    a model's manifest leaves it out, so an agent older than kinds still takes a model and refuses every other kind
    as a bad manifest (an unknown field) instead of installing it as a model. Versions are per kind (a downgrade is
    judged against what the device runs of that kind); waves, the abort rate, the device timeout, the canary, the
    audit and rollback are the same for every kind. docs/fleet.md, *Deployment kinds*."""

    #: a model for one pipeline (the manifest has no ``kind``): downloaded, validated, swapped in, health-gated
    MODEL = "model"
    #: the agent's configuration
    CONFIG = "config"
    #: edgeinfer itself: a bundle of wheels installed into the agent's other environment slot (the launcher's)
    AGENT = "agent"

    @classmethod
    def of(cls, word: str | None) -> DeploymentKind:
        """The kind a manifest's ``kind`` names (absent: a model); ValueError for a word this version does not know."""
        return cls.MODEL if word is None else cls(word)


class TargetState(Word):
    """Where one device stands in a deployment. The agent reports ``downloading``, ``validating``,
    ``active``, ``failed`` and ``rolled_back`` in its ``update`` events; the fleet sets the others."""

    PENDING = "pending"
    NOTIFIED = "notified"
    DOWNLOADING = "downloading"
    VALIDATING = "validating"
    ACTIVE = "active"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    #: the device refused the deploy command (``cmd_rejected``)
    REJECTED = "rejected"
    #: no answer within the deployment's device timeout
    TIMEOUT = "timeout"


#: the states of a healthy update, in the order a device passes through them
PROGRESS_STATES = (TargetState.PENDING, TargetState.NOTIFIED, TargetState.DOWNLOADING, TargetState.VALIDATING,
                   TargetState.ACTIVE)
FAILED_STATES = (TargetState.FAILED, TargetState.ROLLED_BACK, TargetState.REJECTED, TargetState.TIMEOUT)
FINISHED_STATES = (TargetState.ACTIVE, *FAILED_STATES)
#: states in which a device owes an answer (the device timeout runs from its notification)
WAITING_STATES = (TargetState.NOTIFIED, TargetState.DOWNLOADING, TargetState.VALIDATING)
