"""`edgeinfer device` and `edgeinfer doctor` as a user runs them: real subprocesses on fake roots."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.assets import MODELS
from support.processes import edgeinfer_cmd
from support.profiles import FakeRoot, fake_root, write_profile

ONNX = MODELS / "mobilenet_v2_1.0_224_quant.onnx"
EDGETPU = MODELS / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"
LIBDIR = "/usr/lib/aarch64-linux-gnu"
USER_UID = 4242  # a uid no test runner has, so the fake user never owns the fake nodes
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if k not in ("EDGEINFER_DELEGATE", "EDGEINFER_PROFILE", "EDGEINFER_PROFILE_DIRS", "EDGEINFER_STRICT")}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(edgeinfer_cmd(*args), capture_output=True, text=True, timeout=120, env=env or CLEAN_ENV)


def device_json(*args: str) -> dict:
    result = run("device", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def doctor_json(root, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    result = run("doctor", "--root", str(root), *args, "--json", env=env)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def findings(report: dict) -> dict[str, dict]:
    return {f["check"]: f for f in report["findings"]}


# ---------------------------------------------------------------------------------- device

def test_device_json_pi4_coral_with_libedgetpu_selects_coral(tmp_path):
    root = fake_root(tmp_path, "raspberry-pi-4-coral-usb").library("libedgetpu.so.1.0", LIBDIR)
    data = device_json("--root", str(root))
    assert data["profile"] == "raspberry-pi-4-coral-usb" and data["selected"] == "coral"
    assert isinstance(data["delegates"], list) and data["delegates"][0]["name"] == "coral"
    for entry in data["delegates"]:
        assert isinstance(entry["name"], str) and isinstance(entry["available"], bool)
        assert isinstance(entry["reason"], str) and entry["reason"]
    assert {"xnnpack", "onnxruntime", "openvino", "tensorrt", "onnxruntime-gpu"} <= {d["name"] for d in
                                                                                      data["delegates"]}


def test_device_pi4_coral_without_libedgetpu_selects_xnnpack(tmp_path):
    root = fake_root(tmp_path, "raspberry-pi-4-coral-usb")
    data = device_json("--root", str(root), "--model", str(EDGETPU))
    coral = data["delegates"][0]
    assert coral["name"] == "coral" and coral["available"] is False and "libedgetpu" in coral["reason"]
    assert data["selected"] == "xnnpack" and data["selected_model"].endswith("mobilenet_v1_0.25_128_quant.tflite")
    assert "libedgetpu" in data["fallback_reason"]
    text = run("device", "--root", str(root)).stdout
    selected_line = next(line for line in text.splitlines() if "<- selected" in line)
    assert "xnnpack" in selected_line and "yes" in selected_line
    assert text.splitlines()[0].startswith("profile   raspberry-pi-4-coral-usb")


def test_device_jetson_orin_lists_tensorrt_first(tmp_path):
    data = device_json("--root", str(fake_root(tmp_path, "jetson-orin-nx")), "--model", str(ONNX))
    assert data["profile"] == "jetson-orin-nx"
    assert [d["name"] for d in data["delegates"][:3]] == ["tensorrt", "onnxruntime-gpu", "onnxruntime"]
    assert data["delegates"][0]["available"] is False
    assert data["selected"] == "onnxruntime" and data["threads"] is None  # the profile leaves it to the thread plan
    assert data["runtime_threads"]["source"] in ("usable cores", "thread plan")


def test_device_ncs2_selects_openvino(tmp_path):
    data = device_json("--root", str(fake_root(tmp_path, "x86-64-ncs2")), "--model", str(ONNX))
    assert data["profile"] == "x86-64-ncs2" and data["selected"] == "openvino"
    assert data["selected_device"] == "CPU" and "MYRIAD" in data["fallback_reason"]


def test_device_bad_user_profile_is_one_line_naming_file_and_key(tmp_path):
    profiles = tmp_path / "profiles"
    path = write_profile(profiles, "lab.yaml", "name: lab\nmatch: {usb: ['1a6e']}\ndelegates: [xnnpack]\n")
    root = fake_root(tmp_path / "root", "generic-x86-64")
    result = run("device", "--root", str(root), "--profile-dir", str(profiles))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"edgeinfer: error: {path}: match.usb[0]: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_device_unknown_delegate_is_a_usage_error(tmp_path):
    result = run("device", "--root", str(fake_root(tmp_path, "generic-x86-64")), "--delegate", "hailo")
    assert result.returncode == 2 and "unknown delegate 'hailo'" in result.stderr


# ---------------------------------------------------------------------------------- doctor

def test_doctor_coral_usb_without_library_rule_or_permission(tmp_path):
    root = fake_root(tmp_path, "raspberry-pi-4-coral-usb").user("pi", USER_UID, {"plugdev": 46})
    code, report = doctor_json(root, "--user", "pi")
    assert code == 1 and report["profile"] == "raspberry-pi-4-coral-usb" and report["user"] == "pi"
    found = findings(report)
    assert found["libedgetpu"]["status"] == "problem" and "setup-pi.sh" in found["libedgetpu"]["fix"]
    assert found["edgetpu-udev"]["status"] == "problem" and "plugdev" in found["edgetpu-udev"]["fix"]
    permission = found["edgetpu-permission"]
    assert permission["status"] == "problem" and "/dev/bus/usb/001/002" in permission["detail"]
    assert "usermod -aG plugdev pi" in permission["fix"]
    assert found["camera"]["status"] == "warning" and "rpicam-hello" in found["camera"]["fix"]
    text = run("doctor", "--root", str(root), "--user", "pi").stdout
    assert "PROBLEM libedgetpu:" in text and "fix: run firmware_scripts/setup-pi.sh" in text
    assert text.rstrip().endswith("problems found")


def test_doctor_healthy_coral_usb_pi(tmp_path):
    group = os.getgid()  # the fake nodes belong to this group, so the fake user's membership is real
    root = (FakeRoot(tmp_path).cpu("aarch64").model("Raspberry Pi 4 Model B Rev 1.5")
            .usb("18d1:9302", node_mode=0o660).library("libedgetpu.so.1.0", LIBDIR)
            .udev_rule("99-edgetpu-accelerator.rules",
                       'SUBSYSTEMS=="usb", ATTRS{idVendor}=="18d1", ATTRS{idProduct}=="9302", MODE="0664", '
                       'GROUP="plugdev"\n')
            .node("/dev/video0", mode=0o660)
            .user("pi", USER_UID, {"plugdev": group}))
    code, report = doctor_json(root, "--user", "pi")
    found = findings(report)
    assert code == 0 and report["problems"] == 0, report
    assert found["libedgetpu"]["status"] == "ok" and found["edgetpu-permission"]["status"] == "ok"
    assert found["camera"]["status"] == "ok"


def test_doctor_pcie_coral_without_gasket_driver(tmp_path):
    root = fake_root(tmp_path, "raspberry-pi-5").pci("1ac1:089a").library("libedgetpu.so.1.0", LIBDIR)
    code, report = doctor_json(root, "--user", "root")
    gasket = findings(report)["gasket-driver"]
    assert code == 1 and report["profile"] == "raspberry-pi-5-coral-pcie"
    assert gasket["status"] == "problem" and "/dev/apex_0 is missing" in gasket["detail"]
    assert "gasket-dkms" in gasket["fix"] and "pcie-32bit-dma" in gasket["fix"]


@pytest.mark.parametrize(("release", "revision", "library", "expected"), [
    (32, "7.1", "libnvinfer.so.8.2.1", "runs R35 (JetPack 5), R36 (JetPack 6); this root has L4T R32.7.1"),
    (36, "4.0", "libnvinfer.so.8.5.2", "ships TensorRT 10.3, but /usr/lib/aarch64-linux-gnu/libnvinfer.so.8.5.2"),
])
def test_doctor_jetpack_mismatch(release, revision, library, expected, tmp_path):
    root = (FakeRoot(tmp_path).cpu("aarch64").model("NVIDIA Jetson AGX Orin Developer Kit")
            .tegra(release, revision).node("/dev/nvhost-ctrl-gpu").library(library))
    # forced: on R32 detection would (rightly) not call this an AGX Orin profile
    code, report = doctor_json(root, env={**CLEAN_ENV, "EDGEINFER_PROFILE": "jetson-agx-orin"})
    jetpack = [f for f in report["findings"] if f["check"] == "jetpack"]
    assert code == 1 and jetpack and expected in jetpack[0]["detail"], report
    assert "setup-jetson.sh" in jetpack[0]["fix"] or "SDK Manager" in jetpack[0]["fix"]
    assert findings(report)["tensorrt-python"]["status"] == "problem"  # no TensorRT Python module here


def test_doctor_jetson_without_tensorrt_libraries(tmp_path):
    root = FakeRoot(tmp_path).cpu("aarch64").model("NVIDIA Jetson Orin Nano Developer Kit").tegra(36, "4.0")
    code, report = doctor_json(root)
    libs = findings(report)["tensorrt-libraries"]
    assert code == 1 and libs["status"] == "problem" and "libnvinfer" in libs["detail"]
    assert "setup-jetson.sh" in libs["fix"]


def test_doctor_numpy2_with_an_old_tflite_runtime(tmp_path):
    site = tmp_path / "site" / "tflite_runtime-2.14.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: tflite-runtime\nVersion: 2.14.0\n")
    env = {**CLEAN_ENV, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(site.parent)) if p)}
    code, report = doctor_json(fake_root(tmp_path / "root", "raspberry-pi-4"), env=env)
    problem = findings(report)["numpy-tflite-runtime"]
    import numpy

    assert numpy.__version__.startswith("2")  # the real numpy of this environment
    assert code == 1 and problem["status"] == "problem" and "tflite-runtime 2.14.0" in problem["detail"]
    assert "numpy<2" in problem["fix"]


def test_doctor_intel_accelerators(tmp_path):
    code, report = doctor_json(fake_root(tmp_path / "ncs2", "x86-64-ncs2"))
    found = findings(report)
    assert code == 1 and found["openvino-myriad"]["status"] == "problem"
    assert "2022.3" in found["openvino-myriad"]["fix"] and found["ncs2-udev"]["status"] == "problem"
    root = FakeRoot(tmp_path / "ultra").cpu("x86_64", "Intel(R) Core(TM) Ultra 7 165H")
    code, report = doctor_json(root)
    npu = findings(report)["npu-driver"]
    assert code == 1 and "setup-intel.sh" in npu["fix"] and "/dev/accel/accel0" in npu["detail"]


def test_doctor_this_machine_runs_and_reports_a_profile():
    result = run("doctor", "--json")
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["root"] == "/" and report["profile"] is not None
    assert Path(report["root"]).is_dir() and report["findings"][0]["check"] == "profile"
