"""The telemetry of a pipeline with several sources: its ``streams`` list, as the schema bounds it."""

from __future__ import annotations

import copy
import json

import pytest

from edgeinfer.errors import ProtocolError
from edgeinfer.link.protocol import MAX_STREAMS, SCHEMAS, decode, schema_errors, validate

ANALYTICS = {"tracks": {"confirmed": 4, "active": 1}, "lines": [{"name": "door", "in": 3, "out": 1}],
             "zones": [{"name": "shop", "inside": 1, "entries": 2, "mean_visit_s": 4.5}]}


def telemetry(streams: list[dict]) -> dict:
    frames = sum(s["frames"] for s in streams)
    return {"v": 1, "type": "telemetry", "fleet": "f", "device": "d", "ts": 1.0, "boot_id": "a" * 32, "seq": 1,
            "interval_s": 1.0, "system": {"cpu_percent": 3.0, "rss_bytes": 1}, "spool": {"pending": 0, "dropped": 0},
            "pipelines": [{"name": "lobby", "status": "running", "frames": frames, "dropped": 0, "fps": 30.0,
                           "stages": {"infer": {"p50": 4.0, "p95": 5.0, "p99": 6.0}}, "streams": streams}]}


def stream(name: str, **values) -> dict:
    return {"name": name, "status": "running", "frames": 10, "dropped": 1, "fps": 10.0, "reused": 2, **values}


def test_a_pipeline_with_streams_is_valid_on_every_path(parser):
    message = telemetry([stream("stream0"), stream("door", analytics=ANALYTICS), stream("yard.2", status="failed",
                                                                                        frames=0, fps=0.0)])
    assert validate("telemetry", message) is message
    assert decode("telemetry", json.dumps(message)) == message
    # deeper than any other message (8 levels): still far inside the nesting bound
    assert decode("telemetry", json.dumps(telemetry([stream(f"s{i}", analytics=ANALYTICS)
                                                     for i in range(MAX_STREAMS)])))
    minimal = telemetry([{"name": "s", "frames": 0, "dropped": 0, "fps": 0.0, "future_field": [1]}])
    assert validate("telemetry", minimal) is minimal  # a v1 reader ignores what it does not know


@pytest.mark.parametrize(("change", "needle"), [
    (lambda streams: streams.extend(stream(f"s{i}") for i in range(MAX_STREAMS)),
     f"$.pipelines[0].streams: allows at most {MAX_STREAMS} items"),
    (lambda streams: streams[0].pop("frames"), "$.pipelines[0].streams[0]: missing required key 'frames'"),
    (lambda streams: streams[0].update(name="front door"), "$.pipelines[0].streams[0].name"),
    (lambda streams: streams[0].update(name=""), "$.pipelines[0].streams[0].name"),
    (lambda streams: streams[0].update(frames=-1), "$.pipelines[0].streams[0].frames: must be an integer >= 0"),
    (lambda streams: streams[0].update(fps=1e9), "$.pipelines[0].streams[0].fps: must be a number <="),
    (lambda streams: streams[0].update(reused=True), "$.pipelines[0].streams[0].reused: must be an integer"),
    (lambda streams: streams[0].update(analytics={"lines": [{"name": "door"}]}),
     "$.pipelines[0].streams[0].analytics.lines[0]: missing required key 'in'"),
])
def test_bad_streams_are_refused_saying_where(parser, change, needle):
    message = telemetry([stream("door")])
    change(message["pipelines"][0]["streams"])
    with pytest.raises(ProtocolError) as info:
        decode("telemetry", json.dumps(message))
    assert needle in str(info.value)


def test_the_fast_decoder_never_accepts_a_stream_the_schema_refuses():
    import msgspec  # noqa: F401 - the fast decoder's (the fleet extra)

    from edgeinfer.link import schema_fast

    schema = SCHEMAS["telemetry"]
    good = telemetry([stream("door", analytics=ANALYTICS)])
    assert schema_fast.accepts("telemetry", schema, json.dumps(good))  # the manager's fast path is taken
    wrong = [None, True, -1, 1.5, "", "x y", [], {}, 2**60]
    checked = 0
    for key in (*good["pipelines"][0]["streams"][0], "analytics.tracks.active", "analytics.lines.0.in"):
        for value in wrong:
            mutated = copy.deepcopy(good)
            target = mutated["pipelines"][0]["streams"][0]
            *path, leaf = key.split(".")
            for part in path:
                target = target[int(part)] if isinstance(target, list) else target[part]
            target[leaf] = value
            if schema_fast.accepts("telemetry", schema, json.dumps(mutated)):
                assert not schema_errors(mutated, schema), (key, value)
            checked += 1
    assert checked > 60
