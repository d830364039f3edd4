#!/usr/bin/env bash
# setup-intel.sh: prepare an x86-64 Linux host for an Intel Neural Compute Stick 2 (MYRIAD) or the NPU
# of a Core Ultra processor: the OpenVINO release that supports the device, its udev rule, and a
# venv with edgeinfer. Idempotent; see docs/provisioning.md.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

OV_NCS2_VERSION=2022.3.2
OV_NCS2_DIR=/opt/intel/openvino_$OV_NCS2_VERSION
# Intel's archive for Ubuntu 20.04 (runs on 22.04 too). Not fetched while writing this script (no
# network there): check the name on storage.openvinotoolkit.org, or host the file yourself.
OV_NCS2_URL=https://storage.openvinotoolkit.org/repositories/openvino/packages/2022.3.2/linux/l_openvino_toolkit_ubuntu20_2022.3.2.9279.e2c7e4d7b4d_x86_64.tgz
MYRIAD_RULES=/etc/udev/rules.d/97-myriad-usbboot.rules
NPU_RULES=/etc/udev/rules.d/10-intel-vpu.rules
OV_LDCONF=/etc/ld.so.conf.d/edgeinfer-openvino-$OV_NCS2_VERSION.conf
OV_PTH_NAME=edgeinfer-openvino-$OV_NCS2_VERSION.pth
NPU_DRIVER_PKGS=(intel-driver-compiler-npu intel-fw-npu intel-level-zero-npu)

usage() {
    cat <<EOF
Usage: $EI_SCRIPT [options]

Prepare an x86-64 Ubuntu host for an Intel accelerator; which one is detected from USB id 03e7:2485
(NCS2), /dev/accel/accel0 or the NPU's PCI id, or the CPU model ("Core(TM) Ultra"), or --device.

NCS2 (MYRIAD):
  * OpenVINO $OV_NCS2_VERSION LTS: the 2022.3 releases are the last with the MYRIAD plugin, and the plugin
    was never in the PyPI wheels (license): it comes from Intel's archive, unpacked to
    $OV_NCS2_DIR, its libraries registered in $OV_LDCONF and its Python bindings put
    on the venv's path by $OV_PTH_NAME
  * Python 3.10 (2022.3 has no bindings for 3.11+; Ubuntu 22.04's python3 is 3.10), numpy<1.25
  * the udev rules $MYRIAD_RULES (03e7:2150/2485/f63b, mode 0666, group users)
NPU (Core Ultra):
  * OpenVINO >= 2024 from PyPI (edgeinfer[openvino]) and Intel's NPU driver (${NPU_DRIVER_PKGS[*]},
    level-zero): from github.com/intel/linux-npu-driver/releases, installed from --npu-driver-debs DIR
  * the kernel driver intel_vpu (Linux >= 6.3, in-tree) that makes /dev/accel/accel0
  * the udev rule $NPU_RULES (group render, mode 0660) and the render group

Options:
  --device KIND           auto (default), ncs2 or npu
  --venv DIR              venv location (default $EI_DEFAULT_VENV)
  --package SPEC          what pip installs as edgeinfer (default: this checkout, else "edgeinfer")
  --python PATH           interpreter for the venv (default /usr/bin/python3; NCS2 needs 3.10)
  --openvino-archive SRC  NCS2: the OpenVINO $OV_NCS2_VERSION archive, a local .tgz or a URL
                          (default: Intel's Ubuntu 20 archive URL)
  --openvino-sha256 HEX   NCS2: expected sha256 of that archive (checked before unpacking)
  --npu-driver-debs DIR   NPU: a directory with the driver release's .deb files (and level-zero's)
  --user NAME             also give NAME device access (users / render); default: the sudo user
  --upgrade               reinstall edgeinfer and its extras even when present
EOF
    ei_common_help
}

DEVICE=auto
VENV=$EI_DEFAULT_VENV
PACKAGE=""
PYTHON=""
OV_ARCHIVE=$OV_NCS2_URL
OV_SHA256=""
NPU_DEBS=""
USER_NAME=""
UPGRADE=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --device)
            DEVICE=$(ei_optarg "$@")
            [[ "$DEVICE" =~ ^(auto|ncs2|npu)$ ]] || ei_usage_error "--device takes auto, ncs2 or npu"
            shift 2 ;;
        --venv) VENV=$(ei_optarg "$@"); shift 2 ;;
        --package) PACKAGE=$(ei_optarg "$@"); shift 2 ;;
        --python) PYTHON=$(ei_optarg "$@"); shift 2 ;;
        --openvino-archive) OV_ARCHIVE=$(ei_optarg "$@"); shift 2 ;;
        --openvino-sha256)
            OV_SHA256=$(ei_optarg "$@")
            [[ "$OV_SHA256" =~ ^[0-9a-fA-F]{64}$ ]] || ei_usage_error "--openvino-sha256 takes 64 hex digits"
            shift 2 ;;
        --npu-driver-debs) NPU_DEBS=$(ei_optarg "$@"); shift 2 ;;
        --user) USER_NAME=$(ei_optarg "$@"); shift 2 ;;
        --upgrade) UPGRADE=1; shift ;;
        *) ei_common_option "$@" || ei_usage_error "unknown option: $1"; shift "$EI_SHIFT" ;;
    esac
done
[[ "$VENV" == /* ]] || ei_usage_error "--venv must be an absolute path"
ei_require_root
USER_NAME=${USER_NAME:-$(ei_default_user)}
PACKAGE=${PACKAGE:-$(ei_default_package)}

# ------------------------------------------------------------------------------------------ detect

ei_detect "$VENV"
arch=$(ei_dpkg_arch)
[[ "$arch" == amd64 ]] || ei_die "this script is for x86-64 hosts; found architecture '${arch:-unknown}'" \
    "($EI_FAMILY, $EI_MODEL)"

ncs2=0
npu=0
ei_has_ncs2 && ncs2=1
if ei_has_npu || ei_cpu_has_npu; then npu=1; fi
ei_check_line "ncs2: $( ((ncs2)) && echo found || echo none); npu: $( ((npu)) && echo found || echo none) (cpu: $(ei_cpu_model))"
if ei_has_ncs1; then
    ei_warn "a first-generation Neural Compute Stick (03e7:2150, Myriad 2) is attached: OpenVINO dropped it" \
        "in 2021; only the NCS2 (Myriad X) is supported"
fi

if [[ "$DEVICE" == auto ]]; then
    case "$EI_FAMILY" in
        intel-ncs2) DEVICE=ncs2 ;;
        intel-npu) DEVICE=npu ;;
    esac
    if ((ncs2 && npu)); then
        ei_die "both an NCS2 and an NPU are present; they need different OpenVINO releases (2022.3 vs" \
            ">= 2024) in one venv: choose with --device ncs2 or --device npu"
    fi
    if [[ "$DEVICE" == auto ]]; then
        ei_die "no NCS2 (USB 03e7:2485) or NPU (/dev/accel/accel0, Core Ultra CPU) found (detected:" \
            "$EI_FAMILY, $EI_MODEL); plug the device in, or pass --device ncs2|npu to prepare anyway"
    fi
fi
ei_check_line "preparing for: $DEVICE"

SYS_PYVER=$(ei_default_python_version)
if [[ -n "$PYTHON" ]]; then
    [[ "$PYTHON" =~ python([0-9]+\.[0-9]+)$ ]] ||
        ei_usage_error "--python must name a versioned interpreter, e.g. /usr/bin/python3.10"
    PYVER=${BASH_REMATCH[1]}
else
    PYVER=${SYS_PYVER:-3.10}
    PYTHON=/usr/bin/python$PYVER
fi
ei_version_ge "$PYVER" 3.10 || ei_die "edgeinfer needs Python >= 3.10; $PYTHON is $PYVER"
if [[ "$PYVER" == "$SYS_PYVER" ]]; then venv_pkg=python3-venv; else venv_pkg=python$PYVER-venv; fi
site=$(ei_venv_site "$VENV" "$PYVER")

# -------------------------------------------------------------------------------------------- ncs2

setup_ncs2() {
    if [[ "$PYVER" != 3.10 ]]; then
        ei_die "OpenVINO $OV_NCS2_VERSION has Python bindings up to 3.10 and edgeinfer needs >= 3.10, so the" \
            "NCS2 needs Python 3.10 ($PYTHON is $PYVER): use Ubuntu 22.04, or install python3.10 and" \
            "pass --python /usr/bin/python3.10"
    fi
    ei_apt_install "$venv_pkg" python3-pip ca-certificates curl libusb-1.0-0 libtbb2 usbutils

    ei_write_file "$MYRIAD_RULES" 0644 <<'EOF'
SUBSYSTEM=="usb", ATTRS{idProduct}=="2150", ATTRS{idVendor}=="03e7", GROUP="users", MODE="0666", ENV{ID_MM_DEVICE_IGNORE}="1"
SUBSYSTEM=="usb", ATTRS{idProduct}=="2485", ATTRS{idVendor}=="03e7", GROUP="users", MODE="0666", ENV{ID_MM_DEVICE_IGNORE}="1"
SUBSYSTEM=="usb", ATTRS{idProduct}=="f63b", ATTRS{idVendor}=="03e7", GROUP="users", MODE="0666", ENV{ID_MM_DEVICE_IGNORE}="1"
EOF
    ei_ensure_group users
    [[ -z "$USER_NAME" ]] || ei_ensure_membership "$USER_NAME" users
    ei_run_live udevadm control --reload-rules
    ei_run_live udevadm trigger --subsystem-match=usb --attr-match=idVendor=03e7

    # The archive: unpacked once; its setupvars.sh marks a complete unpack.
    if ei_exists "$OV_NCS2_DIR/setupvars.sh"; then
        ei_ok "OpenVINO $OV_NCS2_VERSION unpacked in $OV_NCS2_DIR"
    else
        [[ -n "$OV_SHA256" ]] || ei_warn "no --openvino-sha256 given: the archive's integrity is not checked"
        ei_note_change fetch "$OV_ARCHIVE${OV_SHA256:+ (sha256 $OV_SHA256)}"
        ei_note_change extract "$OV_ARCHIVE -> $OV_NCS2_DIR"
        if ((EI_DRY_RUN == 0)); then
            local tmp src
            tmp=$(mktemp -d)
            if [[ "$OV_ARCHIVE" == http://* || "$OV_ARCHIVE" == https://* ]]; then
                ei_have curl || ei_die "curl is needed to download $OV_ARCHIVE"
                curl -fSL --retry 3 -o "$tmp/openvino.tgz" "$OV_ARCHIVE" ||
                    { rm -rf "$tmp"; ei_die "could not download $OV_ARCHIVE (pass --openvino-archive FILE)"; }
                src=$tmp/openvino.tgz
            else
                [[ -f "$OV_ARCHIVE" ]] || { rm -rf "$tmp"; ei_die "--openvino-archive $OV_ARCHIVE: no such file"; }
                src=$OV_ARCHIVE
            fi
            if [[ -n "$OV_SHA256" ]] && ! printf '%s  %s\n' "${OV_SHA256,,}" "$src" | sha256sum -c --quiet -; then
                rm -rf "$tmp"
                ei_die "$OV_ARCHIVE does not match --openvino-sha256"
            fi
            mkdir -p "$tmp/x" "$(dirname "$(ei_path "$OV_NCS2_DIR")")"
            tar -xzf "$src" -C "$tmp/x" --strip-components=1 ||
                { rm -rf "$tmp"; ei_die "cannot unpack $OV_ARCHIVE (not a .tgz?)"; }
            [[ -f "$tmp/x/setupvars.sh" ]] || { rm -rf "$tmp"; ei_die "$OV_ARCHIVE is not an OpenVINO archive"; }
            rm -rf "$(ei_path "$OV_NCS2_DIR")"
            mv "$tmp/x" "$(ei_path "$OV_NCS2_DIR")"
            rm -rf "$tmp"
        fi
    fi
    local pydir=$OV_NCS2_DIR/python/python$PYVER
    if ((EI_DRY_RUN == 0)) && ! ei_exists "$pydir/openvino"; then
        ei_die "$pydir/openvino is missing: this OpenVINO archive has no bindings for Python $PYVER"
    fi
    if ((EI_DRY_RUN == 0)) && ! ls "$(ei_path "$OV_NCS2_DIR")"/runtime/lib/intel64/libopenvino_intel_myriad_plugin.so >/dev/null 2>&1; then
        ei_die "$OV_NCS2_DIR has no MYRIAD plugin (runtime/lib/intel64/libopenvino_intel_myriad_plugin.so)"
    fi

    # System-wide library path, so the service needs no LD_LIBRARY_PATH or setupvars.sh.
    local before=$EI_CHANGES
    ei_write_file "$OV_LDCONF" 0644 < <(
        printf '%s\n' "$OV_NCS2_DIR/runtime/lib/intel64" "$OV_NCS2_DIR/runtime/3rdparty/tbb/lib")
    if ((EI_CHANGES != before)); then
        if [[ -n "$EI_ROOT" ]]; then ei_run_host ldconfig -r "$EI_ROOT"; else ei_run ldconfig; fi
    fi

    ei_venv_create "$VENV" "$PYTHON" 0
    ei_write_file "$site/$OV_PTH_NAME" 0644 <<<"$pydir"
    # A PyPI openvino in the venv would shadow the archive's bindings (and has no MYRIAD).
    if ei_venv_dist_version "$VENV" "$PYVER" openvino >/dev/null; then
        ei_run "$VENV/bin/python" -m pip uninstall -y openvino
    fi
    # Not the [openvino] extra: it pulls openvino>=2024 from PyPI. numpy<1.25 is what 2022.3 supports.
    EI_PIP_REQUIRED_DISTS="paho_mqtt"
    ei_pip_install "$VENV" "$PYVER" "$UPGRADE" "${PACKAGE}[fleet]" "numpy>=1.23,<1.25"

    if ((EI_DRY_RUN == 0)) && [[ -z "$EI_ROOT" && -x "$VENV/bin/python" ]]; then
        ei_check "OpenVINO devices" "$VENV/bin/python" -c \
            'from openvino.runtime import Core, get_version; d = Core().available_devices; print(get_version(), d); assert "MYRIAD" in d, "no MYRIAD device"' ||
            ei_warn "OpenVINO does not list MYRIAD: replug the stick (udev rules apply to new devices)," \
                "and check 'lsusb -d 03e7:'"
    fi
}

# --------------------------------------------------------------------------------------------- npu

setup_npu() {
    local release kernel
    release=$(ei_os_release VERSION_ID)
    case "$release" in
        22.04 | 24.04) ;;
        *) ei_warn "Intel publishes NPU driver packages for Ubuntu 22.04 and 24.04; this is '${release:-unknown}'" ;;
    esac
    kernel=$(ei_read_line /proc/sys/kernel/osrelease || true)
    if [[ -n "$kernel" ]] && ! ei_version_ge "${kernel%%-*}" 6.3; then
        ei_warn "kernel $kernel has no intel_vpu driver (needs >= 6.3; Ubuntu 24.04's 6.8 has it)"
    fi
    if ei_exists /sys/module/intel_vpu; then
        ei_check_line "kernel driver intel_vpu: loaded"
    else
        ei_check_line "kernel driver intel_vpu: not loaded"
    fi
    ei_check_line "device node /dev/accel/accel0: $(ei_exists /dev/accel/accel0 && echo present || echo absent)"

    ei_apt_install "$venv_pkg" python3-pip ca-certificates libtbb12 pciutils

    local p missing=()
    for p in "${NPU_DRIVER_PKGS[@]}"; do ei_pkg_installed "$p" || missing+=("$p"); done
    if ! ei_pkg_installed level-zero && ! ei_pkg_installed libze1; then missing+=(level-zero); fi
    if ((${#missing[@]} == 0)); then
        ei_ok "NPU driver packages installed: ${NPU_DRIVER_PKGS[*]} + level-zero"
    elif [[ -n "$NPU_DEBS" ]]; then
        local debs=()
        shopt -s nullglob
        debs=("$(ei_path "$NPU_DEBS")"/*.deb)
        shopt -u nullglob
        ((${#debs[@]})) || ei_die "--npu-driver-debs $NPU_DEBS: no .deb files there$([[ -n "$EI_ROOT" ]] && printf ' (a path inside --root)')"
        debs=("${debs[@]#"$EI_ROOT"}")
        ei_run dpkg -i "${debs[@]}"
        # dpkg -i leaves dependencies to apt.
        ei_run env DEBIAN_FRONTEND=noninteractive apt-get install -f -y --no-install-recommends
    else
        ei_incomplete "the Intel NPU driver is not installed (missing: ${missing[*]}). Download the release" \
            "for this Ubuntu from https://github.com/intel/linux-npu-driver/releases (and level-zero from" \
            "https://github.com/oneapi-src/level-zero/releases), then re-run with --npu-driver-debs DIR"
    fi

    ei_write_file "$NPU_RULES" 0644 <<'EOF'
SUBSYSTEM=="accel", KERNEL=="accel*", GROUP="render", MODE="0660"
EOF
    ei_ensure_group render
    [[ -z "$USER_NAME" ]] || ei_ensure_membership "$USER_NAME" render
    ei_run_live udevadm control --reload-rules
    ei_run_live udevadm trigger --subsystem-match=accel

    ei_venv_create "$VENV" "$PYTHON" 0
    if ei_exists "$site/$OV_PTH_NAME"; then
        # Left by an NCS2 setup: the 2022.3 bindings would shadow OpenVINO >= 2024.
        ei_note_change remove "$site/$OV_PTH_NAME"
        ((EI_DRY_RUN)) || rm -f "$(ei_path "$site/$OV_PTH_NAME")"
    fi
    local ov_version
    ov_version=$(ei_venv_dist_version "$VENV" "$PYVER" openvino || true)
    if [[ -n "$ov_version" ]] && ! ei_version_ge "$ov_version" 2024.0; then
        ei_check_line "venv openvino $ov_version: too old for the NPU (needs >= 2024.0)"
        UPGRADE=1
    fi
    EI_PIP_REQUIRED_DISTS="openvino paho_mqtt"
    ei_pip_install "$VENV" "$PYVER" "$UPGRADE" "${PACKAGE}[openvino,fleet]"

    if ((EI_DRY_RUN == 0)) && [[ -z "$EI_ROOT" && -x "$VENV/bin/python" ]]; then
        ei_check "OpenVINO devices" "$VENV/bin/python" -c \
            'import openvino as ov; d = ov.Core().available_devices; print(ov.get_version(), d); assert "NPU" in d, "no NPU device"' ||
            ei_warn "OpenVINO does not list the NPU: check 'ls -l /dev/accel/accel0' (group render)," \
                "'dmesg | grep intel_vpu', and that the driver packages match the kernel"
    fi
}

case "$DEVICE" in
    ncs2) setup_ncs2 ;;
    npu) setup_npu ;;
esac

ei_summary
