"""Every example in examples/ runs as a user runs it (a real subprocess on the shared assets), and
what it prints is checked, not just its exit status."""

from __future__ import annotations

import csv
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from support.agent import AgentProcess, fake_sysfs, write_config
from support.assets import ASSETS, IMAGES, LABELS, MODELS, REFERENCE_TOP1
from support.broker import MOSQUITTO, free_port, make_tls_files, running_broker
from support.examples import (
    EXAMPLES,
    Prometheus,
    example_env,
    parse_exposition,
    processes_mentioning,
    readme_block,
    run_example,
)
from support.processes import edgeinfer_cmd
from support.profiles import fake_root

FRAME_LINE = re.compile(r"^frame (\d+): (.*)$", re.M)
CAMERA = Path("/dev/video0")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One clip cache for the module: each sample clip is generated once."""
    return tmp_path_factory.mktemp("cache")


def frame_lines(stdout: str) -> dict[int, str]:
    return {int(frame): rest for frame, rest in FRAME_LINE.findall(stdout)}


# ---------------------------------------------------------------------------------- vision examples

def test_camera_classifier_names_each_photo_of_the_sample_clip(cache):
    # without a camera, the default source is the generated clip; with one, ask for the clip explicitly
    args = ["--source", "sample"] if CAMERA.exists() else []
    result = run_example("camera_classifier.py", *args, "--max-frames", "30", cache=cache)
    assert "no camera given" in result.stderr and "clip of parrot.jpg, cat.bmp, grace_hopper.bmp" in result.stderr
    lines = frame_lines(result.stdout)
    # the clip shows each photo for 10 frames; the best guess is announced when it changes
    assert sorted(lines) == [0, 10, 20], result.stdout
    for frame, photo in ((0, "parrot.jpg"), (10, "cat.bmp"), (20, "grace_hopper.bmp")):
        label, score = re.fullmatch(r"(.+) \((\d\.\d\d)\)", lines[frame]).groups()
        assert label == REFERENCE_TOP1[photo][0], lines
        assert float(score) >= 0.5
    assert float(re.fullmatch(r"macaw \((\d\.\d\d)\)", lines[0]).group(1)) >= 0.95
    assert re.search(r"^30 frames in [\d.]+ s: [\d.]+ fps, latency p50 .* dropped 0, on \S+$", result.stdout, re.M)


def test_face_detector_boxes_are_in_source_pixels_and_drawn(cache, tmp_path):
    out = tmp_path / "annotated"
    result = run_example("face_detector.py", "--source", "sample", "--max-frames", "40", "--save-annotated",
                         str(out), cache=cache)
    lines = frame_lines(result.stdout)
    # frame 0: Grace Hopper, one face where the reference puts it, in the 512x600 photo's own pixels
    match = re.fullmatch(r"1 face\(s\): \((\d+),(\d+)\)-\((\d+),(\d+)\) (\d\.\d\d)", lines[0])
    assert match, lines
    box = [int(v) for v in match.groups()[:4]]
    assert all(abs(got - want) <= 12 for got, want in zip(box, (167, 115, 356, 327))), box
    assert float(match.group(5)) >= 0.99
    # frame 30 onwards: the group photo; a line is printed because the number of faces changed (other
    # lines come only every 2 s, so there are none on a machine that is not very slow)
    group = int(re.match(r"(\d+) face", lines[30]).group(1))
    assert group >= 3, lines[30]
    assert len(lines) <= 4, lines
    assert re.search(rf"^saved {len(lines)} annotated frame\(s\)", result.stdout, re.M), result.stdout
    assert sorted(p.name for p in out.iterdir()) == [f"frame_{n:06d}.jpg" for n in sorted(lines)]

    drawn = cv2.imread(str(out / "frame_000000.jpg"))
    original = cv2.resize(cv2.imread(str(IMAGES / "grace_hopper.bmp")), (512, 600))
    assert drawn.shape == original.shape == (600, 512, 3)
    diff = np.abs(drawn.astype(int) - original.astype(int)).sum(axis=2)
    x1, y1, _x2, y2 = box
    left_edge = diff[y1 + 10:y2 - 10, x1 - 1:x1 + 2]
    assert left_edge.mean() > 60  # the green line is there ...
    assert drawn[y1 + 10:y2 - 10, x1, 1].mean() > 200  # ... and green
    assert diff[y2 + 20:, :x1 - 20].mean() < 12  # elsewhere the frame is untouched (JPEG noise only)


def test_pose_demo_keypoints_match_the_reference(cache, tmp_path):
    out = tmp_path / "annotated"
    result = run_example("pose_demo.py", "--source", "sample", "--max-frames", "5", "--save-annotated", str(out),
                         cache=cache)
    header = frame_lines(result.stdout)[0]
    assert re.fullmatch(r"pose score 0\.\d\d, \d+/17 keypoints >= 0\.3", header), header
    rows = re.findall(r"^  (\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", result.stdout, re.M)
    keypoints = {name: (float(x), float(y), float(score)) for name, x, y, score in rows}
    assert len(keypoints) == 17
    # the reference output for squat.bmp (500x610), normalised coordinates
    with open(LABELS / "movenet_single_pose_lightning_ptq_reference.csv") as f:
        reference = list(csv.DictReader(f))
    names = list(keypoints)
    checked = 0
    for row in reference:
        if float(row["keypoint_score"]) < 0.3:
            continue
        x, y, _score = keypoints[names[int(row["keypoint_id"])]]
        assert abs(x - float(row["keypoint_x"]) * 500) < 25 and abs(y - float(row["keypoint_y"]) * 610) < 25, row
        checked += 1
    assert checked >= 15
    drawn = cv2.imread(str(out / "frame_000000.jpg"))
    assert drawn.shape == (610, 500, 3)
    for name in ("right_shoulder", "right_knee", "right_ankle"):  # confident keypoints get a red dot
        x, y, _ = keypoints[name]
        b, g, r = drawn[round(y), round(x)].astype(int)
        assert r > 180 and g < 90 and b < 90, (name, (b, g, r))


def test_segmentation_demo_finds_the_dog(cache, tmp_path):
    out = tmp_path / "annotated"
    result = run_example("segmentation_demo.py", "--source", "sample", "--max-frames", "5", "--save-annotated",
                         str(out), cache=cache)
    classes = dict(re.findall(r"([a-z ]+?) (\d+)%(?:, |$)", frame_lines(result.stdout)[0]))
    assert "dog" in classes, result.stdout
    # the photo's ground-truth trimap: 0 dog (47 %), 1 background, 2 the outline between them (12 %)
    truth = cv2.imread(str(IMAGES / "dog_segmentation_mask.bmp"), cv2.IMREAD_GRAYSCALE)
    dog, outline = truth == 0, truth == 2
    assert dog.mean() - 0.1 <= int(classes["dog"]) / 100 <= dog.mean() + outline.mean(), classes
    # the overlay is coloured where the dog is, and only there
    overlay = cv2.imread(str(out / "frame_000000.jpg")).astype(int)
    photo = cv2.imread(str(IMAGES / "dog_segmentation.bmp")).astype(int)
    coloured = np.abs(overlay - photo).sum(axis=2) > 60
    sure = ~outline
    iou = (coloured & dog & sure).sum() / ((coloured | dog) & sure).sum()
    assert iou > 0.75, iou
    purple = overlay[coloured & dog]  # PASCAL's colour for "dog" is (64, 0, 128) RGB
    assert purple[:, 0].mean() > purple[:, 1].mean() + 30


def test_callback_worker_hands_every_result_to_the_main_thread(cache, tmp_path):
    report = tmp_path / "report.json"
    result = run_example("callback_worker.py", "--source", "sample", "--max-frames", "45", "--interval", "0.3",
                         "--report", str(report), cache=cache)
    stopped = re.search(r"^stopped: (\d+) frames processed, (\d+) handled by the main thread, (\d+) dropped from "
                        r"the queue; side job ran (\d+) times$", result.stdout, re.M)
    assert stopped, result.stdout
    seen, handled, overflow, runs = map(int, stopped.groups())
    assert seen == 45 and handled + overflow == seen
    assert runs >= 2 and len(re.findall(r"^report \d+: ", result.stdout, re.M)) == runs
    written = json.loads(report.read_text())
    assert written["frames"] == 45 and sum(written["labels"].values()) == written["handled"] == handled
    assert written["labels"].get("macaw", 0) >= 10  # the parrot's 10 frames (at least) were tallied
    assert not list(tmp_path.glob(".report.json.partial"))


def test_callback_worker_stops_cleanly_on_sigterm(cache):
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "callback_worker.py"), "--source", "sample",
                             "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=example_env(cache))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any(line.startswith("report 2:") for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines) + proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr, stderr
    stopped = re.search(r"stopped: (\d+) frames processed, (\d+) handled by the main thread, (\d+) dropped",
                        "".join(lines))
    assert stopped, lines
    seen, handled, overflow = map(int, stopped.groups())
    assert seen > 0 and handled + overflow == seen


# ------------------------------------------------------------------------------------- agent over TLS

def install_tls_example(etc: Path, tls) -> Path:
    """examples/agent-tls.yaml, unchanged, in a folder laid out like /etc/edgeinfer with every file it names.

    The config's relative paths are relative to the config file, so a copy of it beside generated
    files is exactly what --check sees on a device.
    """
    etc.mkdir(parents=True, exist_ok=True)
    config = etc / "agent.yaml"
    shutil.copyfile(EXAMPLES / "agent-tls.yaml", config)
    (etc / "tls").mkdir(exist_ok=True)
    shutil.copyfile(tls.ca, etc / "tls/ca.crt")
    shutil.copyfile(tls.client_cert, etc / "tls/cam-01.crt")
    shutil.copyfile(tls.client_key, etc / "tls/cam-01.key")
    (etc / "mqtt-password").write_text("s3cret\n")
    made = subprocess.run(edgeinfer_cmd("keys", "init", "--dir", str(etc / "fleet"), "--json"), capture_output=True,
                          text=True, check=True)
    shutil.copyfile(json.loads(made.stdout)["public_key_file"], etc / "fleet-signing.pub")
    return config


def test_agent_tls_example_passes_check(tmp_path):
    tls = make_tls_files(tmp_path / "made")
    config = install_tls_example(tmp_path / "etc", tls)
    example = (EXAMPLES / "agent-tls.yaml").read_text()
    assert config.read_text() == example
    # --check opens the labels and the model the example names: not on this machine, a configuration error
    missing = subprocess.run(edgeinfer_cmd("agent", "--config", str(config), "--check"), capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 78, missing.stderr
    assert "pipelines[0].labels: labels file not found: /var/lib/edgeinfer/models/imagenet_labels.txt" in (
        missing.stderr)
    # the example with its model and labels where this machine keeps them
    config.write_text(example.replace("/var/lib/edgeinfer/models/mobilenet_v2_1.0_224_quant.tflite",
                                      str(MODELS / "mobilenet_v2_1.0_224_quant.tflite"))
                      .replace("/var/lib/edgeinfer/models/imagenet_labels.txt", str(LABELS / "imagenet_labels.txt")))
    checked = subprocess.run(edgeinfer_cmd("agent", "--config", str(config), "--check"), capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    printed = json.loads(checked.stdout)
    assert printed["device_id"] == "cam-01" and printed["fleet"] == "warehouse"
    assert printed["broker"].startswith("mqtts://broker.example.com:8883")
    assert printed["pipelines"] == ["main"] and printed["spool_max_bytes"] == 64 * 2**20
    assert (printed["models"][0]["task"], printed["models"][0]["labels"]) == ("classify", 1001)
    # --check really reads the TLS files: a key of another certificate is refused, naming the key
    shutil.copyfile(tls.other_key, tmp_path / "etc/tls/cam-01.key")
    refused = subprocess.run(edgeinfer_cmd("agent", "--config", str(config), "--check"), capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 78 and "key" in refused.stderr, refused.stderr


def _subscriber(port: int, username: str, password: str, topic: str, got: list) -> object:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"sub-{username}-{port}")
    client.username_pw_set(username, password)
    subscribed = threading.Event()
    client.on_connect = lambda c, u, f, reason, p: c.subscribe(topic, qos=1)
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_message = lambda c, u, m: got.append((m.topic, bytes(m.payload)))
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert subscribed.wait(10)
    return client


def connects_without_certificate(ca: Path, port: int) -> bool:
    """Whether a client with the right password but no client certificate gets a CONNACK."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    outcome: list[bool] = []
    done = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="no-cert", reconnect_on_failure=False)
    client.tls_set(ca_certs=str(ca))
    client.username_pw_set("cam-01", "s3cret")
    client.on_connect = lambda c, u, f, reason, p: (outcome.append(not reason.is_failure), done.set())
    client.on_disconnect = lambda *a: done.set()
    try:
        client.connect("localhost", port)  # TLS 1.2 fails here; with TLS 1.3 the refusal comes after it
    except OSError:
        return False
    client.loop_start()
    try:
        done.wait(10)
    finally:
        client.loop_stop()
    return outcome == [True]


def test_readme_tls_recipe_works_with_mosquitto(tmp_path):
    """The README's openssl commands, mosquitto.conf and ACL, and agent-tls.yaml, end to end over TLS."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    certs = tmp_path / "certs"
    certs.mkdir()
    script = readme_block("# make-certs.sh").replace("BROKER=broker.example.com", "BROKER=localhost")
    subprocess.run(["sh", "-c", script], cwd=certs, check=True, capture_output=True, timeout=60)
    assert {p.name for p in certs.iterdir()} >= {"ca.crt", "server.crt", "server.key", "cam-01.crt", "cam-01.key"}

    # Mosquitto with the README's configuration; only paths and ports differ
    broker_dir = tmp_path / "mosquitto"
    broker_dir.mkdir()
    tls_port, local_port = free_port(), free_port()
    conf = (readme_block("# /etc/mosquitto/conf.d/edgeinfer.conf")
            .replace("/etc/mosquitto/certs/", f"{certs}/")
            .replace("/etc/mosquitto/passwd", str(broker_dir / "passwd"))
            .replace("/etc/mosquitto/edgeinfer.acl", str(broker_dir / "edgeinfer.acl"))
            .replace("listener 8883", f"listener {tls_port} 127.0.0.1")
            .replace("listener 1883 127.0.0.1", f"listener {local_port} 127.0.0.1"))
    import getpass

    (broker_dir / "mosquitto.conf").write_text(f"user {getpass.getuser()}\nlog_dest stderr\n{conf}")
    (broker_dir / "edgeinfer.acl").write_text(readme_block("# /etc/mosquitto/edgeinfer.acl"))
    passwd = broker_dir / "passwd"
    passwd.write_text("")
    for user, password in (("fleet-manager", "fm-pass"), ("cam-01", "s3cret"), ("cam-02", "other")):
        subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True, capture_output=True)
    with open(broker_dir / "log", "wb") as log:
        broker = subprocess.Popen([MOSQUITTO, "-c", str(broker_dir / "mosquitto.conf")], stdout=log, stderr=log)
    clients = []
    try:
        deadline = time.monotonic() + 10
        while b"running" not in (broker_dir / "log").read_bytes():
            assert broker.poll() is None and time.monotonic() < deadline, (broker_dir / "log").read_text()
            time.sleep(0.05)
        got: list = []
        clients.append(_subscriber(local_port, "fleet-manager", "fm-pass", "edgeinfer/v1/#", got))

        # the agent: agent-tls.yaml with the broker address, data folder and pipeline of this test
        etc = tmp_path / "etc"
        (etc / "tls").mkdir(parents=True)
        for name in ("ca.crt", "cam-01.crt", "cam-01.key"):
            shutil.copyfile(certs / name, etc / "tls" / name)
        (etc / "mqtt-password").write_text("s3cret\n")
        keys = subprocess.run(edgeinfer_cmd("keys", "init", "--dir", str(tmp_path / "fleet"), "--json"),
                              capture_output=True, text=True, check=True)
        shutil.copyfile(json.loads(keys.stdout)["public_key_file"], etc / "fleet-signing.pub")
        settings = yaml.safe_load((EXAMPLES / "agent-tls.yaml").read_text())
        settings.update(broker=f"mqtts://localhost:{tls_port}", data_dir=str(tmp_path / "data"), profile="none",
                        metrics=None, telemetry_interval_s=0.3,
                        pipelines=[{"name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"),
                                    "source": str(IMAGES / "*.jpg"), "loop": True, "max_fps": 5, "threads": 1}])
        config = write_config(etc / "agent.yaml", **settings)
        with AgentProcess(config, tmp_path / "agent.log") as agent:
            deadline = time.monotonic() + 30
            while not any(t == "edgeinfer/v1/warehouse/cam-01/telemetry" for t, _ in got):
                assert agent.alive() and time.monotonic() < deadline, agent.output()
                time.sleep(0.1)
            birth = next(json.loads(p) for t, p in got if t.endswith("/cam-01/state"))
            assert birth["online"] is True and birth["groups"] == ["warehouse-north", "canary"]

            # the ACL: with cam-01's certificate and password, cam-01's topics pass, cam-02's do not
            device = paho.Client(CallbackAPIVersion.VERSION2, client_id="impostor")
            device.tls_set(ca_certs=str(certs / "ca.crt"), certfile=str(certs / "cam-01.crt"),
                           keyfile=str(certs / "cam-01.key"))
            device.username_pw_set("cam-01", "s3cret")
            device.connect("localhost", tls_port)
            device.loop_start()
            clients.append(device)
            device.publish("edgeinfer/v1/warehouse/cam-02/events", b"forged", qos=1).wait_for_publish(5)
            device.publish("edgeinfer/v1/warehouse/cam-01/events", b"own topic", qos=1).wait_for_publish(5)
            deadline = time.monotonic() + 5
            while not any(p == b"own topic" for _, p in got) and time.monotonic() < deadline:
                time.sleep(0.05)
            payloads = [p for _, p in got]
            assert b"own topic" in payloads and b"forged" not in payloads

            # and without a client certificate the TLS listener refuses the device
            assert not connects_without_certificate(certs / "ca.crt", tls_port)
            assert agent.terminate() == 0, agent.output()
    finally:
        for client in clients:
            client.loop_stop()
            client.disconnect()
        broker.kill()
        broker.wait(10)


# ------------------------------------------------------------------------------------------ fleet demo

def fleet_demo(*args: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(EXAMPLES / "fleet_demo.sh"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=example_env(Path("/nonexistent"), EDGEINFER=f"{sys.executable} -m edgeinfer"))


def test_fleet_demo_rolls_out_v2_and_leaves_nothing_running(tmp_path):
    work = tmp_path / "fleet-demo"
    proc = fleet_demo("--quick", "--workdir", str(work), "--timeout", "90")
    try:
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert re.search(r"^deployment \w+: succeeded$", output, re.M), output
    final = output[output.rindex("== 5."):]
    rows = re.findall(r"^(cam-\d\d)\s+(\S+)\s+(\S+)\s+(\S+)\s+", final, re.M)
    assert rows == [("cam-01", "online", "mobilenet_v2_1.0_224_inat_bird_quant.tflite", "2"),
                    ("cam-02", "online", "mobilenet_v2_1.0_224_inat_bird_quant.tflite", "2")], final
    assert "\n== done: 2 devices active on v2\n" in output
    assert processes_mentioning(str(work)) == []  # the trap stopped the manager and every agent


def test_fleet_demo_cleans_up_when_terminated(tmp_path):
    work = tmp_path / "fleet-demo"
    proc = fleet_demo("--quick", "--workdir", str(work), "--timeout", "60")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("== 3.") for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        time.sleep(1.0)  # the agents are starting
        assert len(processes_mentioning(str(work))) >= 3  # the fleet manager and two agents
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_mentioning(str(work)) == []


# --------------------------------------------------------------------------------------------- Grafana

@pytest.fixture(scope="module")
def metrics_agent(tmp_path_factory):
    """A real agent with a running pipeline, connected to a real broker, serving /metrics on a fake Pi 4."""
    tmp = tmp_path_factory.mktemp("metrics-agent")
    root = fake_sysfs(Path(fake_root(tmp / "root", "raspberry-pi-4")), {"cpu-thermal": 58.0}, throttled=0x0)
    port = free_port()
    with running_broker(tmp) as broker:
        config = write_config(
            tmp / "agent.yaml", device_id="cam-07", fleet="lab", broker=broker.url, data_dir=str(tmp / "data"),
            telemetry_interval_s=0.3, metrics=f"127.0.0.1:{port}", sensors={"root": str(root)},
            pipelines=[{"name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"),
                        "source": str(IMAGES / "*.jpg"), "loop": True, "max_fps": 10, "threads": 1,
                        "version": "4"}])
        with AgentProcess(config, tmp / "agent.log") as agent:
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 30
            while True:
                assert agent.alive() and time.monotonic() < deadline, agent.output()
                try:
                    body = urllib.request.urlopen(url, timeout=2).read().decode()
                    # a window with frames (its stage figures), not only the first, possibly empty, one
                    # samples, not only the HELP line a window without frames still writes
                    if all(name in body for name in ("edgeinfer_pipeline_fps{", "edgeinfer_pipeline_stage_ms{",
                                                     "edgeinfer_mqtt_connected 1.0")):
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            yield f"127.0.0.1:{port}", body


def dashboard() -> dict:
    return json.loads((EXAMPLES / "grafana-dashboard.json").read_text())


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}")
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}


def test_dashboard_is_grafana_json():
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"device", "pipeline"} <= set(variables)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in "xywh") and pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        cells = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells
    for panel in panels(board):
        assert panel["title"] and panel["type"] in {"timeseries", "stat", "table", "gauge"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] == "${datasource}"
            for name in (a or b for a, b in VARIABLE.findall(target["expr"])):
                assert name in variables or name in GRAFANA_BUILTINS, (panel["title"], name)


def test_dashboard_queries_name_only_what_the_agent_exports(metrics_agent):
    _address, body = metrics_agent
    exported = parse_exposition(body)
    labels_of = {name: set().union(*(s.keys() for s in samples)) for name, samples in exported.items()}
    used: set[str] = set()
    for panel in panels(dashboard()):
        for target in panel["targets"]:
            expr = target["expr"]
            for name, selector in re.findall(r"\b(edgeinfer_[a-z0-9_]+)(\{[^}]*\})?", expr):
                assert name in exported, f"{panel['title']!r}: {name} is not exported by the agent"
                used.add(name)
                for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector):
                    assert label in labels_of[name], f"{panel['title']!r}: {name} has no label {label!r}"
            for joined in re.findall(r"(?:on|group_left|by)\s*\(([^)]*)\)", expr):
                for label in filter(None, (x.strip() for x in joined.split(","))):
                    # the join labels come from the scrape (instance, job) or from one of the metrics
                    assert label in {"instance", "job"} or any(label in labels_of[n] for n in used), (expr, label)
    # every figure the dashboard promises has a panel
    assert used >= {"edgeinfer_pipeline_fps", "edgeinfer_pipeline_stage_ms", "edgeinfer_pipeline_dropped_frames_total",
                    "edgeinfer_cpu_percent", "edgeinfer_rss_bytes", "edgeinfer_temperature_celsius",
                    "edgeinfer_spool_pending_messages", "edgeinfer_spool_dropped_messages_total",
                    "edgeinfer_pipeline_info", "edgeinfer_agent_info"}
    info = exported["edgeinfer_pipeline_info"][0]
    assert info["delegate"] == "xnnpack" and info["model"] == "mobilenet_v1_0.25_128_quant.tflite"
    assert info["version"] == "4" and info["pipeline"] == "main"
    stages = {s["stage"] for s in exported["edgeinfer_pipeline_stage_ms"]}
    assert {"capture", "preprocess", "infer", "postprocess", "latency"} <= stages


def test_every_dashboard_query_returns_data_in_prometheus(metrics_agent, tmp_path):
    assert Prometheus.BINARY, "prometheus is not installed: make system-deps (apt-get install prometheus)"
    address, _body = metrics_agent
    values = {"datasource": "", "device": ".*", "pipeline": ".*", "quantile": "0.95", "__rate_interval": "20s",
              "__interval": "1s", "__range": "1m"}
    queries = [(panel["title"], VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], target["expr"]))
               for panel in panels(dashboard()) for target in panel["targets"]]
    prometheus = Prometheus(tmp_path / "prometheus", [address], free_port())
    try:
        prometheus.wait_ready()
        deadline = time.monotonic() + 30
        while True:
            empty = [(title, q) for title, q in queries if not prometheus.query(q)]  # a bad query raises here
            if not empty or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not empty, f"no data for {empty}"
        fps = prometheus.query(queries[[t for t, _ in queries].index("Frames per second")][1])
        assert fps[0]["metric"]["device"] == "cam-07" and float(fps[0]["value"][1]) > 0
    finally:
        prometheus.close()


def test_readme_lists_every_example():
    readme = (EXAMPLES / "README.md").read_text()
    shipped = {p.name for p in EXAMPLES.iterdir() if not p.name.startswith(("_", ".")) and p.name != "README.md"
               and p.name != "__pycache__"}
    for name in shipped:
        assert f"[`{name}`]({name})" in readme, f"examples/README.md does not list {name}"
    assert ASSETS.is_dir()
