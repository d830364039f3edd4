#!/usr/bin/env bash
# setup-jetson.sh: prepare an NVIDIA Jetson (JetPack 5 = L4T R35, JetPack 6 = L4T R36) for edgeinfer:
# a venv that sees the system TensorRT Python bindings, the power mode / clocks a person chose, and a
# GStreamer camera check. Idempotent; see docs/provisioning.md.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

TRT_PTH_NAME=edgeinfer-system-tensorrt.pth
CLOCKS_UNIT=/etc/systemd/system/edgeinfer-jetson-clocks.service

usage() {
    cat <<EOF
Usage: $EI_SCRIPT [options]

Prepare a Jetson flashed with JetPack 5 (L4T R35, Ubuntu 20.04) or JetPack 6 (L4T R36, Ubuntu 22.04).
The L4T release is read from /etc/nv_tegra_release.

  * apt packages: python3-venv, python3-pip, gstreamer1.0-tools, v4l-utils, and on JetPack 6
    python3-libnvinfer (TensorRT's Python bindings, normally already there with nvidia-jetpack)
  * a venv (default $EI_DEFAULT_VENV) with edgeinfer[onnx,fleet] and numpy<2. TensorRT is not
    installed from PyPI (no Jetson wheels there): the venv sees the system bindings through
    $TRT_PTH_NAME, a .pth file naming the system dist-packages directory that holds
    tensorrt (/usr/lib/python3.10/dist-packages on JetPack 6), or with --trt-link
    system-site-packages through the venv's include-system-site-packages
  * JetPack 5: its Python is 3.8 and edgeinfer needs >= 3.10, so the venv uses a python3.10+ you
    installed (found under /usr/bin, or --python); TensorRT's JetPack 5 bindings are built for 3.8 only
    and cannot be exposed to that venv (edgeinfer then uses ONNX Runtime on the CPU)
  * --power-mode N: nvpmodel -m N (validated against /etc/nvpmodel.conf; some modes need a reboot)
  * --max-clocks: jetson_clocks now, and at every boot through $CLOCKS_UNIT
  * a camera check: the nvarguscamerasrc GStreamer element, and one frame from a CSI camera

Options:
  --venv DIR              venv location (default $EI_DEFAULT_VENV)
  --package SPEC          what pip installs as edgeinfer (default: this checkout, else "edgeinfer")
  --python PATH           interpreter for the venv (default: the system python3, or on JetPack 5 the
                          newest python3.N >= 3.10 under /usr/bin)
  --trt-link MODE         pth (default) or system-site-packages
  --power-mode N          nvpmodel power mode id (e.g. 0 = MAXN on most modules)
  --max-clocks            pin clocks to their maximum now and at boot (jetson_clocks)
  --upgrade               reinstall edgeinfer and its extras even when present
  --force                 run on a machine not detected as a Jetson
EOF
    ei_common_help
}

VENV=$EI_DEFAULT_VENV
PACKAGE=""
PYTHON=""
TRT_LINK=pth
POWER_MODE=""
MAX_CLOCKS=0
UPGRADE=0
FORCE=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) VENV=$(ei_optarg "$@"); shift 2 ;;
        --package) PACKAGE=$(ei_optarg "$@"); shift 2 ;;
        --python) PYTHON=$(ei_optarg "$@"); shift 2 ;;
        --trt-link)
            TRT_LINK=$(ei_optarg "$@")
            [[ "$TRT_LINK" =~ ^(pth|system-site-packages)$ ]] ||
                ei_usage_error "--trt-link takes pth or system-site-packages"
            shift 2 ;;
        --power-mode)
            POWER_MODE=$(ei_optarg "$@")
            [[ "$POWER_MODE" =~ ^[0-9]+$ ]] || ei_usage_error "--power-mode takes a mode id (a number)"
            shift 2 ;;
        --max-clocks) MAX_CLOCKS=1; shift ;;
        --upgrade) UPGRADE=1; shift ;;
        --force) FORCE=1; shift ;;
        *) ei_common_option "$@" || ei_usage_error "unknown option: $1"; shift "$EI_SHIFT" ;;
    esac
done
[[ "$VENV" == /* ]] || ei_usage_error "--venv must be an absolute path"
ei_require_root
PACKAGE=${PACKAGE:-$(ei_default_package)}

# ------------------------------------------------------------------------------------------ detect

ei_detect "$VENV"
ei_expect_family jetson "a Jetson"

ei_l4t_release || ei_die "no readable /etc/nv_tegra_release under '${EI_ROOT:-/}': cannot tell the L4T" \
    "release (flash the device with JetPack 5 or 6 from NVIDIA's SDK Manager)"
case "$EI_L4T_MAJOR" in
    35) JETPACK=5 ;;
    36) JETPACK=6 ;;
    32) ei_die "L4T R$EI_L4T is JetPack 4 (Python 3.6, TensorRT 8.2): not supported; flash JetPack 5 or 6" ;;
    *) ei_die "L4T R$EI_L4T is not a release this script knows (R35 = JetPack 5, R36 = JetPack 6)" ;;
esac
ei_check_line "L4T R$EI_L4T -> JetPack $JETPACK ($(ei_os_release PRETTY_NAME))"

# ------------------------------------------------------------------------------------------ python

SYS_PYVER=$(ei_default_python_version)
if [[ -n "$PYTHON" ]]; then
    if [[ "$PYTHON" =~ python([0-9]+\.[0-9]+)$ ]]; then
        PYVER=${BASH_REMATCH[1]}
    else
        ei_usage_error "--python must name a versioned interpreter, e.g. /usr/bin/python3.10"
    fi
    ei_exists "$PYTHON" || ((EI_DRY_RUN)) || ei_die "--python $PYTHON: not found under '${EI_ROOT:-/}'"
elif ((JETPACK == 5)); then
    # Ubuntu 20.04's python3 is 3.8; take a 3.10+ the person installed (e.g. from deadsnakes).
    PYVER=$(ei_system_python_version)
    if [[ -z "$PYVER" ]] || ! ei_version_ge "$PYVER" 3.10; then
        ei_die "JetPack 5's Python is ${SYS_PYVER:-3.8} but edgeinfer needs >= 3.10. Install one" \
            "(sudo add-apt-repository ppa:deadsnakes/ppa; sudo apt-get install python3.10 python3.10-venv)" \
            "and re-run, or pass --python. TensorRT's JetPack 5 Python bindings exist for 3.8 only:" \
            "for TensorRT from edgeinfer, use JetPack 6."
    fi
    PYTHON=/usr/bin/python$PYVER
else
    PYVER=${SYS_PYVER:-3.10}
    PYTHON=/usr/bin/python$PYVER
fi
ei_version_ge "$PYVER" 3.10 || ei_die "edgeinfer needs Python >= 3.10; $PYTHON is $PYVER"
ei_check_line "venv python: $PYTHON ($PYVER; the system python3 is ${SYS_PYVER:-unknown})"

# ---------------------------------------------------------------------------------------- packages

pkgs=(python3-pip gstreamer1.0-tools v4l-utils)
if [[ "$PYVER" == "$SYS_PYVER" ]]; then pkgs+=(python3-venv); else pkgs+=("python$PYVER-venv"); fi
((JETPACK == 6)) && pkgs+=(python3-libnvinfer)
ei_apt_install "${pkgs[@]}"
if ! ei_pkg_installed nvidia-l4t-gstreamer; then
    ei_warn "nvidia-l4t-gstreamer is not installed: no nvarguscamerasrc for CSI cameras (it is part of the" \
        "L4T BSP; reflash or 'apt-get install nvidia-l4t-gstreamer' from NVIDIA's L4T repository)"
fi

# ------------------------------------------------------------------------------------------- venv

# Where python3-libnvinfer put the bindings: a versioned dist-packages on JetPack (not on the
# default path of a venv). Look under the root; fall back to JetPack 6's known location.
trt_dir=""
if ((JETPACK == 6)) && [[ "$PYVER" == "$SYS_PYVER" ]]; then
    for d in "/usr/lib/python$PYVER/dist-packages" /usr/lib/python3/dist-packages \
        "/usr/local/lib/python$PYVER/dist-packages"; do
        if ei_exists "$d/tensorrt/__init__.py"; then trt_dir=$d; break; fi
    done
    if [[ -z "$trt_dir" ]]; then
        trt_dir=/usr/lib/python$PYVER/dist-packages
        ei_info "tensorrt bindings not found yet; python3-libnvinfer installs them into $trt_dir"
    fi
    ei_check_line "tensorrt python bindings: $trt_dir/tensorrt"
elif ((JETPACK == 5)); then
    ei_warn "JetPack 5: TensorRT's Python bindings are built for Python 3.8 and cannot load in a" \
        "$PYVER venv; edgeinfer will use ONNX Runtime (CPU) here. For TensorRT, use JetPack 6."
else
    ei_warn "TensorRT's Python bindings are built for the system Python $SYS_PYVER, not $PYVER: not exposed"
fi

system_site=0
[[ "$TRT_LINK" == system-site-packages && -n "$trt_dir" ]] && system_site=1
ei_venv_create "$VENV" "$PYTHON" "$system_site"

site=$(ei_venv_site "$VENV" "$PYVER")
if [[ -n "$trt_dir" && "$TRT_LINK" == pth ]]; then
    # A .pth line appends the directory after the venv's own site-packages: the venv's packages win
    # (its numpy over the system's), and tensorrt comes from the system.
    ei_write_file "$site/$TRT_PTH_NAME" 0644 <<<"$trt_dir"
elif ei_exists "$site/$TRT_PTH_NAME"; then
    ei_note_change remove "$site/$TRT_PTH_NAME"
    ((EI_DRY_RUN)) || rm -f "$(ei_path "$site/$TRT_PTH_NAME")"
fi

# The system TensorRT bindings are built against numpy 1.x; keep numpy<2 beside them.
EI_PIP_REQUIRED_DISTS="onnxruntime paho_mqtt"
ei_pip_install "$VENV" "$PYVER" "$UPGRADE" "${PACKAGE}[onnx,fleet]" "numpy<2"

if ((EI_DRY_RUN == 0)) && [[ -z "$EI_ROOT" && -n "$trt_dir" && -x "$VENV/bin/python" ]]; then
    ei_check "import tensorrt in the venv" "$VENV/bin/python" -c \
        'import tensorrt, numpy; print("tensorrt", tensorrt.__version__, "numpy", numpy.__version__)' ||
        ei_die "the venv cannot import tensorrt from $trt_dir; is python3-libnvinfer installed?"
fi

# ------------------------------------------------------------------------------- power and clocks

if [[ -n "$POWER_MODE" ]]; then
    conf=$(ei_path /etc/nvpmodel.conf)
    if [[ -r "$conf" ]]; then
        # "< POWER_MODEL ID=0 NAME=15W >" lines -> "0=15W"
        modes=$(sed -nE 's/^[[:space:]]*<[[:space:]]*POWER_MODEL[[:space:]]+ID=([0-9]+)[[:space:]]+NAME=([^[:space:]>]+).*/\1=\2/p' "$conf")
        mode_name=$(printf '%s\n' "$modes" | sed -n "s/^$POWER_MODE=//p" | head -n1)
        [[ -n "$mode_name" ]] ||
            ei_die "--power-mode $POWER_MODE is not defined in /etc/nvpmodel.conf (modes: $(printf '%s' "$modes" | tr '\n' ' '))"
        ei_check_line "power mode $POWER_MODE = $mode_name"
    else
        ei_warn "/etc/nvpmodel.conf not found; cannot validate --power-mode $POWER_MODE"
    fi
    current=""
    if [[ -z "$EI_ROOT" ]] && ei_have nvpmodel; then
        current=$(nvpmodel -q 2>/dev/null | tail -n1 | tr -d '[:space:]' || true)
    fi
    if [[ "$current" == "$POWER_MODE" ]]; then
        ei_ok "power mode is $POWER_MODE"
    else
        # nvpmodel asks on stdin whether to reboot when a mode changes the CPU cluster layout;
        # answering from /dev/null declines, and the mode applies at the next boot.
        ei_run_live nvpmodel -m "$POWER_MODE" </dev/null
        ei_info "power mode $POWER_MODE persists across reboots; some modes only apply after one"
    fi
fi

if ((MAX_CLOCKS)); then
    ei_write_file "$CLOCKS_UNIT" 0644 <<'EOF'
# Written by edgeinfer's setup-jetson.sh --max-clocks: jetson_clocks does not persist across boots.
[Unit]
Description=Pin Jetson clocks to their maximum (jetson_clocks) for edgeinfer
After=nvpmodel.service
Wants=nvpmodel.service

[Service]
Type=oneshot
ExecStart=/usr/bin/jetson_clocks
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
EOF
    if [[ -n "$EI_ROOT" ]]; then
        if ei_exists "/etc/systemd/system/multi-user.target.wants/${CLOCKS_UNIT##*/}"; then
            ei_ok "${CLOCKS_UNIT##*/} enabled"
        else
            ei_run_host systemctl --root="$EI_ROOT" enable "${CLOCKS_UNIT##*/}"
        fi
    else
        if systemctl is-enabled --quiet "${CLOCKS_UNIT##*/}" 2>/dev/null; then
            ei_ok "${CLOCKS_UNIT##*/} enabled"
        else
            ei_run systemctl daemon-reload
            ei_run systemctl enable "${CLOCKS_UNIT##*/}"
        fi
    fi
    ei_run_live jetson_clocks
    ei_warn "max clocks: more heat and power; make sure the module's fan/heatsink can take it"
fi

# ----------------------------------------------------------------------------------------- camera

plugin=""
for d in /usr/lib/aarch64-linux-gnu/gstreamer-1.0 /usr/lib/gstreamer-1.0; do
    if ei_exists "$d/libgstnvarguscamerasrc.so"; then plugin=$d/libgstnvarguscamerasrc.so; break; fi
done
ei_check_line "nvarguscamerasrc plugin: ${plugin:-not found}"
if [[ -z "$EI_ROOT" ]]; then
    ei_check "GStreamer element nvarguscamerasrc" gst-inspect-1.0 nvarguscamerasrc ||
        ei_warn "nvarguscamerasrc is missing: CSI cameras need nvidia-l4t-gstreamer; USB cameras work via V4L2"
    if ls /dev/video* >/dev/null 2>&1; then
        ei_check "one frame from the CSI camera (nvargus-daemon)" timeout 15 \
            gst-launch-1.0 -q nvarguscamerasrc num-buffers=1 ! fakesink ||
            ei_warn "no frame from nvarguscamerasrc: check the ribbon cable, 'systemctl status nvargus-daemon'," \
                "or use a USB camera (v4l2src)"
    else
        ei_check_line "camera: no /dev/video* device"
    fi
else
    ei_skip "check: GStreamer camera pipeline (needs the running system; not run with --root)"
fi

ei_summary
