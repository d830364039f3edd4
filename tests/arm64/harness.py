"""``make test-arm64``: edgeinfer from this working tree, checked inside a Debian bookworm arm64 userland (the base
of Raspberry Pi OS) under qemu-user emulation. Correctness only: nothing here measures speed.

    python tests/arm64/harness.py [--cache build/arm64] [--cpu cortex-a72] [--agent-seconds 20]

Runs as root (debootstrap, chroot, mount). The image is built once under --cache (image.py); a run then installs
this tree's wheel in it and checks, each line PASS or FAIL with its figures:

  1. ``edgeinfer doctor`` and ``edgeinfer device --json`` (no crash; aarch64, the generic-aarch64 profile)
  2. ``edgeinfer classify`` on the shared photos through xnnpack (LiteRT) and onnxruntime: reference top-1
  3. ``edgeinfer run`` over a clip made by ``make_test_clip`` in the image: every frame's top-1
  4. ``edgeinfer agent`` for --agent-seconds against a Mosquitto on this machine: consecutive telemetry seqs
  5. ``firmware_scripts/setup-pi.sh --root`` on its own overlay of the image (provisioned from scratch whenever
     firmware_scripts/ or pyproject.toml changed), run twice (the second changes nothing), then its venv used

Exit status: 0 all passed, 1 a check failed, 2 the emulated userland could not be set up.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from itertools import pairwise
from pathlib import Path

import tomllib  # Python 3.11: the harness runs on the host's venv

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from image import (  # noqa: E402 - the harness is run as a script; its helpers sit beside it
    Chroot,
    Layer,
    SetupError,
    build_base,
    digest,
    ensure_binfmt,
    ensure_host_tools,
    host_run,
    read_stamp,
    remove_tree,
    tail,
    unmount_stale,
)
from support.assets import REFERENCE_TOP1  # noqa: E402 - the tests' own reference results

VENV = "/opt/edgeinfer-test/venv"           # the harness's venv in the image (not setup-pi.sh's)
EDGEINFER = f"{VENV}/bin/edgeinfer"
WORK = "/tmp/edgeinfer-arm64"               # emptied at every run
MODEL_TFLITE = "/assets/models/mobilenet_v2_1.0_224_quant.tflite"
MODEL_ONNX = "/assets/models/mobilenet_v2_1.0_224_quant.onnx"
LABELS = "/assets/labels/imagenet_labels.txt"
SCORE_TOLERANCE = 0.06                      # tests/runtime/test_delegates.py: reference score +- this
CLIP_IMAGES = ("parrot.jpg", "cat.bmp", "grace_hopper.bmp")
FRAMES_PER_IMAGE = 10
HARNESS_EXTRAS = ("tflite", "onnx")         # plus paho-mqtt from `fleet` for the agent


class Report:
    """PASS/FAIL lines and phase times."""

    def __init__(self) -> None:
        self.results: list[tuple[str, bool]] = []
        self.phases: list[tuple[str, float]] = []
        self.started = time.monotonic()

    def check(self, name: str, ok: bool, detail: str, log: Path | None = None) -> bool:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
        if not ok and log is not None:
            print(f"      log {log}:\n{tail(log)}", flush=True)
        self.results.append((name, ok))
        return ok

    @contextlib.contextmanager
    def phase(self, name: str, *, fatal: bool = False):
        print(f"\n== {name}", flush=True)
        started = time.monotonic()
        try:
            yield
        except SetupError:
            raise
        except Exception as exc:  # a check that could not even run is a FAIL, and the other phases go on
            if fatal:
                raise SetupError(f"{name}: {type(exc).__name__}: {exc}") from exc
            self.check(name, False, f"{type(exc).__name__}: {exc}")
        finally:
            seconds = time.monotonic() - started
            self.phases.append((name, seconds))
            print(f"-- {name}: {seconds:.1f} s", flush=True)

    def summary(self) -> int:
        failed = [name for name, ok in self.results if not ok]
        print("\nphase times (emulated: correctness only, not speed):")
        for name, seconds in self.phases:
            print(f"  {seconds:7.1f} s  {name}")
        print(f"  {time.monotonic() - self.started:7.1f} s  total")
        names = f": {', '.join(failed)}" if failed else ""
        print(f"{len(self.results) - len(failed)} PASS, {len(failed)} FAIL{names}")
        return 1 if failed else 0


# ------------------------------------------------------------------------------------------- install

def build_wheel(cache: Path, log: Path) -> Path:
    """A wheel of this working tree as it is now (tracked and untracked files git does not ignore)."""
    src, dist = cache / "src", cache / "dist"
    for folder in (src, dist):
        remove_tree(folder)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode:
        raise SetupError(f"git ls-files failed in {REPO}: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is skipped
            target = src / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o777)
    result = host_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                       str(dist), str(src)], log)
    wheels = sorted(dist.glob("edgeinfer-*.whl"))
    if result.returncode or not wheels:
        raise SetupError(f"pip wheel of the working tree failed:\n{tail(log)}")
    return wheels[0]


def wheel_key(wheel: Path) -> str:
    """The wheel's content (its RECORD hashes every file), not its zip timestamps."""
    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        return digest(archive.read(record).decode())


def requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    paho = [r for r in optional["fleet"] if r.startswith("paho-mqtt")]
    return [*project["dependencies"], *(r for e in HARNESS_EXTRAS for r in optional[e]), *paho]


def install(chroot: Chroot, layer: Layer, wheel: Path, fresh: bool, report: Report) -> None:
    shipped = f"{WORK}/{wheel.name}"
    chroot.path(WORK).mkdir(parents=True, exist_ok=True)
    chroot.path(shipped).write_bytes(wheel.read_bytes())
    if fresh:
        print(f"[arm64] the test venv: {VENV} with edgeinfer[{','.join(HARNESS_EXTRAS)}] + paho-mqtt from PyPI "
              "(aarch64 wheels) ...", flush=True)
        paho = [r for r in requirements() if r.startswith("paho-mqtt")]
        for args in (["/usr/bin/python3", "-m", "venv", VENV],
                     [f"{VENV}/bin/pip", "install", "-q", f"{shipped}[{','.join(HARNESS_EXTRAS)}]", *paho]):
            result = chroot.run("install", *args)
            if result.returncode:
                raise SetupError(f"in the image, {' '.join(args)} failed:\n{tail(chroot.logs / 'install.log')}")
        layer.done(wheel=wheel_key(wheel))
    elif layer.facts().get("wheel") != wheel_key(wheel):
        result = chroot.run("install", f"{VENV}/bin/pip", "install", "-q", "--no-deps", "--force-reinstall", shipped)
        if result.returncode:
            raise SetupError(f"installing {wheel.name} in the image failed:\n{tail(chroot.logs / 'install.log')}")
        layer.done(wheel=wheel_key(wheel))
    versions = chroot.run("install", f"{VENV}/bin/python", "-c",
                          "import importlib.metadata as m, platform; print(platform.machine(), "
                          "platform.python_version(), *(f'{d} {m.version(d)}' for d in ('edgeinfer', 'numpy', "
                          "'ai-edge-litert', 'onnxruntime', 'onnx', 'opencv-python-headless', 'paho-mqtt')))")
    report.check("install", versions.returncode == 0 and versions.stdout.startswith("aarch64 "),
                 versions.stdout.strip() or versions.stderr.strip()[-300:], chroot.logs / "install.log")


# -------------------------------------------------------------------------------------------- phases

def phase_doctor_device(chroot: Chroot, report: Report) -> None:
    log = chroot.logs / "doctor.log"
    plain = chroot.run("doctor", EDGEINFER, "doctor")
    as_json = chroot.run("doctor", EDGEINFER, "doctor", "--json")
    crashed = any(r.returncode not in (0, 1) or "Traceback" in r.stderr for r in (plain, as_json))
    try:
        found = json.loads(as_json.stdout)
        statuses = [f"{f['status']} {f['check']}" for f in found["findings"]]
        last = plain.stdout.strip().splitlines()[-1]
        detail = (f"exit {plain.returncode}, profile {found['profile']}, {found['problems']} problem(s), "
                  f"{found['warnings']} warning(s): {'; '.join(statuses)}; last line '{last}'")
    except (ValueError, KeyError, IndexError) as exc:
        found, detail = None, f"doctor --json is not a report ({exc})"
    report.check("doctor", not crashed and found is not None, detail, log)

    device = chroot.run("device", EDGEINFER, "device", "--json")
    try:
        data = json.loads(device.stdout)
    except ValueError as exc:
        report.check("device --json", False, f"exit {device.returncode}, not JSON ({exc})", chroot.logs / "device.log")
        return
    host = data["detection"]["host"]
    available = sorted(d["spec"] for d in data["delegates"] if d["available"])
    openvino = next((d["reason"] for d in data["delegates"] if d["name"] == "openvino"), "?")
    ok = (device.returncode == 0 and host["arch"] == "aarch64" and data["profile"] == "generic-aarch64"
          and data["selected"] == "xnnpack" and {"xnnpack", "onnxruntime"} <= set(available))
    report.check("device --json", ok, f"valid JSON, arch {host['arch']}, profile {data['profile']}, selected "
                 f"{data['selected']}, available {available}; openvino: {openvino[:80]}", chroot.logs / "device.log")


def phase_classify(chroot: Chroot, report: Report) -> None:
    images = [f"/assets/images/{name}" for name in REFERENCE_TOP1]
    for model, delegate in ((MODEL_TFLITE, "xnnpack"), (MODEL_ONNX, "onnxruntime")):
        name = f"classify {Path(model).suffix[1:]} {delegate}"
        result = chroot.run(f"classify-{delegate}", EDGEINFER, "classify", model, *images, "--delegate", delegate,
                            "--labels", LABELS, "--top-k", "1", "--json")
        log = chroot.logs / f"classify-{delegate}.log"
        try:
            rows = json.loads(result.stdout)
        except ValueError as exc:
            report.check(name, False, f"exit {result.returncode}, not JSON ({exc})", log)
            continue
        good, figures = 0, []
        for row in rows:
            image, top = Path(row["image"]).name, row["top"][0]
            label, score = REFERENCE_TOP1[image]
            right = (row["delegate"] == delegate and top["label"].startswith(label)
                     and abs(top["score"] - score) <= SCORE_TOLERANCE)
            good += right
            figures.append(f"{image} {top['label'].split(',')[0]} {top['score']:.3f}"
                           + ("" if right else f" (want {label} {score:.2f})"))
        report.check(name, result.returncode == 0 and good == len(REFERENCE_TOP1) == len(rows),
                     f"{good}/{len(REFERENCE_TOP1)} reference top-1 (score within {SCORE_TOLERANCE}): "
                     + ", ".join(figures), log)


def phase_pipeline(chroot: Chroot, report: Report) -> str:
    clip = f"{WORK}/clip.avi"
    make = chroot.run("clip", f"{VENV}/bin/python", "-c",
                      "import sys, edgeinfer; p = edgeinfer.make_test_clip(sys.argv[1], sys.argv[2:], size=(320, 240),"
                      f" fps=10, frames_per_image={FRAMES_PER_IMAGE}); print(p.stat().st_size)",
                      clip, *(f"/assets/images/{name}" for name in CLIP_IMAGES))
    if not report.check("make_test_clip", make.returncode == 0,
                        f"{clip}: {len(CLIP_IMAGES)} photos x {FRAMES_PER_IMAGE} frames, 320x240 MJPEG, "
                        f"{make.stdout.strip()} bytes", chroot.logs / "clip.log"):
        return clip
    expected = [REFERENCE_TOP1[name][0] for name in CLIP_IMAGES for _ in range(FRAMES_PER_IMAGE)]
    for model, delegate in ((MODEL_TFLITE, "xnnpack"), (MODEL_ONNX, "onnxruntime")):
        # no --delegate: the generic-aarch64 profile's selection must pick it
        result = chroot.run(f"run-{delegate}", EDGEINFER, "run", model, "--source", clip, "--labels", LABELS,
                            "--top-k", "1", "--json")
        log = chroot.logs / f"run-{delegate}.log"
        try:
            lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
            frames = [line for line in lines if line.get("type") == "result"]
            summary = next(line for line in lines if line.get("type") == "summary")
        except (ValueError, StopIteration) as exc:
            report.check(f"run {delegate}", False, f"exit {result.returncode}, no JSON results ({exc})", log)
            continue
        ids = [f["frame_id"] for f in frames]
        labels = [f["result"][0]["label"] for f in frames]
        right = sum(got.startswith(want) for got, want in zip(labels, expected))
        ok = (result.returncode == 0 and ids == list(range(len(expected))) and right == len(expected)
              and summary["frames"] == len(expected) and summary["dropped"] == 0 and summary["delegate"] == delegate)
        report.check(f"run {Path(model).suffix[1:]} (selected {summary['delegate']})", ok,
                     f"{len(frames)} results, frame ids {ids[:1]}..{ids[-1:]} consecutive: "
                     f"{ids == list(range(len(ids)))}, {right}/{len(expected)} frames with the photo's reference "
                     f"top-1, summary frames {summary['frames']} dropped {summary['dropped']}", log)
    return clip


def timed_collector(port: int):
    """tests/support/broker.py's Collector, also keeping each message's arrival time on this machine."""
    from support.broker import Collector

    class TimedCollector(Collector):
        def __init__(self, port: int) -> None:
            self.arrivals: list[tuple[float, str, dict]] = []
            super().__init__(port)

        def _on_message(self, client, userdata, message) -> None:
            super()._on_message(client, userdata, message)
            with contextlib.suppress(ValueError):
                self.arrivals.append((time.monotonic(), message.topic, json.loads(message.payload)))

    return TimedCollector(port)


def phase_agent(chroot: Chroot, report: Report, clip: str, seconds: float) -> None:
    from support.broker import Broker

    interval = 1.0
    with tempfile.TemporaryDirectory(prefix="edgeinfer-arm64-broker-") as folder:
        broker = Broker(Path(folder)).start()
        collector = timed_collector(broker.port)
        try:
            if not collector.wait_subscribed(10):
                report.check("agent", False, f"the host's subscriber could not subscribe on port {broker.port}")
                return
            config = chroot.path(f"{WORK}/agent.yaml")
            config.write_text(json.dumps({  # JSON is YAML
                "device_id": "arm64-qemu", "fleet": "arm64", "broker": f"mqtt://127.0.0.1:{broker.port}",
                "data_dir": f"{WORK}/agent-data", "telemetry_interval_s": interval,
                "pipelines": [{"name": "main", "model": MODEL_TFLITE, "source": clip, "labels": LABELS,
                               "loop": True, "max_fps": 2, "version": "1"}]}, indent=1))
            agent, log = chroot.popen("agent", EDGEINFER, "-v", "agent", "--config", f"{WORK}/agent.yaml")
            try:
                first = _wait(lambda: collector.of_kind("telemetry"), 120, agent)
                if not first:
                    report.check("agent", False, f"no telemetry within 120 s (agent exit {agent.poll()})", log)
                    return
                started = time.monotonic()
                time.sleep(seconds)
                window_end = time.monotonic()
            finally:
                if agent.poll() is None:
                    agent.send_signal(signal.SIGTERM)
                try:
                    code = agent.wait(60)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    code = agent.wait(10)
            collector.wait_until(lambda c: any(b.get("online") is False for b in c.of_kind("state")), 10)
        finally:
            collector.close()
            broker.stop()
    telemetry = [(t, body) for t, topic, body in collector.arrivals if topic.endswith("/telemetry")]
    boots = {body["boot_id"] for _t, body in telemetry}
    seqs = [body["seq"] for _t, body in telemetry]
    unique = sorted(set(seqs))
    in_window = [t for t, _b in telemetry if started <= t <= window_end]
    gaps = [b - a for a, b in pairwise(in_window)]
    missing = sorted(set(range(1, max(unique, default=0) + 1)) - set(unique))
    pipelines = [p for _t, body in telemetry for p in body["pipelines"]]
    frames = sum(p["frames"] for p in pipelines)
    labels: dict[str, int] = {}
    for p in pipelines:
        for entry in (p.get("outputs") or {}).get("top") or []:
            labels[entry["label"]] = labels.get(entry["label"], 0) + entry["count"]
    states = collector.of_kind("state")
    want = seconds / interval
    ok_seq = len(boots) == 1 and unique == list(range(1, len(unique) + 1)) and not missing
    report.check("agent telemetry seq", ok_seq,
                 f"{len(telemetry)} windows ({len(seqs) - len(unique)} duplicates), boot_id {sorted(boots)}, seq "
                 f"{unique[:1]}..{unique[-1:]}, gaps {missing or 'none'}", log)
    median = statistics.median(gaps) if gaps else 0.0
    lengths = [body["interval_s"] for _t, body in telemetry]
    length = statistics.median(lengths) if lengths else 0.0
    # An emulated agent on a busy 2-core host ticks late now and then (3.15 s once, at load average 10): the
    # cadence is judged by the medians, a stall by the longest gap, the loss of nothing by the seqs above.
    ok_rate = (len(in_window) >= 0.7 * want and abs(median - interval) <= 0.2 * interval
               and abs(length - interval) <= 0.2 * interval and max(gaps, default=99) <= 5 * interval)
    report.check("agent telemetry interval", ok_rate,
                 f"{len(in_window)} windows arrived in {seconds:.0f} s (interval {interval} s): arrival gaps median "
                 f"{median:.2f} s, min {min(gaps, default=0):.2f} s, max {max(gaps, default=0):.2f} s; the windows' "
                 f"interval_s median {length:.2f} s", log)
    running = [p for p in pipelines if p["status"] == "running"]
    expected = {REFERENCE_TOP1[name][0] for name in CLIP_IMAGES}
    ok_pipe = (frames > 0 and running and all(p.get("delegate") == "xnnpack" for p in running)
               and labels and all(any(label.startswith(e) for e in expected) for label in labels))
    report.check("agent pipeline", bool(ok_pipe),
                 f"{frames} frames in the windows, {len(running)}/{len(pipelines)} windows running on "
                 f"{sorted({p.get('delegate') for p in pipelines}, key=str)}, top-1 counts {labels}", log)
    last = states[-1] if states else {}
    report.check("agent shutdown", code == 0 and last.get("online") is False and last.get("reason") == "shutdown",
                 f"exit {code} after SIGTERM, last state online={last.get('online')} reason={last.get('reason')}, "
                 f"{len(states)} state messages", log)


def _wait(predicate, timeout: float, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value or proc.poll() is not None:
            return value
        time.sleep(0.1)
    return predicate()


def shorten(change: str, root: str) -> str:
    """A [change] line of setup-pi.sh without the parts every such line has."""
    for noise in ("[change] ", f"chroot {root} ", "env DEBIAN_FRONTEND=noninteractive ", "-y --no-install-recommends ",
                  "--disable-pip-version-check "):
        change = change.replace(noise, "")
    return change


def phase_setup_pi(cache: Path, args: argparse.Namespace, wheel: Path, base_id: str, report: Report) -> None:
    scripts = sorted(p for p in (REPO / "firmware_scripts").rglob("*") if p.is_file())
    key = digest(base_id, [(str(p.relative_to(REPO)), p.read_bytes().hex()) for p in scripts],
                 (REPO / "pyproject.toml").read_text())
    layer = Layer(cache, "setup-pi", key)
    fresh = layer.prepare()
    logs = args.logs
    with Chroot(layer, assets=args.assets, cpu=args.cpu, logs=logs, extra_mounts=False) as chroot:
        # an offline image, as an SD card mounted on a PC: no /proc, /sys or /dev of this machine inside it
        package = f"/var/cache/edgeinfer-arm64/{wheel.name}"
        chroot.path(package).parent.mkdir(parents=True, exist_ok=True)
        chroot.path(package).write_bytes(wheel.read_bytes())
        script = str(REPO / "firmware_scripts/setup-pi.sh")
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": "/root", "LANG": "C.UTF-8",
               "EDGEINFER_PYTHON": sys.executable, "QEMU_CPU": args.cpu}  # as after `sudo`: no PIP_* of this shell
        log = logs / "setup-pi.log"

        def setup(*options: str) -> subprocess.CompletedProcess:
            command = [script, "--root", str(chroot.root), "--package", package, *options]
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
            with open(log, "a") as out:
                out.write(f"$ {' '.join(command)}\n[exit {result.returncode}]\n{result.stdout}\n--- stderr\n"
                          f"{result.stderr}\n")
            return result

        refused = setup()
        detected = next((line for line in refused.stdout.splitlines() if line.startswith("[check] device:")), "")
        why = (refused.stderr.strip().splitlines() or [""])[-1]
        report.check("setup-pi.sh without --force", refused.returncode == 1 and "not a Raspberry Pi" in why,
                     f"exit {refused.returncode}, '{detected}', '{why[:140]}'", log)
        options = ("--force", "--no-camera")
        first = setup(*options)
        summary = first.stdout.strip().splitlines()[-1] if first.stdout.strip() else ""
        changes = [line for line in first.stdout.splitlines() if line.startswith("[change]")]
        want = "change(s) made" if fresh else "no changes"
        state = "fresh image" if fresh else "image provisioned by an earlier run"
        report.check(f"setup-pi.sh {' '.join(options)} ({state})",
                     first.returncode == 0 and want in summary,
                     f"exit {first.returncode}, {len(changes)} [change] lines: "
                     + ("; ".join(shorten(c, str(chroot.root)) for c in changes) or "none")
                     + f"; '{summary}'", log)
        second = setup(*options)
        summary2 = second.stdout.strip().splitlines()[-1] if second.stdout.strip() else ""
        report.check("setup-pi.sh again (idempotent)", second.returncode == 0 and summary2 == "[summary] no changes",
                     f"exit {second.returncode}, '{summary2}'", log)
        if first.returncode != 0:
            layer.done(key="failed")  # provision from scratch next time
        elif fresh:
            layer.done(provisioned=time.strftime("%Y-%m-%d %H:%M:%S"))

        packages = ("python3-venv", "python3-pip", "ca-certificates", "curl", "gnupg", "usbutils")
        status = chroot.path("/var/lib/dpkg/status").read_text()
        installed = [p for p in packages if f"Package: {p}\nStatus: install ok installed" in status]
        cfg = chroot.path("/opt/edgeinfer/venv/pyvenv.cfg")
        system_site = cfg.exists() and "include-system-site-packages = true" in cfg.read_text()
        chroot.mount_runtime()  # the checks the script skips with --root, run in the provisioned image
        probe = chroot.run("setup-pi-venv", "/opt/edgeinfer/venv/bin/python", "-c",
                           "import numpy, ai_edge_litert.interpreter, paho.mqtt, importlib.metadata as m; print("
                           "'edgeinfer', m.version('edgeinfer'), 'numpy', numpy.__version__, 'ai-edge-litert', "
                           "m.version('ai-edge-litert'), 'paho-mqtt', m.version('paho-mqtt'))")
        version = chroot.run("setup-pi-venv", "/opt/edgeinfer/venv/bin/edgeinfer", "--version")
        classify = chroot.run("setup-pi-venv", "/opt/edgeinfer/venv/bin/edgeinfer", "classify", MODEL_TFLITE,
                              "/assets/images/parrot.jpg", "--labels", LABELS, "--top-k", "1", "--json")
        try:
            top = json.loads(classify.stdout)[0]["top"][0]
        except (ValueError, IndexError, KeyError):
            top = {"label": f"(exit {classify.returncode})", "score": 0.0}
        chroot.unmount_runtime()
        ok = (len(installed) == len(packages) and system_site and probe.returncode == 0 and version.returncode == 0
              and top["label"] == "macaw")
        report.check("setup-pi.sh result in the image", ok,
                     f"dpkg: {len(installed)}/{len(packages)} of {' '.join(packages)} installed; /opt/edgeinfer/venv "
                     f"include-system-site-packages={system_site}; {probe.stdout.strip() or probe.stderr[-200:]}; "
                     f"'{version.stdout.strip()}'; classify parrot.jpg with it: {top['label']} {top['score']:.3f}",
                     logs / "setup-pi-venv.log")


# ---------------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=REPO / "build/arm64",
                        help="where the image and its layers are kept between runs (default: build/arm64)")
    parser.add_argument("--assets", type=Path,
                        default=Path(os.environ.get("EDGEINFER_ASSETS", REPO.parent / "shared/assets")))
    parser.add_argument("--cpu", default="cortex-a72", choices=["cortex-a72", "cortex-a76"],
                        help="the core qemu emulates: cortex-a72 (Raspberry Pi 4, default) or cortex-a76 (Pi 5)")
    parser.add_argument("--agent-seconds", type=float, default=20.0)
    args = parser.parse_args()
    args.cache, args.assets = args.cache.resolve(), args.assets.resolve()
    if os.geteuid() != 0:
        print("make test-arm64 needs root (debootstrap, chroot, mount); run it as root", file=sys.stderr)
        return 2
    if not (args.assets / "models").is_dir():
        print(f"no shared assets at {args.assets} (set EDGEINFER_ASSETS)", file=sys.stderr)
        return 2
    args.logs = args.cache / "logs"
    report = Report()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount on the way out (finally blocks)
    try:
        args.cache.mkdir(parents=True, exist_ok=True)
        lock = open(args.cache / ".lock", "w")  # noqa: SIM115 - held until the process exits
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SetupError(f"another make test-arm64 is using {args.cache}; wait for it to finish") from None
        unmount_stale(args.cache)
        remove_tree(args.logs)
        args.logs.mkdir()
        print(f"[arm64] cache {args.cache}, emulated CPU {args.cpu}, logs {args.logs}", flush=True)
        with report.phase("image", fatal=True):
            ensure_host_tools(args.logs / "host.log")
            binfmt = ensure_binfmt(args.logs / "host.log")
            built, seconds = build_base(args.cache, args.cpu, args.logs / "debootstrap.log")
            base = read_stamp(args.cache / "base.json")
            report.check("image", True, f"Debian {base['suite']} arm64 ({'built now' if built else 'cached'}, "
                         f"built {base['built']} in {seconds:.0f} s), qemu via binfmt_misc {binfmt}")
        wheel = build_wheel(args.cache, args.logs / "wheel.log")
        base_id = digest(base)  # a layer belongs to one build of base/ (its upper copies files of that build)
        layer = Layer(args.cache, "test", digest(base_id, requirements()))
        fresh = layer.prepare()
        with Chroot(layer, assets=args.assets, cpu=args.cpu, logs=args.logs) as chroot:
            remove_tree(chroot.path(WORK))
            with report.phase(f"install edgeinfer ({'new venv' if fresh else 'cached venv'})"):
                install(chroot, layer, wheel, fresh, report)
            with report.phase("1 doctor, device"):
                phase_doctor_device(chroot, report)
            with report.phase("2 classify"):
                phase_classify(chroot, report)
            clip = f"{WORK}/clip.avi"
            with report.phase("3 pipeline"):
                clip = phase_pipeline(chroot, report)
            with report.phase("4 agent"):
                phase_agent(chroot, report, clip, args.agent_seconds)
        with report.phase("5 setup-pi.sh"):
            phase_setup_pi(args.cache, args, wheel, base_id, report)
    except SetupError as exc:
        print(f"\nFAIL  setup: {exc}", file=sys.stderr, flush=True)
        report.summary()
        return 2
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
