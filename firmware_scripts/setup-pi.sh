#!/usr/bin/env bash
# setup-pi.sh: prepare a Raspberry Pi (Raspberry Pi OS Bookworm) for edgeinfer: system packages,
# the camera stack, a venv with edgeinfer, and for a Coral Edge TPU the Coral apt repository,
# libedgetpu and the udev rule. Idempotent; see docs/provisioning.md.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

CORAL_REPO_URL=https://packages.cloud.google.com/apt
CORAL_KEY_URL=https://packages.cloud.google.com/apt/doc/apt-key.gpg
CORAL_KEYRING=/etc/apt/keyrings/coral-edgetpu.gpg
CORAL_LIST=/etc/apt/sources.list.d/coral-edgetpu.list
CORAL_RULES=/etc/udev/rules.d/71-edgeinfer-coral.rules

usage() {
    cat <<EOF
Usage: $EI_SCRIPT [options]

Prepare a Raspberry Pi 4/5 running Raspberry Pi OS Bookworm (64-bit recommended) for edgeinfer.

  * apt packages: python3-venv, python3-pip, ca-certificates, curl, gnupg, usbutils
  * camera stack: python3-picamera2, python3-libcamera, rpicam-apps-lite, v4l-utils (--no-camera skips)
  * a venv (default $EI_DEFAULT_VENV) made with --system-site-packages, so the apt-installed
    picamera2/libcamera bindings import; Bookworm's system Python is 3.11
  * edgeinfer with the [tflite,fleet] extras, or [coral,fleet] plus numpy<2 for a Coral
  * a Coral (USB 1a6e:089a / 18d1:9302, or PCIe 1ac1:089a; found automatically, or --coral yes):
    the Coral apt repository ($CORAL_REPO_URL coral-edgetpu-stable, key in
    $CORAL_KEYRING via signed-by), libedgetpu1-std (or libedgetpu1-max with --max-clock),
    the udev rule $CORAL_RULES, the plugdev group
  * a check that numpy and tflite_runtime are a working pair (tflite_runtime wheels need numpy<2)
  * a camera check (rpicam-hello --list-cameras)

Options:
  --venv DIR          venv location (default $EI_DEFAULT_VENV)
  --package SPEC      what pip installs as edgeinfer: a name, a wheel, a checkout
                      (default: this checkout when run from one, else "edgeinfer")
  --coral MODE        auto (default: when one is plugged in), yes (e.g. to prepare before plugging in), no
  --max-clock         libedgetpu1-max: full Edge TPU clock (faster, runs hot; replaces -std)
  --std-clock         libedgetpu1-std: reduced clock (the default; replaces -max when given explicitly)
  --user NAME         also give NAME device access (plugdev, video); default: the sudo user
  --no-camera         skip the camera stack and the camera check
  --upgrade           reinstall edgeinfer and its extras even when present
  --force             run on a machine not detected as a Pi, or on a release other than Bookworm
EOF
    ei_common_help
}

VENV=$EI_DEFAULT_VENV
PACKAGE=""
CORAL=auto
CLOCK=""
USER_NAME=""
CAMERA=1
UPGRADE=0
FORCE=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) VENV=$(ei_optarg "$@"); shift 2 ;;
        --package) PACKAGE=$(ei_optarg "$@"); shift 2 ;;
        --coral)
            CORAL=$(ei_optarg "$@")
            [[ "$CORAL" =~ ^(auto|yes|no)$ ]] || ei_usage_error "--coral takes auto, yes or no"
            shift 2 ;;
        --max-clock) CLOCK=max; shift ;;
        --std-clock) CLOCK=std; shift ;;
        --user) USER_NAME=$(ei_optarg "$@"); shift 2 ;;
        --no-camera) CAMERA=0; shift ;;
        --upgrade) UPGRADE=1; shift ;;
        --force) FORCE=1; shift ;;
        *) ei_common_option "$@" || ei_usage_error "unknown option: $1"; shift "$EI_SHIFT" ;;
    esac
done
[[ "$VENV" == /* ]] || ei_usage_error "--venv must be an absolute path"
ei_require_root
USER_NAME=${USER_NAME:-$(ei_default_user)}
PACKAGE=${PACKAGE:-$(ei_default_package)}

# ------------------------------------------------------------------------------------------ detect

ei_detect "$VENV"
ei_expect_family pi "a Raspberry Pi"

codename=$(ei_os_release VERSION_CODENAME)
if [[ "$codename" != bookworm ]]; then
    ((FORCE)) || ei_die "this script targets Raspberry Pi OS Bookworm, found '${codename:-unknown}'" \
        "(/etc/os-release); --force to try anyway"
    ei_warn "release '${codename:-unknown}' is not Bookworm; going on because of --force"
fi

arch=$(ei_dpkg_arch)
case "$arch" in
    arm64) ;;
    armhf) ei_warn "32-bit Raspberry Pi OS: LiteRT/tflite_runtime wheels are published for 64-bit ARM;" \
        "pip will fall back to piwheels or fail. The 64-bit OS is recommended." ;;
    *) ei_warn "unexpected architecture '${arch:-unknown}' for a Raspberry Pi" ;;
esac

PYVER=$(ei_default_python_version)
[[ -n "$PYVER" ]] || PYVER=3.11
ei_check_line "system python: $PYVER (Bookworm ships 3.11)"

coral_usb=0
coral_pcie=0
ei_has_coral_usb && coral_usb=1
ei_has_coral_pcie && coral_pcie=1
case "$CORAL" in
    yes) want_coral=1 ;;
    no) want_coral=0 ;;
    *) want_coral=$((coral_usb || coral_pcie)) ;;
esac
ei_check_line "coral: usb=$( ((coral_usb)) && echo found || echo none) pcie=$( ((coral_pcie)) && echo found || echo none) -> $( ((want_coral)) && echo install || echo skip)"

if ((want_coral)); then
    if [[ -z "$CLOCK" ]]; then
        # Keep the clock a person chose before; a plain re-run must not undo --max-clock.
        if ei_pkg_installed libedgetpu1-max; then CLOCK=max; else CLOCK=std; fi
    fi
    EDGETPU_PKG=libedgetpu1-$CLOCK
fi

# ---------------------------------------------------------------------------------------- packages

base_pkgs=(python3-venv python3-pip ca-certificates curl gnupg usbutils)
camera_pkgs=()
((CAMERA)) && camera_pkgs=(python3-picamera2 python3-libcamera rpicam-apps-lite v4l-utils)
ei_apt_install "${base_pkgs[@]}" "${camera_pkgs[@]}"

# --------------------------------------------------------------------------------------- coral

if ((want_coral)); then
    ei_mkdir /etc/apt/keyrings 0755
    ei_fetch_keyring "$CORAL_KEY_URL" "$CORAL_KEYRING"
    before=$EI_CHANGES
    ei_write_file "$CORAL_LIST" 0644 <<<"deb [signed-by=$CORAL_KEYRING] $CORAL_REPO_URL coral-edgetpu-stable main"
    ((EI_CHANGES == before)) || ei_apt_sources_changed

    if [[ "$CLOCK" == max ]]; then
        ei_warn "libedgetpu1-max runs the Edge TPU at its full clock: the USB Accelerator can get hot" \
            "enough to burn skin; give it airflow"
        # The -max package asks to confirm that in a debconf prompt; answer it up front so an
        # unattended install does not stop (keys as used by the package's maintainer scripts).
        if ! ei_pkg_installed libedgetpu1-max; then
            ei_write_file /var/cache/edgeinfer/libedgetpu1-max.debconf 0644 <<'EOF'
libedgetpu1-max libedgetpu/accepted-eula boolean true
libedgetpu1-max libedgetpu/install-confirm-max boolean true
EOF
            ei_run debconf-set-selections /var/cache/edgeinfer/libedgetpu1-max.debconf
        fi
    fi
    # libedgetpu1-std and -max conflict: installing one replaces the other.
    ei_apt_install "$EDGETPU_PKG"

    # libedgetpu's package ships an equivalent rule; this one also covers a libedgetpu built from
    # source, and the PCIe/M.2 module's apex device node.
    ei_write_file "$CORAL_RULES" 0644 <<'EOF'
# Coral Edge TPU, written by edgeinfer's setup-pi.sh.
# USB Accelerator before (1a6e:089a) and after (18d1:9302) libedgetpu loads its firmware.
SUBSYSTEM=="usb", ATTRS{idVendor}=="1a6e", ATTRS{idProduct}=="089a", MODE="0664", GROUP="plugdev"
SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", ATTRS{idProduct}=="9302", MODE="0664", GROUP="plugdev"
# PCIe / M.2 module (gasket/apex driver).
SUBSYSTEM=="apex", MODE="0660", GROUP="plugdev"
EOF
    ei_ensure_group plugdev
    if ((coral_pcie)); then
        ei_warn "a PCIe/M.2 Coral needs the gasket/apex kernel driver, which this script does not build:" \
            "the Coral repository's gasket-dkms does not build on current Raspberry Pi kernels, and a Pi 5" \
            "also needs 4K pages and 32-bit DMA (see docs/provisioning.md). USB Accelerators need nothing more."
    fi
fi

device_groups=(video)
((want_coral)) && device_groups=(plugdev video)
if [[ -n "$USER_NAME" ]]; then
    ei_ensure_membership "$USER_NAME" "${device_groups[@]}"
fi
# Rules take effect for devices plugged in after a reload, or at once with a trigger.
if ((want_coral)); then
    ei_run_live udevadm control --reload-rules
    ei_run_live udevadm trigger --subsystem-match=usb --attr-match=idVendor=1a6e
    ei_run_live udevadm trigger --subsystem-match=usb --attr-match=idVendor=18d1
fi

# ------------------------------------------------------------------------------------------- venv

ei_venv_create "$VENV" /usr/bin/python3 1
if ((want_coral)); then
    extras=coral,fleet
    # tflite_runtime wheels are built against numpy 1.x: numpy 2 makes them fail to import.
    pip_args=("${PACKAGE}[${extras}]" "numpy<2")
    EI_PIP_REQUIRED_DISTS="tflite_runtime paho_mqtt"
else
    extras=tflite,fleet
    pip_args=("${PACKAGE}[${extras}]")
    EI_PIP_REQUIRED_DISTS="ai_edge_litert paho_mqtt"
fi
ei_pip_install "$VENV" "$PYVER" "$UPGRADE" "${pip_args[@]}"

# ------------------------------------------------------------------------- numpy / tflite_runtime

numpy_version=$(ei_venv_dist_version "$VENV" "$PYVER" numpy || true)
tflite_version=$(ei_venv_dist_version "$VENV" "$PYVER" tflite_runtime || true)
if [[ -n "$tflite_version" && -n "$numpy_version" ]]; then
    if [[ "${numpy_version%%.*}" -ge 2 ]]; then
        ei_check_line "numpy/tflite_runtime pairing: numpy $numpy_version with tflite_runtime $tflite_version: broken (tflite_runtime needs numpy<2)"
        ei_run "$VENV/bin/python" -m pip install --disable-pip-version-check "numpy<2"
    else
        ei_check_line "numpy/tflite_runtime pairing: numpy $numpy_version with tflite_runtime $tflite_version: ok"
    fi
elif [[ -n "$tflite_version" || -n "$numpy_version" ]]; then
    ei_check_line "numpy/tflite_runtime pairing: numpy ${numpy_version:-absent}, tflite_runtime ${tflite_version:-absent}"
fi

# The import check runs the venv's interpreter; a dry run only plans the install it would check.
if ((EI_DRY_RUN == 0)) && [[ -z "$EI_ROOT" ]] && [[ -x "$VENV/bin/python" ]]; then
    if ((want_coral)); then
        check_code='import numpy, tflite_runtime.interpreter as t
print("numpy", numpy.__version__, "tflite_runtime", getattr(t, "__version__", "?"))
assert int(numpy.__version__.split(".")[0]) < 2, "tflite_runtime needs numpy<2"'
        ei_check "import numpy + tflite_runtime" "$VENV/bin/python" -c "$check_code" ||
            ei_die "numpy/tflite_runtime do not import together in $VENV; run: $VENV/bin/pip install 'numpy<2'"
        if ((coral_usb || coral_pcie)); then
            delegate_code='import tflite_runtime.interpreter as t; t.load_delegate("libedgetpu.so.1"); print("Edge TPU delegate loaded")'
            ei_check "Edge TPU delegate" "$VENV/bin/python" -c "$delegate_code" ||
                ei_warn "libedgetpu did not load the Edge TPU: replug the Accelerator (udev rules apply to" \
                    "new devices), check 'lsusb -d 18d1:' / 'lsusb -d 1a6e:', and that this user is in plugdev"
        fi
    else
        ei_check "import numpy + ai_edge_litert" "$VENV/bin/python" -c \
            'import numpy, ai_edge_litert.interpreter; print("numpy", numpy.__version__)' ||
            ei_die "LiteRT does not import in $VENV; see the output above"
    fi
    ei_check "edgeinfer in the venv" "$VENV/bin/edgeinfer" --version || ei_die "edgeinfer is not runnable in $VENV"
fi

# ----------------------------------------------------------------------------------------- camera

if ((CAMERA)); then
    config=""
    for f in /boot/firmware/config.txt /boot/config.txt; do
        if ei_exists "$f"; then config=$f; break; fi
    done
    if [[ -n "$config" ]]; then
        if grep -Eq '^[[:space:]]*camera_auto_detect=0' "$(ei_path "$config")" &&
            ! grep -Eq '^[[:space:]]*dtoverlay=(imx|ov)[0-9]' "$(ei_path "$config")"; then
            ei_warn "$config has camera_auto_detect=0 and no camera dtoverlay: a CSI camera will not be found"
        else
            ei_check_line "camera config ($config): auto-detect or an overlay is set"
        fi
    fi
    if ei_have rpicam-hello || [[ -n "$EI_ROOT" ]]; then
        # rpicam-hello exits 0 with "No cameras available!", so look for the list itself.
        ei_check "camera (rpicam-hello --list-cameras)" \
            sh -c 'rpicam-hello --list-cameras 2>&1 | grep -A4 "Available cameras"' ||
            ei_warn "no camera answered; USB webcams still work through V4L2 (/dev/video*)"
    elif ((EI_DRY_RUN == 0)); then
        ei_warn "rpicam-hello is not installed; camera not checked"
    fi
fi

ei_summary
