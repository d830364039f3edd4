"""``edgeinfer doctor``: the setup problems edge users hit most, each with the fix.

Everything about the device (USB and PCI devices, device nodes, libraries, udev rules, users and
groups, L4T release) is read from a root filesystem, ``/`` by default, so the checks can be run
against a fake tree in tests or a mounted SD card image. Python packages are those of the
interpreter running the doctor — the one that would run the models.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..device.detect import DeviceMatch, detect
from ..device.host import Host, UsbDevice
from ..device.profiles import Profile

OK, PROBLEM, WARNING, INFO = "ok", "problem", "warning", "info"
UDEV_RULE_DIRS = ("/etc/udev/rules.d", "/lib/udev/rules.d", "/usr/lib/udev/rules.d")
SCRIPTS = {"pi": "setup-pi.sh", "jetson": "setup-jetson.sh", "intel": "setup-intel.sh", "agent": "install-agent.sh"}

#: TensorRT major.minor that each L4T release ships (NVIDIA JetPack release notes)
L4T_TENSORRT = {
    (32, 4): ("4.4", "7.1"), (32, 5): ("4.5", "7.1"), (32, 6): ("4.6", "8.0"), (32, 7): ("4.6.x", "8.2"),
    (35, 1): ("5.0.2", "8.4"), (35, 2): ("5.1", "8.5"), (35, 3): ("5.1.1", "8.5"), (35, 4): ("5.1.2", "8.5"),
    (35, 5): ("5.1.3", "8.5"), (35, 6): ("5.1.4", "8.5"), (36, 2): ("6.0 DP", "8.6"), (36, 3): ("6.0", "8.6"),
    (36, 4): ("6.1 / 6.2", "10.3"),
}
#: JetPack generation by L4T major release
L4T_JETPACK = {32: "4", 35: "5", 36: "6"}


@dataclass(frozen=True)
class Finding:
    """One check's outcome: ``status`` is ok, problem, warning or info; ``fix`` says what to do."""

    check: str
    status: str
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True)
class Report:
    """Every finding for one root, and the profile it was judged against."""

    root: str
    user: str
    profile: str | None
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> tuple[Finding, ...]:
        """The findings whose status is problem."""
        return tuple(f for f in self.findings if f.status == PROBLEM)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the problem and warning counts."""
        return {"root": self.root, "user": self.user, "profile": self.profile, "problems": len(self.problems),
                "warnings": sum(f.status == WARNING for f in self.findings),
                "findings": [f.to_dict() for f in self.findings]}


# ------------------------------------------------------------------------------------- helpers

def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for spelling in (name, name.replace("-", "_")):
        try:
            return version(spelling)
        except PackageNotFoundError:
            continue
    return None


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def _script(profile: Profile | None, family: str) -> str:
    name = profile.setup_script if profile and profile.setup_script else SCRIPTS[family]
    return f"firmware_scripts/{name}"


def _users(host: Host, user: str) -> tuple[int | None, set[int]]:
    """(uid, gids) of ``user`` from the root's /etc/passwd and /etc/group (the live system's NSS as a fallback)."""
    uid = gid = None
    for line in (host.read("/etc/passwd") or "").splitlines():
        parts = line.split(":")
        if len(parts) > 3 and parts[0] == user:
            uid, gid = int(parts[2]), int(parts[3])
    gids = {gid} if gid is not None else set()
    for line in (host.read("/etc/group") or "").splitlines():
        parts = line.split(":")
        if len(parts) > 3 and user in parts[3].split(","):
            gids.add(int(parts[2]))
    if uid is None and host.live:
        import grp
        import pwd

        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            return None, gids
        uid = entry.pw_uid
        gids = {entry.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return uid, gids


def can_read_write(host: Host, device_path: str, user: str) -> bool | None:
    """Whether ``user`` may open ``device_path`` read-write, from its mode bits; None if unknown."""
    try:
        st = os.stat(host.path(device_path))
    except OSError:
        return None
    uid, gids = _users(host, user)
    if uid == 0 or user == "root":
        return True
    if uid is None:
        return None
    if st.st_uid == uid:
        return st.st_mode & 0o600 == 0o600
    if st.st_gid in gids:
        return st.st_mode & 0o060 == 0o060
    return st.st_mode & 0o006 == 0o006


def _group_name(host: Host, gid: int) -> str:
    for line in (host.read("/etc/group") or "").splitlines():
        parts = line.split(":")
        if len(parts) > 2 and parts[2] == str(gid):
            return parts[0]
    return str(gid)


def udev_rules_mention(host: Host, *needles: str) -> list[str]:
    """udev rule files under the root that mention any of ``needles`` (e.g. a USB vendor id)."""
    hits = []
    for directory in UDEV_RULE_DIRS:
        for rule in host.glob(f"{directory}/*.rules"):
            text = (host.read(rule) or "").lower()
            if any(n.lower() in text for n in needles):
                hits.append(rule)
    return hits


# --------------------------------------------------------------------------------------- checks

def _check_python(packages: Callable[[str], str | None]) -> list[Finding]:
    findings = []
    numpy, tflite, litert = packages("numpy"), packages("tflite-runtime"), packages("ai-edge-litert")
    if tflite and numpy and _version_tuple(numpy)[:1] >= (2,) and _version_tuple(tflite) <= (2, 14, 99):
        findings.append(Finding(
            "numpy-tflite-runtime", PROBLEM,
            f"numpy {numpy} with tflite-runtime {tflite}: tflite-runtime wheels (2.14 is the last release) are "
            "built against numpy 1.x and fail to import under numpy 2 ('_ARRAY_API not found')",
            "pip install 'numpy<2' (what 'edgeinfer[coral]' pins), or switch to LiteRT: pip uninstall tflite-runtime "
            "&& pip install 'edgeinfer[tflite]'"))
    elif tflite or litert:
        which = f"ai-edge-litert {litert}" if litert else f"tflite-runtime {tflite}"
        findings.append(Finding("litert", OK, f"{which} with numpy {numpy}"))
    else:
        findings.append(Finding("litert", WARNING, "no LiteRT runtime (ai-edge-litert or tflite-runtime) is installed",
                                "pip install 'edgeinfer[tflite]'"))
    av, simplejpeg = packages("av"), packages("simplejpeg")
    if av and simplejpeg:
        findings.append(Finding("mjpeg", OK, "MJPEG files and HTTP streams, and JPEG folders, decode at the "
                                f"model's size (PyAV {av}, simplejpeg {simplejpeg})"))
    else:
        findings.append(Finding("mjpeg", INFO, "MJPEG and JPEGs decode at full size through OpenCV (PyAV and "
                                "simplejpeg decode them at the model's size: 1.5-2x faster for 1080p)",
                                "pip install 'edgeinfer[mjpeg]'"))
    return findings


def _check_coral(host: Host, profile: Profile | None, user: str) -> list[Finding]:
    """A Coral Edge TPU the profile expects or the root shows: present, libedgetpu, USB and PCIe access."""
    from ..runtime.delegates.coral import CORAL_PCI_IDS, CORAL_USB_IDS, library_problem

    usb = host.usb_devices(CORAL_USB_IDS)
    on_pci = bool(host.pci_ids & set(CORAL_PCI_IDS))
    apex = host.glob("/dev/apex_*")
    wanted = profile is not None and any(d.split(":")[0] == "coral" for d in profile.delegates)
    if not (usb or on_pci or apex or wanted):
        return []
    family = "pi" if profile and profile.name.startswith("raspberry-pi") else "agent"
    findings = []
    if not (usb or on_pci or apex):
        findings.append(Finding("edgetpu-present", WARNING, f"profile {profile.name} expects a Coral Edge TPU, "
                                "but none is connected (no USB 1a6e:089a / 18d1:9302, no PCI 1ac1:089a)",
                                "connect the accelerator (USB 3 port for the USB Accelerator) and run doctor again"))
        return findings
    problem = library_problem(host)
    if problem:
        findings.append(Finding(
            "libedgetpu", PROBLEM, problem,
            f"run {_script(profile, family)}, or: echo 'deb https://packages.cloud.google.com/apt coral-edgetpu-stable "
            "main' | sudo tee /etc/apt/sources.list.d/coral-edgetpu.list && sudo apt-get update && "
            "sudo apt-get install libedgetpu1-std"))
    else:
        findings.append(Finding("libedgetpu", OK, "libedgetpu.so.1 is installed"))
    findings += _check_coral_usb(host, usb, profile, family, user)
    findings += _check_coral_pcie(host, on_pci, apex, profile, family, user)
    return findings


def _check_coral_usb(host: Host, usb: list[UsbDevice], profile: Profile | None, family: str,
                     user: str) -> list[Finding]:
    """Each connected USB Accelerator: a udev rule that grants access, and its node open to ``user``."""
    findings = []
    for device in usb:
        rules = udev_rules_mention(host, device.id.split(":")[0])
        if not rules:
            findings.append(Finding(
                "edgetpu-udev", PROBLEM,
                f"Coral USB Accelerator {device.id} is connected but no udev rule grants access to it (none in "
                f"{', '.join(UDEV_RULE_DIRS)} mentions vendor {device.id.split(':')[0]})",
                f"run {_script(profile, family)} (installs the libedgetpu udev rule: SUBSYSTEMS==\"usb\", "
                "ATTRS{idVendor}==\"1a6e\"|\"18d1\", MODE=\"0664\", GROUP=\"plugdev\"), then "
                f"sudo usermod -aG plugdev {user} and unplug / replug the accelerator"))
        node = device.node
        allowed = can_read_write(host, node, user) if node else None
        if allowed is False:
            st = os.stat(host.path(node))
            findings.append(Finding(
                "edgetpu-permission", PROBLEM,
                f"user {user!r} cannot open the TPU's USB node {node} (mode {st.st_mode & 0o777:o}, group "
                f"{_group_name(host, st.st_gid)})",
                f"sudo usermod -aG plugdev {user}, log out and in (or reboot), and make sure the udev rule sets "
                "GROUP=\"plugdev\" MODE=\"0664\"; then unplug / replug the accelerator"))
        elif allowed:
            findings.append(Finding("edgetpu-permission", OK, f"user {user!r} can open {node}"))
    return findings


def _check_coral_pcie(host: Host, on_pci: bool, apex: list[str], profile: Profile | None, family: str,
                      user: str) -> list[Finding]:
    """A PCIe/M.2 accelerator: the gasket/apex driver made /dev/apex_*, and ``user`` may open them."""
    findings = []
    if on_pci and not apex:
        loaded = host.exists("/sys/module/apex")
        findings.append(Finding(
            "gasket-driver", PROBLEM,
            "a Coral PCIe/M.2 accelerator is on the PCI bus but /dev/apex_0 is missing: the gasket/apex driver is "
            + ("loaded yet created no device node" if loaded else "not loaded"),
            "sudo apt-get install gasket-dkms (Coral apt repo) — on kernels newer than it supports, build "
            "github.com/google/gasket-driver with dkms — then sudo modprobe apex and reboot"
            + ("; on a Raspberry Pi 5 also set dtparam=pciex1, kernel=kernel8.img and dtoverlay=pcie-32bit-dma in "
               "/boot/firmware/config.txt" if family == "pi" else "")))
    for node in apex:
        allowed = can_read_write(host, node, user)
        if allowed is False:
            findings.append(Finding(
                "apex-permission", PROBLEM, f"user {user!r} cannot open {node}",
                f"add the udev rule SUBSYSTEM==\"apex\", MODE=\"0660\", GROUP=\"apex\" and "
                f"sudo usermod -aG apex {user} (run {_script(profile, family)})"))
        elif allowed:
            findings.append(Finding("apex-permission", OK, f"{node} present and usable by {user!r}"))
    return findings


def _check_tensorrt(host: Host, profile: Profile | None, packages: Callable[[str], str | None]) -> list[Finding]:
    wanted = profile is not None and any(d.split(":")[0] in ("tensorrt", "onnxruntime-gpu") for d in profile.delegates)
    if not (host.tegra_release or wanted):
        return []
    findings = []
    script = _script(profile, "jetson")
    if profile and profile.l4t and host.l4t and host.l4t[0] not in profile.l4t:
        supported = ", ".join(f"R{r} (JetPack {L4T_JETPACK.get(r, '?')})" for r in profile.l4t)
        findings.append(Finding(
            "jetpack", PROBLEM,
            f"{profile.description} runs {supported}; this root has L4T R{host.l4t_string} "
            f"(JetPack {L4T_JETPACK.get(host.l4t[0], '?')})",
            "flash a JetPack release this module supports (NVIDIA SDK Manager, or the SD card image for the "
            f"developer kit), then run {script}"))
    library = host.find_library("libnvinfer.so*") if host.tegra_release else None
    if host.tegra_release and library is None:
        findings.append(Finding(
            "tensorrt-libraries", PROBLEM,
            f"TensorRT libraries (libnvinfer.so.*) are not installed under {host.root}",
            f"run {script}, or: sudo apt-get install nvidia-tensorrt (JetPack 4/5) / tensorrt (JetPack 6)"))
    library_version = None
    if library:
        library_version = re.search(r"\.so\.(\d+\.\d+)", os.path.basename(library))
        library_version = library_version.group(1) if library_version else None
        expected = L4T_TENSORRT.get(host.l4t[:2]) if host.l4t else None
        if expected and library_version and library_version != expected[1]:
            findings.append(Finding(
                "jetpack", PROBLEM,
                f"L4T R{host.l4t_string} (JetPack {expected[0]}) ships TensorRT {expected[1]}, but {library} is "
                f"TensorRT {library_version}: the TensorRT libraries do not belong to this JetPack",
                f"reinstall TensorRT from the JetPack apt repository ({script}); do not mix JetPack releases"))
        else:
            findings.append(Finding("tensorrt-libraries", OK, f"{library}"))
    python_trt = packages("tensorrt")
    from importlib.util import find_spec

    if python_trt is None and find_spec("tensorrt") is None:
        if wanted:
            findings.append(Finding(
                "tensorrt-python", PROBLEM, "the Python module 'tensorrt' is not importable by this interpreter",
                "on a Jetson: sudo apt-get install python3-libnvinfer and create the venv with "
                f"--system-site-packages ({script}); on x86-64: pip install 'edgeinfer[tensorrt]'"))
    elif python_trt and library_version and not python_trt.startswith(library_version):
        findings.append(Finding(
            "jetpack", PROBLEM,
            f"Python tensorrt {python_trt} does not match the system TensorRT {library_version} ({library})",
            "remove the pip tensorrt package (pip wheels do not run on Jetson) and use JetPack's "
            f"python3-libnvinfer ({script})"))
    return findings


def _check_intel(host: Host, profile: Profile | None, packages: Callable[[str], str | None]) -> list[Finding]:
    from ..runtime.delegates.openvino import MYRIAD_LAST_RELEASE, NCS2_USB_IDS

    findings = []
    ncs2 = host.usb_devices(NCS2_USB_IDS)
    devices = {d.split(":", 1)[1].split(".")[0].upper() for d in (profile.delegates if profile else ())
               if d.startswith("openvino:")}
    script = _script(profile, "intel")
    openvino = packages("openvino")
    if ncs2:
        version = _version_tuple(openvino)[:2]
        if openvino is None:
            findings.append(Finding("openvino", PROBLEM, "a Neural Compute Stick 2 is connected but OpenVINO is not "
                                    "installed", f"run {script} (OpenVINO 2022.3 LTS for the MYRIAD plugin)"))
        elif version > MYRIAD_LAST_RELEASE:
            findings.append(Finding(
                "openvino-myriad", PROBLEM,
                f"a Neural Compute Stick 2 is connected but OpenVINO {openvino} has no MYRIAD plugin "
                "(removed in 2023.0)",
                f"install openvino==2022.3.* (Python <= 3.10, numpy<2) in its own venv ({script}); until then "
                "models run on openvino:CPU"))
        if not udev_rules_mention(host, "03e7"):
            findings.append(Finding(
                "ncs2-udev", PROBLEM, "no udev rule for the Neural Compute Stick 2 (vendor 03e7)",
                f"run {script} (installs 97-myriad-usbboot.rules) and replug the stick"))
    if "NPU" in devices and not host.exists("/dev/accel/accel*"):
        findings.append(Finding(
            "npu-driver", PROBLEM, "no NPU device node (/dev/accel/accel0): the Intel NPU driver is not installed",
            f"run {script} (installs linux-npu-driver; needs kernel >= 6.6 with intel_vpu), then reboot"))
    if "GPU" in devices and not host.exists("/dev/dri/renderD*"):
        findings.append(Finding(
            "intel-gpu", WARNING, "no GPU render node (/dev/dri/renderD*) for openvino:GPU",
            f"run {script} (installs the Intel compute runtime) and add the user to the 'render' group"))
    return findings


def _check_camera(host: Host, profile: Profile | None, user: str) -> list[Finding]:
    nodes = host.glob("/dev/video*")
    if not nodes:
        if profile and profile.name.startswith("raspberry-pi"):
            fix = ("check the ribbon cable and that camera_auto_detect=1 is in /boot/firmware/config.txt, then "
                   "`rpicam-hello --list-cameras`; a USB camera should appear in `lsusb`")
        elif host.tegra_release:
            fix = ("check the CSI ribbon and `sudo systemctl status nvargus-daemon`; a USB camera should appear "
                   "in `lsusb`")
        else:
            fix = "connect a camera (`lsusb`, `dmesg | tail`), or use a file / RTSP source instead"
        return [Finding("camera", WARNING, "no camera node (/dev/video*)", fix)]
    findings = [Finding("camera", OK, f"camera node(s): {', '.join(nodes)}")]
    first = (profile.camera.device if profile and profile.camera.device in nodes else None) or nodes[0]
    if can_read_write(host, first, user) is False:
        findings.append(Finding("camera-permission", PROBLEM, f"user {user!r} cannot open {first}",
                                f"sudo usermod -aG video {user}, then log out and in"))
    return findings


def diagnose(root: str | os.PathLike = "/", *, user: str | None = None, profile_dirs: Iterable[str] = (),
             env: Mapping[str, str] | None = None, detection: DeviceMatch | None = None,
             packages: Callable[[str], str | None] = _package_version) -> Report:
    """Run every check against ``root`` for ``user`` (default: $SUDO_USER, else the current user)."""
    env = os.environ if env is None else env
    if user is None:
        import getpass

        user = env.get("SUDO_USER") or getpass.getuser()
    detection = detection or detect(root, profile_dirs=profile_dirs, env=env)
    host, profile = detection.host, detection.profile
    findings = [Finding("profile", INFO if profile else WARNING,
                        f"{profile.name}: {profile.description} ({'; '.join(detection.evidence)})" if profile
                        else f"no device profile matches (architecture {host.arch or 'unknown'})",
                        None if profile else "add a profile for this device (docs/profiles.md) in a directory "
                        "named by --profile-dir or $EDGEINFER_PROFILE_DIRS")]
    findings += _check_python(packages)
    findings += _check_coral(host, profile, user)
    findings += _check_tensorrt(host, profile, packages)
    findings += _check_intel(host, profile, packages)
    findings += _check_camera(host, profile, user)
    return Report(root=host.root, user=user, profile=profile.name if profile else None, findings=tuple(findings))


__all__ = ["Finding", "Report", "can_read_write", "diagnose", "udev_rules_mention"]
