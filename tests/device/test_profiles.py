"""Device profiles: every shipped profile is valid and recognised from its fake root; validation
errors name the file and the key; user directories; telemetry sources; the wheel ships the folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.assets import REPO
from support.profiles import PI4, ROOTS, FakeRoot, fake_root, write_profile

from edgeinfer.device.detect import DeviceMatch, detect
from edgeinfer.device.host import parse_tegra_release, probe_host
from edgeinfer.device.profiles import PROFILE_DIRS_ENV, PROFILE_ENV, builtin_profile_dir, load_profile, load_profiles
from edgeinfer.device.sensors import read_power, read_temperatures
from edgeinfer.errors import ProfileError

NO_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def shipped():
    return load_profiles(env=NO_ENV)


def test_every_shipped_profile_has_a_fake_root(shipped):
    assert set(ROOTS) == set(shipped), "add a fake root for each new profile to tests/support/profiles.py"
    required = {"raspberry-pi-3", "raspberry-pi-3-coral-usb", "raspberry-pi-4", "raspberry-pi-4-coral-usb",
                "raspberry-pi-5", "raspberry-pi-5-coral-usb", "coral-dev-board", "jetson-nano", "jetson-xavier-nx",
                "jetson-orin-nano", "jetson-orin-nx", "jetson-agx-orin", "x86-64-ncs2", "intel-core-ultra-npu",
                "generic-x86-64", "generic-aarch64"}
    assert required <= set(shipped)


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_profile_is_matched_from_its_fake_root(name, tmp_path, shipped):
    detection = detect(fake_root(tmp_path, name), profiles=shipped, env=NO_ENV)
    assert isinstance(detection, DeviceMatch)
    assert detection.profile is not None and detection.profile.name == name, detection.ranking
    assert not detection.ambiguous, detection.ranking
    assert detection.evidence and detection.score == shipped[name].specificity
    assert detection.host.live is False


def test_more_specific_profiles_win(tmp_path, shipped):
    ranking = dict(detect(fake_root(tmp_path, "raspberry-pi-4-coral-usb"), profiles=shipped, env=NO_ENV).ranking)
    assert list(ranking) == ["raspberry-pi-4-coral-usb", "raspberry-pi-4", "generic-aarch64"]
    assert ranking["raspberry-pi-4-coral-usb"] > ranking["raspberry-pi-4"] > ranking["generic-aarch64"]


def test_unknown_board_falls_back_to_the_generic_profile_and_unknown_arch_to_none(tmp_path, shipped):
    board = FakeRoot(tmp_path / "a").cpu("aarch64").model("Radxa ROCK 5B")
    assert detect(board, profiles=shipped, env=NO_ENV).profile.name == "generic-aarch64"
    riscv = FakeRoot(tmp_path / "b").file("/proc/sys/kernel/arch", "riscv64\n")
    detection = detect(riscv, profiles=shipped, env=NO_ENV)
    assert detection.profile is None and detection.host.arch == "riscv64"


def test_pi_400_and_compute_module_are_pi_4(tmp_path, shipped):
    for i, model in enumerate(("Raspberry Pi 400 Rev 1.0", "Raspberry Pi Compute Module 4 Rev 1.0")):
        root = FakeRoot(tmp_path / str(i)).cpu("aarch64").model(model)
        assert detect(root, profiles=shipped, env=NO_ENV).profile.name == "raspberry-pi-4"


def test_orin_on_jetpack_4_is_not_an_orin_profile(tmp_path, shipped):
    root = FakeRoot(tmp_path).cpu("aarch64").model("NVIDIA Jetson AGX Orin Developer Kit").tegra(32, "7.1")
    assert detect(root, profiles=shipped, env=NO_ENV).profile.name == "jetson-generic"


def test_forced_profile_by_environment(tmp_path, shipped):
    root = fake_root(tmp_path, "generic-x86-64")
    forced = detect(root, profiles=shipped, env={PROFILE_ENV: "jetson-nano"})
    assert forced.profile.name == "jetson-nano" and forced.evidence == (f"${PROFILE_ENV}=jetson-nano",)
    with pytest.raises(ProfileError, match="no profile named 'jetson-nanoo'"):
        detect(root, profiles=shipped, env={PROFILE_ENV: "jetson-nanoo"})


def test_host_facts(tmp_path):
    root = (FakeRoot(tmp_path).cpu("aarch64").model("NVIDIA Jetson Orin Nano Developer Kit").tegra(36, "4.0")
            .usb("18d1:9302").pci("1ac1:089a").library("libnvinfer.so.10.3.0"))
    host = probe_host(root)
    assert host.model == "NVIDIA Jetson Orin Nano Developer Kit"  # trailing NUL stripped
    assert host.l4t == (36, 4, 0) and host.arch == "aarch64"
    assert host.usb_ids == {"18d1:9302"} and host.pci_ids == {"1ac1:089a"}
    assert host.usb[0].node == "/dev/bus/usb/001/002" and host.exists("/dev/bus/usb/001/002")
    assert host.find_library("libnvinfer.so*") == "/usr/lib/aarch64-linux-gnu/libnvinfer.so.10.3.0"
    assert host.find_library("libedgetpu.so.1*") is None
    assert "asimd" in host.cpu_flags
    assert parse_tegra_release("# R32 (release), REVISION: 7.1, GCID: 1") == (32, 7, 1)
    assert parse_tegra_release("garbage") is None


def test_library_search_follows_ld_so_conf(tmp_path):
    root = FakeRoot(tmp_path).file("/etc/ld.so.conf.d/coral.conf", "# vendor\n/opt/coral/lib\n")
    root.library("libedgetpu.so.1.0", "/opt/coral/lib")
    assert probe_host(root).find_library("libedgetpu.so.1*") == "/opt/coral/lib/libedgetpu.so.1.0"


def test_pi_board_name_from_cpuinfo_when_there_is_no_device_tree(tmp_path, shipped):
    root = FakeRoot(tmp_path).file("/proc/cpuinfo", f"processor : 0\nFeatures : fp asimd\nModel : {PI4}\n")
    assert detect(root, profiles=shipped, env=NO_ENV).profile.name == "raspberry-pi-4"
    x86 = FakeRoot(tmp_path / "x86").cpu("x86_64")  # "model : 170" on x86 is a number, not a board
    assert probe_host(x86).model is None


def test_extends_merges_match_and_keeps_the_base_camera(shipped):
    coral = shipped["raspberry-pi-4-coral-usb"]
    base = shipped["raspberry-pi-4"]
    assert coral.extends == "raspberry-pi-4"
    assert coral.match.device_tree_model == base.match.device_tree_model
    assert coral.match.usb == ("1a6e:089a", "18d1:9302")
    assert coral.camera == base.camera and coral.threads == base.threads
    assert coral.delegates[0] == "coral:usb"
    assert "{width}" not in (coral.camera.pipeline(width=320, height=240, fps=15) or "{width}")
    assert "width=320" in coral.camera.pipeline(width=320, height=240, fps=15)


def test_shipped_profiles_cover_the_delegate_orders_the_issue_names(shipped):
    assert shipped["jetson-orin-nano"].delegates[0].startswith("tensorrt")
    assert shipped["x86-64-ncs2"].delegates[0] == "openvino:MYRIAD"
    assert shipped["intel-core-ultra-npu"].delegates[0] == "openvino:NPU"
    assert shipped["coral-dev-board"].delegates[0] == "coral:pci"
    assert "nvarguscamerasrc" in shipped["jetson-orin-nx"].camera.gstreamer
    assert "libcamerasrc" in shipped["raspberry-pi-5"].camera.gstreamer
    for profile in shipped.values():
        assert profile.memory_budget_mb and profile.setup_script, profile.name
        assert profile.telemetry.thermal_zones, profile.name


# ---------------------------------------------------------------------------------- validation

GOOD = """\
schema: 1
name: my-board
match:
  device_tree_model: "My Board"
delegates: [xnnpack]
"""

BAD = [
    ("unknown top-level key", GOOD + "delegate: [xnnpack]\n", "delegate", "did you mean 'delegates'"),
    ("unknown match key", GOOD.replace("device_tree_model", "device_tree_modle"), "match.device_tree_modle",
     "did you mean 'device_tree_model'"),
    ("bad usb id", GOOD + "", None, None),  # replaced below
    ("bad regex", GOOD.replace('"My Board"', '"My (Board"'), "match.device_tree_model", "regular expression"),
    ("threads", GOOD + "threads: -2\n", "threads", "positive integer"),
    ("threads bool", GOOD + "threads: yes\n", "threads", "positive integer"),
    ("delegates missing", GOOD.replace("delegates: [xnnpack]\n", ""), "delegates", "is required"),
    ("delegate spec", GOOD.replace("[xnnpack]", "['Coral USB']"), "delegates[0]", "not a delegate spec"),
    ("match empty", GOOD.replace('match:\n  device_tree_model: "My Board"\n', "match: {}\n"), "match",
     "at least one criterion"),
    ("schema", GOOD.replace("schema: 1", "schema: 2"), "schema", "reads schema 1"),
    ("camera braces", GOOD + "camera:\n  gstreamer: 'v4l2src ! video/x-raw,width={w}'\n", "camera.gstreamer",
     "{width}"),
    ("camera device", GOOD + "camera:\n  device: video0\n", "camera.device", "absolute path"),
    ("power rail", GOOD + "telemetry:\n  power_rails:\n    VDD_IN: {voltage: /sys/x}\n", "telemetry.power_rails.VDD_IN",
     "current"),
    ("extends unknown", GOOD + "extends: no-such-board\n", "extends", "no profile named 'no-such-board'"),
    ("top level list", "- a\n- b\n", "(top level)", "must be a mapping"),
    ("setup script", GOOD + "setup_script: 'rm -rf /'\n", "setup_script", "script file name"),
    ("device node", GOOD.replace('device_tree_model: "My Board"', "device_nodes: [dev/apex_0]"),
     "match.device_nodes[0]", "absolute path"),
]
BAD[2] = ("bad usb id", GOOD.replace('device_tree_model: "My Board"', 'usb: ["1a6e:089a", "1A6E-089A"]'),
          "match.usb[1]", "vendor:product")


@pytest.mark.parametrize(("case", "text", "key", "message"), BAD, ids=[b[0] for b in BAD])
def test_validation_error_names_the_file_and_the_key(case, text, key, message, tmp_path):
    path = write_profile(tmp_path / "profiles", "my-board.yaml", text)
    with pytest.raises(ProfileError) as info:
        load_profiles([tmp_path / "profiles"], env=NO_ENV)
    text = str(info.value)
    assert text.startswith(f"{path}: {key}: "), text
    assert message in text, text


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write_profile(tmp_path, "broken.yaml", "name: x\nmatch: {arch: [x86_64]\ndelegates: [xnnpack]\n")
    with pytest.raises(ProfileError, match=rf"^{path}: line \d+, column \d+: invalid YAML"):
        load_profiles([tmp_path], env=NO_ENV)


def test_circular_extends_and_duplicate_names(tmp_path):
    write_profile(tmp_path / "c", "a.yaml", "name: a\nextends: b\n")
    write_profile(tmp_path / "c", "b.yaml", "name: b\nextends: a\n")
    with pytest.raises(ProfileError, match="extends: circular"):
        load_profiles([tmp_path / "c"], env=NO_ENV)
    write_profile(tmp_path / "d", "one.yaml", GOOD)
    write_profile(tmp_path / "d", "two.yaml", GOOD)
    with pytest.raises(ProfileError, match=r"two\.yaml: name: 'my-board' is also defined in .*one\.yaml"):
        load_profiles([tmp_path / "d"], env=NO_ENV)


def test_missing_profile_directory_is_an_error(tmp_path):
    with pytest.raises(ProfileError, match="profile directory does not exist"):
        load_profiles([tmp_path / "nope"], env=NO_ENV)


def test_user_directory_adds_and_overrides_profiles(tmp_path, shipped):
    user = tmp_path / "user"
    write_profile(user, "my-board.yaml", GOOD)
    write_profile(user, "pi4.yaml", "name: raspberry-pi-4\nextends: generic-aarch64\nmatch:\n"
                                    "  device_tree_model: 'Raspberry Pi 4'\ndelegates: [onnxruntime]\n")
    from_env = load_profiles(env={PROFILE_DIRS_ENV: str(user)})
    from_arg = load_profiles([user], env=NO_ENV)
    for profiles in (from_env, from_arg):
        assert profiles["my-board"].source == str(user / "my-board.yaml")
        assert profiles["raspberry-pi-4"].delegates == ("onnxruntime",)  # the user's replaces the shipped one
        assert profiles["raspberry-pi-4"].camera == shipped["generic-aarch64"].camera
    root = FakeRoot(tmp_path / "root").cpu("aarch64").model("My Board v3")
    assert detect(root, profile_dirs=[user], env=NO_ENV).profile.name == "my-board"


def test_a_user_profile_can_tweak_the_shipped_one_of_the_same_name(tmp_path, shipped):
    user = tmp_path / "user"
    write_profile(user, "pi4.yaml", "name: raspberry-pi-4\nextends: raspberry-pi-4\nthreads: 2\n")
    tweaked = load_profiles([user], env=NO_ENV)["raspberry-pi-4"]
    assert tweaked.threads == 2 and tweaked.source == str(user / "pi4.yaml") and tweaked.layer == 1
    assert tweaked.delegates == shipped["raspberry-pi-4"].delegates and tweaked.match == shipped["raspberry-pi-4"].match
    # the Coral variant extends the name, so it now builds on the tweaked profile
    assert load_profiles([user], env=NO_ENV)["raspberry-pi-4-coral-usb"].threads == 2
    alone = tmp_path / "alone"
    write_profile(alone, "x.yaml", "name: lab\nextends: lab\n")
    with pytest.raises(ProfileError, match="extends: 'lab' extends itself"):
        load_profiles([alone], env=NO_ENV)


def test_single_file_can_extend_a_shipped_profile(tmp_path):
    path = write_profile(tmp_path, "lab-pi.yaml", "name: lab-pi\nextends: raspberry-pi-4-coral-usb\nthreads: 2\n")
    profile = load_profile(path)
    assert profile.threads == 2 and profile.delegates[0] == "coral:usb" and profile.source == str(path)
    assert profile.match.usb and profile.match.device_tree_model


# ----------------------------------------------------------------------------------- telemetry

def test_temperatures_by_zone_type_with_alternatives(tmp_path, shipped):
    root = FakeRoot(tmp_path)
    for i, (kind, milli) in enumerate((("CPU-therm", 51500), ("GPU-therm", 49000), ("tj-therm", 53250))):
        root.file(f"/sys/class/thermal/thermal_zone{i}/type", kind + "\n")
        root.file(f"/sys/class/thermal/thermal_zone{i}/temp", f"{milli}\n")
    temps = read_temperatures(shipped["jetson-orin-nano"], root)  # JetPack 5 names, profile lists both spellings
    assert temps == {"cpu": 51.5, "gpu": 49.0, "junction": 53.25}
    root.file("/sys/class/apex/apex_0/temp", "44000\n")
    root.file("/sys/class/thermal/thermal_zone9/type", "cpu-thermal\n").file(
        "/sys/class/thermal/thermal_zone9/temp", "40000\n")
    assert read_temperatures(shipped["raspberry-pi-5-coral-pcie"], root) == {"cpu": 40.0, "tpu": 44.0}


def test_power_rails_from_hwmon_and_iio(tmp_path, shipped):
    root = FakeRoot(tmp_path)
    hwmon = "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    root.file(f"{hwmon}/in1_input", "5000\n").file(f"{hwmon}/curr1_input", "1200\n")
    assert read_power(shipped["jetson-orin-nx"], root) == {"VDD_IN": 6000.0}
    iio = "/sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    root.file(f"{iio}/in_power0_input", "4321\n").file(f"{iio}/in_power1_input", "oops\n")
    assert read_power(shipped["jetson-nano"], root) == {"POM_5V_IN": 4321.0}


# -------------------------------------------------------------------------------------- wheel

@pytest.mark.slow
def test_wheel_ships_the_profiles_and_they_load_from_the_package(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "*.egg-info", "build", "dist",
                                                                "__pycache__", ".pytest_cache", ".ruff_cache"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("edgeinfer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    shipped = sorted(p.name for p in builtin_profile_dir().glob("*.yaml"))
    assert sorted(n.split("/")[-1] for n in names if n.startswith("edgeinfer/device_profiles/")) == shipped
    code = ("import edgeinfer.device.profiles as p; d = p.builtin_profile_dir(); "
            "print(d); print(len(p.load_profiles(env={})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    where, count = out.stdout.split()
    assert Path(where) == tmp_path / "site" / "edgeinfer" / "device_profiles"
    assert int(count) == len(shipped)


# -------------------------------------------------------------------------- nothing at import

def test_nothing_is_probed_or_loaded_at_import_time():
    """Importing the profile, selection, doctor and CLI modules opens no device file and no profile."""
    code = (
        "import sys, json\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == 'open' else None)\n"
        "import edgeinfer.device.profiles, edgeinfer.device.host, edgeinfer.device.detect, edgeinfer.device.sensors\n"
        "import edgeinfer.runtime.selection, edgeinfer.runtime.delegates.registry\n"
        "import edgeinfer.tools.doctor, edgeinfer.cli\n"
        "import edgeinfer.runtime.delegates.coral, edgeinfer.runtime.delegates.tensorrt, "
        "edgeinfer.runtime.delegates.onnxruntime_gpu\n"
        "print(json.dumps([p for p in opened if p.startswith(('/proc', '/sys', '/dev', '/etc')) "
        "or p.endswith('.yaml')]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_alternative_device_tree_path_and_cpu_flags(tmp_path):
    root = FakeRoot(tmp_path / "root").cpu("x86_64")
    root.file("/sys/firmware/devicetree/base/model", b"Lab Box 2\x00")
    assert probe_host(root).model == "Lab Box 2"
    user = tmp_path / "user"
    write_profile(user, "avx.yaml", "name: lab-avx\nmatch: {arch: [x86_64], cpu_flags: [avx2, fma]}\n"
                                    "delegates: [onnxruntime]\n")
    write_profile(user, "vnni.yaml", "name: lab-vnni\nmatch: {arch: [x86_64], cpu_flags: [avx512_vnni]}\n"
                                     "delegates: [openvino]\n")
    detection = detect(root, profile_dirs=[user], env=NO_ENV)
    assert detection.profile.name == "lab-avx" and "CPU flags avx2 fma" in detection.evidence
    assert "lab-vnni" not in dict(detection.ranking)
