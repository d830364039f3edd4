"""agent.yaml: validated on load, every error names the file and the key."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from support.agent import AgentProcess, write_config
from support.assets import DOCS, IMAGES, MODELS
from support.broker import make_tls_files
from support.processes import edgeinfer_cmd

from edgeinfer.agent.config import load_config, parse_config
from edgeinfer.agent.pipeline_config import PIPELINE_KEYS
from edgeinfer.agent.runner import default_pipeline_factory
from edgeinfer.errors import ConfigError
from edgeinfer.link.spool import DEFAULT_MAX_BYTES
from edgeinfer.pipeline.options import PipelineOptions

MODEL = str(MODELS / "mobilenet_v2_1.0_224_quant.tflite")


def test_minimal_config_gets_the_documented_defaults(tmp_path):
    config = load_config(write_config(tmp_path / "agent.yaml", device_id="cam-01"))
    assert (config.fleet, config.broker, config.telemetry_interval_s) == ("default", "mqtt://127.0.0.1:1883", 1.0)
    assert config.spool_max_bytes == DEFAULT_MAX_BYTES and config.pipelines == ()
    assert config.topics.telemetry == "edgeinfer/v1/default/cam-01/telemetry"
    assert config.client_id == "edgeinfer-default-cam-01"
    assert config.path == tmp_path / "agent.yaml"


def test_device_id_defaults_to_the_host_name():
    assert parse_config({}, hostname="pi-kitchen.local").device_id == "pi-kitchen"
    with pytest.raises(ConfigError, match="device_id: not set, and the host name"):
        parse_config({}, hostname="bad host")


def test_full_config_with_relative_paths(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "pw").write_text("s3cret\n")
    config = load_config(write_config(
        tmp_path / "agent.yaml", device_id="cam-01", fleet="plant-7", broker="mqtt://broker.local",
        username="cam-01", password_file="pw", data_dir="state", telemetry_interval_s=0.5,
        spool_max_bytes="8MiB", metrics=9108, mqtt_version="3.1.1",
        sensors={"thermal_zones": "cpu-thermal", "throttle": [{"path": "/sys/x", "mask": 1}]},
        pipelines=[{"name": "main", "model": "models/m.tflite", "source": "0", "loop": True, "max_fps": 5},
                   {"name": "door", "model": MODEL, "source": "rtsp://cam/stream", "task": "detect"}]))
    assert config.password == "s3cret" and config.username == "cam-01"
    assert config.data_dir == tmp_path / "state" and config.spool_max_bytes == 8 * 1024 * 1024
    assert config.metrics == ("127.0.0.1", 9108)
    assert config.sensors.thermal_zones == ("cpu-thermal",) and config.sensors.throttle[0].mask == 1
    main, door = config.pipelines
    assert main.model == str(tmp_path / "models/m.tflite") and main.source == 0 and main.loop
    assert door.source == "rtsp://cam/stream" and door.pipeline_kwargs()["task"] == "detect"
    assert config.link_settings().broker.port == 1883


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"device_id": "cam/01"}, "device_id: 'cam/01' is not valid"),
        ({"broker": "http://x"}, "broker: broker URL 'http://x' has scheme 'http'"),
        ({"broker": "mqtt://"}, "broker: broker URL 'mqtt://' has no host"),
        ({"telemetry_interval_s": "fast"}, "telemetry_interval_s: must be a number, got 'fast'"),
        ({"telemetry_interval_s": 0}, "telemetry_interval_s: must be a number >= 0.01"),
        ({"spool_max_bytes": "lots"}, "spool_max_bytes: must be a size"),
        ({"spool_max_bytes": "10KiB"}, "spool_max_bytes: must be at least"),
        ({"telemetry_intreval_s": 1}, "telemetry_intreval_s: unknown key — did you mean 'telemetry_interval_s'?"),
        ({"pipelines": {"name": "main"}}, "pipelines: must be an array, got a JSON object"),
        ({"pipelines": [{"name": "main", "source": "0"}]}, "pipelines[0]: missing required key 'model'"),
        ({"pipelines": [{"model": MODEL}]}, "pipelines[0].source: required"),
        ({"pipelines": [{"model": MODEL, "source": 0, "task": "dance"}]},
         "pipelines[0].task: must be one of classify, detect, pose, segment, obb, got 'dance'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "max_fps": -1}]},
         "pipelines[0].max_fps: must be a number > 0, got -1"),
        ({"pipelines": [{"model": MODEL, "source": 0, "loop": "yes"}]}, "pipelines[0].loop: must be true or false"),
        ({"pipelines": [{"model": MODEL, "source": 0, "modle": "x"}]}, "pipelines[0].modle: unknown key"),
        ({"pipelines": [{"model": MODEL, "source": 0, "top_k": 0}]},
         "pipelines[0].top_k: must be an integer >= 1, got 0"),
        ({"pipelines": [{"model": MODEL, "source": 0, "threads": 1.5}]}, "pipelines[0].threads: must be an integer"),
        ({"pipelines": [{"model": MODEL, "source": 0, "policy": "all"}]},
         "pipelines[0].policy: must be one of every, latest, got 'all'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "score_threshold": "high"}]},
         "pipelines[0].score_threshold: must be a number, got 'high'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "queue_size": 0}]},
         "pipelines[0].queue_size: must be an integer >= 1, got 0"),
        ({"pipelines": [{"model": MODEL, "source": 0, "stats_window": 8}]},
         "pipelines[0].stats_window: must be an integer >= 16, got 8"),
        ({"pipelines": [{"model": MODEL, "source": 0, "size": "big"}]},
         "pipelines[0].size: must be WIDTHxHEIGHT such as 640x480, or [640, 480], got 'big'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "size": [640, 0]}]},
         "pipelines[0].size[1]: must be an integer >= 1, got 0"),
        ({"pipelines": [{"model": MODEL, "source": 0, "mean": ["a"]}]},
         "pipelines[0].mean[0]: must be a number, got 'a'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "resize": "zoom"}]},
         "pipelines[0].resize: must be one of stretch, letterbox, crop, got 'zoom'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "preprocess_in": "gpu"}]},
         "pipelines[0].preprocess_in: must be one of auto, capture, inference, got 'gpu'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "backoff": 5}]},
         "pipelines[0].backoff: must be an object, got 5"),
        ({"pipelines": [{"model": MODEL, "source": 0, "backoff": {"intial_s": 1}}]},
         "pipelines[0].backoff.intial_s: unknown key — did you mean 'initial_s'?"),
        ({"pipelines": [{"model": MODEL, "source": 0, "backoff": {"max_s": "long"}}]},
         "pipelines[0].backoff.max_s: must be a number, got 'long'"),
        ({"pipelines": [{"model": MODEL, "source": 0, "backoff": {"initial_s": 10, "max_s": 1}}]},
         "pipelines[0].backoff: invalid backoff"),
        ({"pipelines": [{"model": MODEL, "source": 0, "restart": "sometimes"}]},
         "pipelines[0].restart: must be one of on-failure, always, never, got 'sometimes'"),
        ({"pipelines": [{"model": MODEL, "source": 0}, {"model": MODEL, "source": 1, "name": "main"}]},
         "two pipelines are named 'main'"),
        ({"password": "x"}, "username: required when a password is given"),
        ({"password": 1234, "username": "u"}, "password: must be a string"),
        ({"password_file": "/nonexistent/pw", "username": "u"}, "password_file: cannot read"),
        ({"reconnect_min_s": 5, "reconnect_max_s": 1}, "reconnect_max_s: must be >= reconnect_min_s"),
        ({"mqtt_version": 4}, "mqtt_version: must be one of auto, 5, 3.1.1"),
        ({"metrics": "localhost:http"}, "metrics: must be PORT or HOST:PORT"),
        ({"sensors": {"throttle": [42]}}, "sensors.throttle[0]: must be a sysfs file path"),
        ({"ca": "/etc/ca.pem"}, "broker: ca/cert/key are set, so the broker URL must be mqtts://"),
    ],
)
def test_each_mistake_names_its_key(tmp_path, values, message):
    path = write_config(tmp_path / "agent.yaml", **{"device_id": "cam-01", **values})
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_every_pipeline_option_is_a_key_of_a_pipeline_entry(tmp_path):
    (tmp_path / "labels.txt").write_text("a\nb\n")
    every = {
        "task": "detect", "decoder": "ssd", "labels": "labels.txt", "top_k": 3, "score_threshold": 0.3,
        "iou_threshold": 0.6,
        "max_detections": 10, "delegate": "coral,xnnpack", "delegate_probe": False, "threads": 2, "failover": False,
        "watchdog": False,
        "watchdog_floor_s": 2.5, "watchdog_factor": 4, "probe_backoff": {"initial_s": 5, "max_s": 120},
        "motion_gate": True, "motion_threshold": 12, "motion_min_area": 0.01, "motion_max_skip": 15,
        "track": True, "lines": ["door=320,470,320,10"], "zones": "shop=420,10,630,10,630,330",
        "track_min_hits": 4, "line_band": 0.2, "line_hold_s": 0.5, "line_trigger": "box",
        "events": ["line_crossed:door/person", "detection:0.8"], "event_cooldown_s": 5, "events_per_minute": 10,
        "evidence_dir": "evidence", "evidence_max_mb": 50, "evidence_pre_s": 1.5, "evidence_post_s": 2,
        "evidence_fps": 4, "evidence_width": 480, "record_source": "rtsp://door-cam/main",
        "sample": ["uncertain:0.3-0.6"], "samples_dir": "samples", "samples_max_mb": 50, "samples_per_minute": 3,
        "loop": True, "size": "1280x720", "fps": 15,
        "fourcc": "MJPG", "backoff": {"initial_s": 1, "max_s": 30, "give_up_s": 600}, "policy": "latest",
        "max_fps": 5, "max_frames": 100, "queue_size": 4, "resize": "letterbox", "mean": 127.5,
        "std": [58.4, 57.1, 57.4], "channels": "bgr", "pad": "corner", "preprocess_in": "inference",
        "reduced_decode": False, "keep_frames": True,
        "opencv_threads": None, "stats_window": 64,
    }
    assert set(every) == set(PipelineOptions.names())  # a new pipeline option gets a line here
    config = load_config(write_config(tmp_path / "agent.yaml", device_id="cam-01", pipelines=[
        {"name": "door", "model": MODEL, "source": 0, "version": "7", "restart": "always", **every}]))
    pipeline = config.pipelines[0]
    options = pipeline.options
    assert type(options) is PipelineOptions
    assert (options.task, options.labels, options.top_k) == ("detect", str(tmp_path / "labels.txt"), 3)
    assert options.decoder == "ssd"
    assert (options.score_threshold, options.iou_threshold, options.max_detections) == (0.3, 0.6, 10)
    assert (options.size, options.fps, options.fourcc, options.loop) == ((1280, 720), 15.0, "MJPG", True)
    assert (options.backoff.initial_s, options.backoff.max_s, options.backoff.give_up_s) == (1.0, 30.0, 600.0)
    assert (options.policy, options.max_fps, options.max_frames, options.queue_size) == ("latest", 5.0, 100, 4)
    assert (options.mean, options.std) == (127.5, (58.4, 57.1, 57.4))
    assert (options.channels, options.pad) == ("bgr", "corner")
    assert (options.resize, options.preprocess_in, options.reduced_decode, options.keep_frames) == (
        "letterbox", "inference", False, True)
    assert options.opencv_threads is None and options.stats_window == 64  # null: leave OpenCV's threads alone
    assert (options.delegate, options.failover, options.watchdog) == ("coral,xnnpack", False, False)
    assert options.delegate_probe is False
    assert (options.watchdog_floor_s, options.watchdog_factor, options.probe_backoff.max_s) == (2.5, 4.0, 120.0)
    assert (options.motion_gate, options.motion_threshold, options.motion_min_area, options.motion_max_skip) == (
        True, 12.0, 0.01, 15)
    assert (options.track, options.lines, options.zones) == (True, ("door=320,470,320,10",),
                                                             ("shop=420,10,630,10,630,330",))
    assert (options.track_min_hits, options.line_band, options.line_hold_s, options.line_trigger) == (
        4, 0.2, 0.5, "box")
    assert (options.events, options.event_cooldown_s, options.events_per_minute) == (
        ("line_crossed:door/person", "detection:0.8"), 5.0, 10)
    assert (options.evidence_dir, options.evidence_max_mb, options.evidence_pre_s, options.evidence_post_s,
            options.evidence_fps, options.evidence_width) == (str(tmp_path / "evidence"), 50.0, 1.5, 2.0, 4.0, 480)
    assert options.record_source == "rtsp://door-cam/main"
    assert (pipeline.name, pipeline.version, pipeline.restart, pipeline.threads) == ("door", "7", "always", 2)
    assert set(PIPELINE_KEYS) == set(PipelineOptions.names()) | {"name", "model", "source", "sources", "batch",
                                                                 "version", "restart"}
    assert parse_config({"pipelines": [{"model": MODEL, "source": 0, "size": [640, 480]}]},
                        hostname="cam").pipelines[0].size == (640, 480)
    assert parse_config({"pipelines": [{"model": MODEL, "source": 0}]}, hostname="cam").pipelines[0].options == \
        PipelineOptions()  # nothing given: the pipeline's own defaults


def test_pipeline_options_reach_the_pipeline_the_agent_builds(tmp_path):
    config = parse_config({"device_id": "cam-01", "pipelines": [{
        "name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"),
        "source": str(IMAGES / "*.jpg"), "threads": 1, "top_k": 2, "score_threshold": 0.25, "iou_threshold": 0.3,
        "queue_size": 3, "resize": "crop", "mean": 127.5, "std": 127.5, "stats_window": 32,
        "opencv_threads": None, "keep_frames": True}]}, base=tmp_path)
    pipeline = default_pipeline_factory(config.pipelines[0])  # what the runner builds (not started)
    try:
        # the same options, the task decided from the model (a classifier: one 1xN output) where none was given
        assert pipeline.options == dataclasses.replace(config.pipelines[0].options, task="classify")
        assert (pipeline.options.queue_size, pipeline.options.score_threshold, pipeline.options.top_k) == \
            (3, 0.25, 2)
    finally:
        pipeline.close()


def test_docs_list_every_pipeline_key():
    text = (DOCS / "agent.md").read_text()
    section = text.split("### Pipeline keys", 1)[1].split("\n#", 1)[0]
    documented = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    assert documented == set(PIPELINE_KEYS)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("device_id: cam-01\npipelines: [\n  - name: main\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML at line \d+, column \d+"):
        load_config(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping"):
        load_config(bad)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def test_bad_tls_files_are_caught_at_load_naming_the_key(tmp_path, tls_files):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    base = {"device_id": "cam-01", "broker": "mqtts://127.0.0.1:8883"}
    cases = [
        ({"ca": str(tmp_path / "nope.crt")}, "ca: file .*nope.crt does not exist"),
        ({"ca": str(tls_files.client_key)}, "ca: .* holds no PEM certificate"),
        ({"ca": str(garbage)}, "ca: .* is not a valid PEM CA certificate"),
        ({"ca": str(tls_files.ca), "cert": str(tls_files.client_cert)}, "key: required when cert is given"),
        ({"ca": str(tls_files.ca), "cert": str(tls_files.client_cert), "key": str(tls_files.other_key)},
         "cert/key: the private key .*other.key does not belong to the certificate"),
        ({"ca": str(tls_files.ca), "cert": str(tls_files.client_key), "key": str(tls_files.client_key)},
         "cert: .* holds no PEM certificate"),
        ({"ca": str(tls_files.ca), "cert": str(tls_files.client_cert), "key": str(tls_files.ca)},
         "key: .* holds no PEM private key"),
    ]
    for values, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            load_config(write_config(tmp_path / "agent.yaml", **base, **values))
    good = load_config(write_config(tmp_path / "agent.yaml", **base, ca=str(tls_files.ca),
                                    cert=str(tls_files.client_cert), key=str(tls_files.client_key)))
    assert good.link_settings().broker.tls


def test_cli_config_errors_exit_78_with_one_line_and_no_traceback(tmp_path):
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01",
                        pipelines=[{"name": "main", "model": MODEL, "source": 0, "max_fps": "fast"}])
    result = subprocess.run(edgeinfer_cmd("agent", "--config", str(path)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 78  # EX_CONFIG: the systemd unit does not restart on it
    assert result.stderr.strip() == f"edgeinfer: error: {path}: pipelines[0].max_fps: must be a number, got 'fast'"
    assert "Traceback" not in result.stderr


def test_cli_check_validates_and_prints(tmp_path):
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01", data_dir=str(tmp_path / "d"))
    result = subprocess.run(edgeinfer_cmd("agent", "--config", str(path), "--check"), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"topics": "edgeinfer/v1/default/cam-01"' in result.stdout
    assert not Path(tmp_path / "d").exists()  # --check starts nothing


def test_unwritable_data_dir_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01", broker="mqtt://127.0.0.1:1",
                        data_dir=str(blocker / "sub"))
    result = subprocess.run(edgeinfer_cmd("agent", "--config", str(path)), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 78
    assert "data_dir: cannot write to" in result.stderr and "Traceback" not in result.stderr


def test_second_agent_on_the_same_data_dir_is_refused(tmp_path):
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01", broker="mqtt://127.0.0.1:1",
                        data_dir=str(tmp_path / "data"))
    with AgentProcess(path, tmp_path / "first.log") as first:
        assert first.wait_for_output("event agent_started", 30), first.output()
        second = subprocess.run(edgeinfer_cmd("agent", "--config", str(path)), capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 78
        assert f"another agent (pid {first.pid}) is running with {tmp_path / 'data'}" in second.stderr
        assert first.alive()


def test_profile_by_name_file_or_detection(tmp_path):
    from support.profiles import fake_root

    from edgeinfer.agent.config import resolve_profile

    def config(**values):
        return load_config(write_config(tmp_path / "agent.yaml", device_id="cam-01", **values))

    assert resolve_profile(config(profile="jetson-orin-nano")).name == "jetson-orin-nano"
    assert resolve_profile(config(profile="none")) is None
    root = fake_root(tmp_path / "root", "raspberry-pi-5")
    assert resolve_profile(config(sensors={"root": str(root)})).name == "raspberry-pi-5"  # "auto" by default
    (tmp_path / "mine.yaml").write_text("schema: 1\nname: my-board\nextends: generic-aarch64\n")
    assert resolve_profile(config(profile="mine.yaml")).name == "my-board"
    with pytest.raises(ConfigError, match="profile: no device profile named 'raspbery-pi-4' — did you mean "
                                          "'raspberry-pi-4'"):
        resolve_profile(config(profile="raspbery-pi-4"))
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01", profile="raspbery-pi-4")
    result = subprocess.run(edgeinfer_cmd("agent", "--config", str(path), "--check"), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 78 and "did you mean 'raspberry-pi-4'" in result.stderr
