"""The provisioning scripts in firmware_scripts/ (setup-*.sh, lib.sh), run as real bash subprocesses on fake roots.

No Pi, Coral, Jetson, NCS2 or NPU is attached to this machine: each device family is a small fake
root (tests/support/firmware.py). The tests check what each script plans (--dry-run), that a dry
run changes nothing, that real runs are idempotent where they can run here (install-agent.sh, and
the setup scripts' file-writing steps once packages and venv are in place), shellcheck, and the
systemd unit with systemd-analyze.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.firmware import (
    KINDS,
    REPO,
    SCRIPT_NAMES,
    SCRIPTS,
    add_packages,
    build_root,
    device_line,
    dry,
    make_venv,
    planned,
    run_script,
    runs,
    script_env,
    tree_digest,
    written,
)

UNIT = "/etc/systemd/system/edgeinfer-agent.service"



# ------------------------------------------------------------------------------------ static checks

LIB_PARTS = sorted(f"lib/{path.name}" for path in (SCRIPTS / "lib").glob("*.sh"))


# shellcheck -x follows lib.sh into lib/ but reports only on the file it checks: each part is checked too.
@pytest.mark.parametrize("name", [*SCRIPT_NAMES, "lib.sh", *LIB_PARTS])
def test_shellcheck_clean(name):
    assert shutil.which("shellcheck"), "shellcheck is not installed: make system-deps (apt-get install shellcheck)"
    # From another directory: the .shellcheckrc beside the scripts must be enough to follow lib.sh.
    result = subprocess.run(["shellcheck", "-x", str(SCRIPTS / name)], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stdout + result.stderr


def test_lib_sources_every_part_from_its_own_directory():
    sourced = re.findall(r'^\. "\$EI_LIB_DIR/(\S+\.sh)"$', (SCRIPTS / "lib.sh").read_text(), re.MULTILINE)
    assert sorted(f"lib/{name}" for name in sourced) == LIB_PARTS
    # Sourced by a relative path from the repository, used after a cd elsewhere: lib/ and the
    # checkout are still found from lib.sh's own location.
    probe = '. firmware_scripts/lib.sh && cd / && printf "%s\\n" "$EI_LIB_DIR" "$(ei_default_package)"'
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=REPO, env=script_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(SCRIPTS.resolve() / "lib"), str(REPO.resolve())]


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_scripts_are_strict_and_executable(name):
    text = (SCRIPTS / name).read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -Eeuo pipefail" in text
    assert os.access(SCRIPTS / name, os.X_OK)


OWN_FLAGS = {
    "setup-pi.sh": ["--coral", "--max-clock", "--venv", "--no-camera"],
    "setup-jetson.sh": ["--power-mode", "--max-clocks", "--trt-link", "--python"],
    "setup-intel.sh": ["--device", "--openvino-archive", "--openvino-sha256", "--npu-driver-debs"],
    "install-agent.sh": ["--venv", "--config", "--watchdog", "--no-systemctl", "--groups"],
}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_help(name):
    result = run_script(name, "--help")
    assert result.returncode == 0, result.stderr
    for flag in ["--dry-run", "--root", "--detect", "--help", *OWN_FLAGS[name]]:
        assert flag in result.stdout, f"{name} --help does not mention {flag}"
    assert result.stderr == ""


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_bad_usage_exits_2(name, tmp_path):
    result = run_script(name, "--no-such-flag")
    assert result.returncode == 2
    assert "unknown option: --no-such-flag" in result.stderr
    result = run_script(name, "--root", tmp_path / "missing")
    assert result.returncode == 2
    assert "no such directory" in result.stderr


# -------------------------------------------------------------------------------------- detection

@pytest.mark.parametrize("kind", list(KINDS))
def test_install_agent_detects_each_family(kind, tmp_path):
    root = build_root(tmp_path, kind)
    out = dry("install-agent.sh", root, "--detect", "script").stdout
    assert device_line(out).startswith(f"[check] device: {KINDS[kind]} ("), device_line(out)


def test_auto_detection_falls_back_to_the_scripts_own_and_says_why(tmp_path):
    root = build_root(tmp_path, "pi4")
    # An interpreter that cannot import edgeinfer, and none on PATH: the profiles are unavailable.
    env = script_env(EDGEINFER_PYTHON="/bin/false", PATH="/usr/sbin:/usr/bin:/sbin:/bin", PYTHONPATH="/nonexistent")
    result = run_script("install-agent.sh", "--dry-run", "--root", root, env=env)
    assert result.returncode == 0, result.stderr
    assert "detected by script" in device_line(result.stdout)
    assert "device profiles unavailable" in result.stderr
    result = run_script("install-agent.sh", "--dry-run", "--root", root, "--detect", "profiles", env=env)
    assert result.returncode == 1
    assert "--detect profiles" in result.stderr


STAND_IN = '''\
import json, sys
args = sys.argv[1:]
assert args[:2] == ["device", "--json"], args
root = args[args.index("--root") + 1]
print(json.dumps({"profile": open(root + "/profile-name").read().strip(), "score": 12,
                  "evidence": ["stand-in"], "ranking": [], "host": {"root": root}}))
'''


@pytest.mark.parametrize(("profile", "family"), [
    ("raspberry-pi-5-coral-usb", "pi"), ("jetson-orin-nano", "jetson"), ("x86-64-ncs2", "intel-ncs2"),
    ("intel-core-ultra-npu", "intel-npu"), ("generic-x86-64", "x86-64"), ("generic-aarch64", "unknown"),
])
def test_profiles_answer_wins_when_edgeinfer_has_a_device_command(profile, family, tmp_path):
    # Contract test with a stand-in for `edgeinfer device --json`: the scripts call
    # `python -m edgeinfer device --json --root DIR` and map the profile names shipped in
    # device_profiles/ to their families. The root is an x86-64 host, so for
    # every family but x86-64 the profile must override the script's own detection.
    package = tmp_path / "standin" / "edgeinfer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(STAND_IN)
    root = build_root(tmp_path, "x86-64")
    (root / "profile-name").write_text(profile)
    env = script_env(PYTHONPATH=str(tmp_path / "standin"))
    result = run_script("install-agent.sh", "--dry-run", "--root", root, "--detect", "profiles", env=env)
    assert result.returncode == 0, result.stderr
    assert device_line(result.stdout).startswith(f"[check] device: {family} (")
    assert f"profile {profile}; detected by profiles" in device_line(result.stdout)
    if family != "x86-64":
        assert "using the profile" in result.stderr


PROFILE_FAMILY = SCRIPTS / "lib/profile_family.py"


@pytest.mark.parametrize(("answer", "expect"), [
    ({"profile": "raspberry-pi-5-coral-usb", "score": 12}, (0, "pi\traspberry-pi-5-coral-usb\n")),
    ({"profile": "jetson-orin-nano"}, (0, "jetson\tjetson-orin-nano\n")),
    ({"profile": "x86-64-ncs2"}, (0, "intel-ncs2\tx86-64-ncs2\n")),
    ({"profile": "intel-core-ultra-npu"}, (0, "intel-npu\tintel-core-ultra-npu\n")),
    ({"profile": "generic-x86-64"}, (0, "x86-64\tgeneric-x86-64\n")),
    ({"profile": "generic-aarch64"}, (0, "unknown\tgeneric-aarch64\n")),
    # The setup script decides over the name's words; install-agent.sh names no family.
    ({"profile": {"name": "generic-x86-64", "setup_script": "setup-pi.sh"}}, (0, "pi\tgeneric-x86-64\n")),
    ({"profile": {"name": "raspberry-pi-4", "setup_script": "install-agent.sh"}}, (0, "unknown\traspberry-pi-4\n")),
    ({"profile": {"id": "board-7"}, "details": [{"family": "Jetson"}]}, (0, "jetson\tboard-7\n")),
    ([{"profile": "pi5"}], (0, "pi\tpi5\n")),
    ({"profile": None, "ranking": []}, (3, "")),
    ([], (3, "")),
    ("jetson-orin-nano", (1, "")),
    ([5], (1, "")),
])
def test_profile_family_program_alone(answer, expect):
    # It runs on whatever interpreter imports edgeinfer, maybe a device's older python3: standard
    # library only (-S: no site-packages) and Python 3.8 syntax.
    ast.parse(PROFILE_FAMILY.read_text(), feature_version=(3, 8))
    result = subprocess.run([sys.executable, "-I", "-S", str(PROFILE_FAMILY)], input=json.dumps(answer),
                            capture_output=True, text=True, cwd="/")
    assert (result.returncode, result.stdout) == expect, result.stderr


@pytest.mark.parametrize("kind", list(KINDS))
def test_runtime_profiles_agree_with_the_scripts_detection(kind, tmp_path):
    root = build_root(tmp_path, kind)
    by_profiles = dry("install-agent.sh", root, "--detect", "profiles")
    by_script = dry("install-agent.sh", root, "--detect", "script")
    assert "detected by profiles" in device_line(by_profiles.stdout)
    family = device_line(by_profiles.stdout).split()[2]
    assert family == device_line(by_script.stdout).split()[2] == KINDS[kind]


# ------------------------------------------------------------------------------------ setup-pi.sh

def test_pi_with_coral_plans_repo_libedgetpu_std_udev_rule_and_coral_venv(tmp_path):
    root = build_root(tmp_path, "pi5-coral-usb")
    out = dry("setup-pi.sh", root).stdout
    assert device_line(out).startswith("[check] device: pi (Raspberry Pi 5 Model B Rev 1.0")
    assert "[check] coral: usb=found pcie=none -> install" in out
    assert written(out, "/etc/apt/sources.list.d/coral-edgetpu.list") == (
        "deb [signed-by=/etc/apt/keyrings/coral-edgetpu.gpg] https://packages.cloud.google.com/apt "
        "coral-edgetpu-stable main\n")
    assert "fetch: https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor > " \
           "/etc/apt/keyrings/coral-edgetpu.gpg (mode 0644)" in planned(out)
    commands = runs(out)
    install_edgetpu = commands.index(
        "env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libedgetpu1-std")
    # The repository is new: apt-get update runs again between adding it and installing from it.
    assert commands[install_edgetpu - 1] == "apt-get update"
    assert not any("libedgetpu1-max" in c for c in commands)
    rules = written(out, "/etc/udev/rules.d/71-edgeinfer-coral.rules")
    assert 'ATTRS{idVendor}=="1a6e", ATTRS{idProduct}=="089a", MODE="0664", GROUP="plugdev"' in rules
    assert 'ATTRS{idVendor}=="18d1", ATTRS{idProduct}=="9302", MODE="0664", GROUP="plugdev"' in rules
    assert "[ok] group plugdev exists" in out
    assert "/usr/bin/python3 -m venv --system-site-packages /opt/edgeinfer/venv" in commands
    assert ("/opt/edgeinfer/venv/bin/python -m pip install --disable-pip-version-check "
            "'edgeinfer[coral,fleet]' 'numpy<2'") in commands
    assert "[check] system python: 3.11" in out
    assert "[skip] run: udevadm control --reload-rules" in out


def test_pi_max_clock_preseeds_debconf_and_installs_max(tmp_path):
    root = build_root(tmp_path, "pi4-coral")
    result = dry("setup-pi.sh", root, "--max-clock")
    commands = runs(result.stdout)
    assert "env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libedgetpu1-max" in commands
    assert "debconf-set-selections /var/cache/edgeinfer/libedgetpu1-max.debconf" in commands
    assert "libedgetpu1-max libedgetpu/accepted-eula boolean true" in written(
        result.stdout, "/var/cache/edgeinfer/libedgetpu1-max.debconf")
    assert "hot" in result.stderr


def test_pi_rerun_keeps_max_clock_chosen_before(tmp_path):
    root = build_root(tmp_path, "pi4-coral", packages=("libedgetpu1-max",))
    out = dry("setup-pi.sh", root).stdout
    assert "[ok] packages already installed: libedgetpu1-max" in out
    assert not any("libedgetpu1-std" in c for c in runs(out))
    # Asked for explicitly, the standard clock replaces it.
    out = dry("setup-pi.sh", root, "--std-clock").stdout
    assert any(c.endswith("apt-get install -y --no-install-recommends libedgetpu1-std") for c in runs(out))


def test_pi_without_coral_plans_litert_and_no_coral_repo(tmp_path):
    root = build_root(tmp_path, "pi4")
    out = dry("setup-pi.sh", root).stdout
    assert "[check] coral: usb=none pcie=none -> skip" in out
    others = [line for line in planned(out) if not line.startswith("run: ")]
    assert not any("coral" in line or "edgetpu" in line for line in runs(out) + others)
    assert ("/opt/edgeinfer/venv/bin/python -m pip install --disable-pip-version-check "
            "'edgeinfer[tflite,fleet]'") in runs(out)
    # --coral yes prepares an image before the Accelerator is plugged in.
    out = dry("setup-pi.sh", root, "--coral", "yes").stdout
    assert any(c.endswith("libedgetpu1-std") for c in runs(out))


def test_pi_skips_installed_packages(tmp_path):
    root = build_root(tmp_path, "pi5", packages=("python3-picamera2", "v4l-utils"))
    out = dry("setup-pi.sh", root).stdout
    assert "[ok] packages already installed: python3-venv ca-certificates curl python3-picamera2 v4l-utils" in out
    install = next(c for c in runs(out) if "apt-get install" in c)
    assert install.split("--no-install-recommends ")[1].split() == [
        "python3-pip", "gnupg", "usbutils", "python3-libcamera", "rpicam-apps-lite"]
    out = dry("setup-pi.sh", root, "--no-camera").stdout
    assert "rpicam" not in out


def test_pi_fixes_a_numpy2_tflite_runtime_pairing(tmp_path):
    root = build_root(tmp_path, "pi5-coral-usb")
    make_venv(root, "/opt/edgeinfer/venv", "3.11", system_site=True,
              dists={"edgeinfer": "0.1.0", "numpy": "2.1.3", "tflite_runtime": "2.14.0", "paho_mqtt": "2.1.0"})
    out = dry("setup-pi.sh", root).stdout
    assert ("[check] numpy/tflite_runtime pairing: numpy 2.1.3 with tflite_runtime 2.14.0: broken "
            "(tflite_runtime needs numpy<2)") in out
    assert "/opt/edgeinfer/venv/bin/python -m pip install --disable-pip-version-check 'numpy<2'" in runs(out)
    assert "[ok] venv /opt/edgeinfer/venv exists" in out
    assert not any("-m venv" in c for c in runs(out))


def test_pi_turns_on_system_site_packages_in_an_existing_venv(tmp_path):
    root = build_root(tmp_path, "pi4")
    make_venv(root, "/opt/edgeinfer/venv", "3.11", system_site=False,
              dists={"edgeinfer": "0.1.0", "ai_edge_litert": "1.2.0", "paho_mqtt": "2.1.0", "numpy": "2.1.3"})
    out = dry("setup-pi.sh", root).stdout
    assert "include-system-site-packages = true" in written(out, "/opt/edgeinfer/venv/pyvenv.cfg")
    assert "[ok] venv /opt/edgeinfer/venv has edgeinfer ai_edge_litert paho_mqtt" in out


def test_pi_pcie_coral_warns_about_the_gasket_driver(tmp_path):
    root = build_root(tmp_path, "pi5-coral-pcie")
    result = dry("setup-pi.sh", root)
    assert "[check] coral: usb=none pcie=found -> install" in result.stdout
    assert "gasket" in result.stderr
    assert 'SUBSYSTEM=="apex", MODE="0660", GROUP="plugdev"' in written(
        result.stdout, "/etc/udev/rules.d/71-edgeinfer-coral.rules")


def test_pi_script_refuses_other_devices_and_releases(tmp_path):
    result = dry("setup-pi.sh", build_root(tmp_path, "jetson-jp6"), expect=1)
    assert "this is not a Raspberry Pi (detected: jetson" in result.stderr
    root = build_root(tmp_path, "pi4")
    (root / "etc/os-release").write_text("VERSION_CODENAME=bullseye\nID=debian\n")
    result = dry("setup-pi.sh", root, expect=1)
    assert "targets Raspberry Pi OS Bookworm, found 'bullseye'" in result.stderr
    dry("setup-pi.sh", root, "--force")


# -------------------------------------------------------------------------------- setup-jetson.sh

def test_jetson_jp6_exposes_system_tensorrt_with_a_pth(tmp_path):
    root = build_root(tmp_path, "jetson-jp6")
    out = dry("setup-jetson.sh", root).stdout
    assert device_line(out).startswith("[check] device: jetson (NVIDIA Jetson Orin Nano Developer Kit")
    assert "[check] L4T R36.3.0 -> JetPack 6 (Ubuntu 22.04.4 LTS)" in out
    pth = "/opt/edgeinfer/venv/lib/python3.10/site-packages/edgeinfer-system-tensorrt.pth"
    assert written(out, pth) == "/usr/lib/python3.10/dist-packages\n"
    commands = runs(out)
    assert "/usr/bin/python3.10 -m venv /opt/edgeinfer/venv" in commands
    assert ("/opt/edgeinfer/venv/bin/python -m pip install --disable-pip-version-check "
            "'edgeinfer[onnx,fleet]' 'numpy<2'") in commands
    # TensorRT never comes from PyPI on a Jetson.
    assert not any("tensorrt" in c for c in commands)
    assert "[ok] packages already installed: gstreamer1.0-tools python3-venv python3-libnvinfer" in out
    assert "[check] nvarguscamerasrc plugin: /usr/lib/aarch64-linux-gnu/gstreamer-1.0/libgstnvarguscamerasrc.so" in out


def test_jetson_jp6_system_site_packages_instead_of_pth(tmp_path):
    root = build_root(tmp_path, "jetson-jp6")
    out = dry("setup-jetson.sh", root, "--trt-link", "system-site-packages").stdout
    assert "/usr/bin/python3.10 -m venv --system-site-packages /opt/edgeinfer/venv" in runs(out)
    assert not any(".pth" in line for line in planned(out))


def test_jetson_power_mode_and_max_clocks(tmp_path):
    root = build_root(tmp_path, "jetson-jp6")
    out = dry("setup-jetson.sh", root, "--power-mode", "2", "--max-clocks").stdout
    assert "[check] power mode 2 = MAXN_SUPER" in out
    assert "[skip] run: nvpmodel -m 2 (acts on the running system's hardware; not run with --root)" in out
    unit = written(out, "/etc/systemd/system/edgeinfer-jetson-clocks.service")
    assert "ExecStart=/usr/bin/jetson_clocks" in unit and "After=nvpmodel.service" in unit
    assert f"run: systemctl --root={root} enable edgeinfer-jetson-clocks.service" in planned(out)
    assert "[skip] run: jetson_clocks" in out
    result = dry("setup-jetson.sh", root, "--power-mode", "7", expect=1)
    assert "--power-mode 7 is not defined in /etc/nvpmodel.conf (modes: 0=15W 1=7W 2=MAXN_SUPER)" in result.stderr


def test_jetson_jp5_needs_a_newer_python_and_cannot_expose_tensorrt(tmp_path):
    root = build_root(tmp_path, "jetson-jp5")
    result = dry("setup-jetson.sh", root, expect=1)
    assert "[check] L4T R35.4.1 -> JetPack 5" in result.stdout
    assert "JetPack 5's Python is 3.8 but edgeinfer needs >= 3.10" in result.stderr
    root = build_root(tmp_path / "b", "jetson-jp5", extra_pythons=("3.10",))
    result = dry("setup-jetson.sh", root)
    commands = runs(result.stdout)
    assert "/usr/bin/python3.10 -m venv /opt/edgeinfer/venv" in commands
    assert any(c.endswith("python3-pip v4l-utils python3.10-venv") for c in commands)
    assert not any(".pth" in line for line in planned(result.stdout))
    assert "built for Python 3.8" in result.stderr


def test_jetson_script_rejects_jetpack4_and_non_jetsons(tmp_path):
    root = build_root(tmp_path, "jetson-jp6")
    (root / "etc/nv_tegra_release").write_text("# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref\n")
    result = dry("setup-jetson.sh", root, expect=1)
    assert "JetPack 4" in result.stderr
    result = dry("setup-jetson.sh", build_root(tmp_path, "pi5"), expect=1)
    assert "this is not a Jetson" in result.stderr


# --------------------------------------------------------------------------------- setup-intel.sh

def test_intel_ncs2_plans_openvino_2022_3_archive_and_myriad_rules(tmp_path):
    root = build_root(tmp_path, "intel-ncs2")
    result = dry("setup-intel.sh", root)
    out = result.stdout
    assert "[check] preparing for: ncs2" in out
    rules = written(out, "/etc/udev/rules.d/97-myriad-usbboot.rules")
    assert ('SUBSYSTEM=="usb", ATTRS{idProduct}=="2485", ATTRS{idVendor}=="03e7", GROUP="users", MODE="0666", '
            'ENV{ID_MM_DEVICE_IGNORE}="1"') in rules
    assert len(rules.splitlines()) == 3
    fetch = planned(out, "fetch")
    assert len(fetch) == 1 and "2022.3.2" in fetch[0] and fetch[0].endswith("_x86_64.tgz")
    assert planned(out, "extract")[0].endswith("-> /opt/intel/openvino_2022.3.2")
    assert written(out, "/opt/edgeinfer/venv/lib/python3.10/site-packages/edgeinfer-openvino-2022.3.2.pth") == \
        "/opt/intel/openvino_2022.3.2/python/python3.10\n"
    assert written(out, "/etc/ld.so.conf.d/edgeinfer-openvino-2022.3.2.conf").startswith(
        "/opt/intel/openvino_2022.3.2/runtime/lib/intel64\n")
    commands = runs(out)
    # Not the [openvino] extra: PyPI's openvino has no MYRIAD plugin and would shadow the archive's.
    assert ("/opt/edgeinfer/venv/bin/python -m pip install --disable-pip-version-check "
            "'edgeinfer[fleet]' 'numpy>=1.23,<1.25'") in commands
    assert "no --openvino-sha256" in result.stderr


def test_intel_ncs2_needs_python_3_10(tmp_path):
    result = dry("setup-intel.sh", build_root(tmp_path, "x86-64"), "--device", "ncs2", expect=1)
    assert "needs Python 3.10" in result.stderr


def test_intel_npu_plans_openvino_2024_render_rule_and_asks_for_the_driver(tmp_path):
    root = build_root(tmp_path, "intel-npu")
    result = dry("setup-intel.sh", root, expect=3)
    out = result.stdout
    assert "[check] preparing for: npu" in out
    assert "[check] device node /dev/accel/accel0: present" in out
    assert written(out, "/etc/udev/rules.d/10-intel-vpu.rules") == \
        'SUBSYSTEM=="accel", KERNEL=="accel*", GROUP="render", MODE="0660"\n'
    assert "[ok] group render exists" in out
    assert ("/opt/edgeinfer/venv/bin/python -m pip install --disable-pip-version-check "
            "'edgeinfer[openvino,fleet]'") in runs(out)
    assert "action needed: the Intel NPU driver is not installed" in result.stderr
    assert "github.com/intel/linux-npu-driver/releases" in result.stderr

    debs = root / "srv/npu"
    debs.mkdir(parents=True)
    for name in ("intel-driver-compiler-npu_1.10.0_ubuntu24.04_amd64.deb", "intel-fw-npu_1.10.0_ubuntu24.04_amd64.deb",
                 "intel-level-zero-npu_1.10.0_ubuntu24.04_amd64.deb", "level-zero_1.17.6+u24.04_amd64.deb"):
        (debs / name).write_bytes(b"!<arch>\n")
    out = dry("setup-intel.sh", root, "--npu-driver-debs", "/srv/npu").stdout
    dpkg = next(c for c in runs(out) if c.startswith("dpkg -i "))
    assert dpkg.split()[2:] == sorted(f"/srv/npu/{p.name}" for p in debs.iterdir())

    add_packages(root, "intel-driver-compiler-npu", "intel-fw-npu", "intel-level-zero-npu", "level-zero")
    out = dry("setup-intel.sh", root).stdout
    assert "[ok] NPU driver packages installed" in out


def test_intel_device_choice(tmp_path):
    result = dry("setup-intel.sh", build_root(tmp_path, "x86-64"), expect=1)
    assert "no NCS2 (USB 03e7:2485) or NPU" in result.stderr
    both = build_root(tmp_path, "intel-npu", usb={"1-3": "03e7:2485"})
    result = dry("setup-intel.sh", both, expect=1)
    assert "both an NCS2 and an NPU are present" in result.stderr
    result = dry("setup-intel.sh", build_root(tmp_path, "pi5"), expect=1)
    assert "for x86-64 hosts; found architecture 'arm64'" in result.stderr


# -------------------------------------------------------------------------------- dry runs change nothing

DRY_CASES = [
    ("setup-pi.sh", "pi5-coral-usb", ["--max-clock"]),
    ("setup-pi.sh", "pi4", []),
    ("setup-jetson.sh", "jetson-jp6", ["--power-mode", "0", "--max-clocks"]),
    ("setup-intel.sh", "intel-ncs2", []),
    ("setup-intel.sh", "intel-npu", []),
    ("install-agent.sh", "pi5-coral-usb", []),
    ("install-agent.sh", "jetson-jp6", ["--watchdog", "0"]),
    ("install-agent.sh", "x86-64", []),
]


@pytest.mark.parametrize(("script", "kind", "args"), DRY_CASES, ids=[f"{s}-{k}" for s, k, _ in DRY_CASES])
def test_dry_run_changes_nothing(script, kind, args, tmp_path):
    root = build_root(tmp_path, kind)
    before = tree_digest(root)
    result = run_script(script, "--dry-run", "--root", root, *args)
    assert result.returncode in (0, 3), result.stderr
    assert planned(result.stdout), "a dry run on a fresh device must plan something"
    assert "[change]" not in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].endswith("nothing was changed (dry run)")
    assert tree_digest(root) == before


# ---------------------------------------------------------------- setup scripts: real runs, idempotent

def test_setup_pi_real_run_writes_its_files_once(tmp_path):
    # Packages and venv already in place (what apt and pip would have done), the keyring too
    # (fetching it needs the network): what is left are the files the script writes itself.
    root = build_root(tmp_path, "pi5-coral-usb", packages=(
        "python3-pip", "gnupg", "usbutils", "python3-picamera2", "python3-libcamera", "rpicam-apps-lite",
        "v4l-utils", "libedgetpu1-std"))
    keyring = root / "etc/apt/keyrings/coral-edgetpu.gpg"
    keyring.parent.mkdir(parents=True)
    keyring.write_bytes(b"\x99\x01\x0dkey")
    make_venv(root, "/opt/edgeinfer/venv", "3.11", system_site=True,
              dists={"edgeinfer": "0.1.0", "numpy": "1.26.4", "tflite_runtime": "2.14.0", "paho_mqtt": "2.1.0"})
    first = run_script("setup-pi.sh", "--root", root)
    assert first.returncode == 0, first.stderr
    assert "[change] write: /etc/apt/sources.list.d/coral-edgetpu.list (mode 0644)" in first.stdout
    assert "[change] run:" not in first.stdout
    assert (root / "etc/udev/rules.d/71-edgeinfer-coral.rules").stat().st_mode & 0o777 == 0o644
    assert "numpy 1.26.4 with tflite_runtime 2.14.0: ok" in first.stdout
    digest = tree_digest(root)
    second = run_script("setup-pi.sh", "--root", root)
    assert second.returncode == 0, second.stderr
    assert second.stdout.rstrip().endswith("[summary] no changes")
    assert tree_digest(root) == digest


def test_setup_jetson_real_run_writes_its_files_once(tmp_path):
    root = build_root(tmp_path, "jetson-jp6", packages=("python3-pip", "v4l-utils"))
    make_venv(root, "/opt/edgeinfer/venv", "3.10", system_site=False,
              dists={"edgeinfer": "0.1.0", "onnxruntime": "1.19.2", "paho_mqtt": "2.1.0"})
    first = run_script("setup-jetson.sh", "--root", root, "--max-clocks")
    assert first.returncode == 0, first.stderr
    pth = root / "opt/edgeinfer/venv/lib/python3.10/site-packages/edgeinfer-system-tensorrt.pth"
    assert pth.read_text() == "/usr/lib/python3.10/dist-packages\n"
    digest = tree_digest(root)
    second = run_script("setup-jetson.sh", "--root", root, "--max-clocks")
    assert second.returncode == 0, second.stderr
    assert second.stdout.rstrip().endswith("[summary] no changes")
    assert tree_digest(root) == digest


def _fake_openvino_archive(tmp_path: Path) -> Path:
    """A .tgz laid out like Intel's OpenVINO 2022.3 archive (only the paths the script checks)."""
    top = tmp_path / "l_openvino_toolkit_ubuntu20_2022.3.2_x86_64"
    for rel in ("setupvars.sh", "python/python3.10/openvino/__init__.py",
                "runtime/lib/intel64/libopenvino_intel_myriad_plugin.so", "runtime/3rdparty/tbb/lib/libtbb.so.2"):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text("")
    archive = tmp_path / "openvino.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    return archive


def test_setup_intel_ncs2_real_run_checks_and_unpacks_the_archive_once(tmp_path):
    root = build_root(tmp_path, "intel-ncs2", packages=("python3-pip", "ca-certificates", "curl", "libusb-1.0-0",
                                                        "libtbb2"))
    make_venv(root, "/opt/edgeinfer/venv", "3.10", system_site=False,
              dists={"edgeinfer": "0.1.0", "paho_mqtt": "2.1.0", "numpy": "1.24.4"})
    archive = _fake_openvino_archive(tmp_path)
    result = run_script("setup-intel.sh", "--root", root, "--openvino-archive", archive,
                        "--openvino-sha256", "0" * 64)
    assert result.returncode == 1
    assert "does not match --openvino-sha256" in result.stderr
    assert not (root / "opt/intel/openvino_2022.3.2").exists()

    not_an_archive = tmp_path / "broken.tgz"
    not_an_archive.write_text("not gzip\n")
    result = run_script("setup-intel.sh", "--root", root, "--openvino-archive", not_an_archive)
    assert result.returncode == 1
    assert "cannot unpack" in result.stderr
    assert not (root / "opt/intel/openvino_2022.3.2").exists()

    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    first = run_script("setup-intel.sh", "--root", root, "--openvino-archive", archive, "--openvino-sha256", sha)
    assert first.returncode == 0, first.stderr
    assert (root / "opt/intel/openvino_2022.3.2/runtime/lib/intel64/libopenvino_intel_myriad_plugin.so").is_file()
    assert (root / "etc/ld.so.conf.d/edgeinfer-openvino-2022.3.2.conf").is_file()
    assert f"[change] run: ldconfig -r {root}" in first.stdout
    digest = tree_digest(root)
    second = run_script("setup-intel.sh", "--root", root, "--openvino-archive", archive, "--openvino-sha256", sha)
    assert second.returncode == 0, second.stderr
    assert "[ok] OpenVINO 2022.3.2 unpacked in /opt/intel/openvino_2022.3.2" in second.stdout
    assert second.stdout.rstrip().endswith("[summary] no changes")
    assert tree_digest(root) == digest
