#!/usr/bin/env bash
# install-agent.sh: install the edgeinfer agent as a hardened systemd service running as the system
# user "edgeinfer", with its config in /etc/edgeinfer/agent.yaml (never overwritten) and its data in
# /var/lib/edgeinfer. The service runs the agent's launcher, which starts the agent from one of two
# environment slots and goes back to the other when an agent update fails (the provisioned venv is the
# first slot). Run a setup-*.sh script first (it makes the venv). See docs/provisioning.md.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

UNIT_NAME=edgeinfer-agent.service
UNIT_PATH=/etc/systemd/system/$UNIT_NAME
UNIT_TEMPLATE=$HERE/edgeinfer-agent.service
DEFAULT_CONFIG_TEMPLATE=$HERE/agent.yaml
CONFIG=/etc/edgeinfer/agent.yaml
DATA_DIR=/var/lib/edgeinfer
# The agent's environment slots and their state (written by the agent: under its state directory) and the
# launcher that reads them (where the service cannot write: ProtectSystem=strict keeps /opt read-only to it,
# so no agent version can replace what brings the previous one back).
SLOTS_DIR=$DATA_DIR/agent
LAUNCHER=/opt/edgeinfer/launcher.py
LAUNCHER_SOURCE=$HERE/../edgeinfer/updates/launcher.py
SYSUSERS_CONF=/etc/sysusers.d/edgeinfer.conf
SERVICE_USER=edgeinfer

usage() {
    cat <<EOF
Usage: $EI_SCRIPT [options]

Install the edgeinfer agent as the systemd service $UNIT_NAME:
  * the system user and group "$SERVICE_USER" (declared in $SYSUSERS_CONF, created by
    systemd-sysusers; useradd where that is missing), home $DATA_DIR, no login shell
  * $DATA_DIR (0750, $SERVICE_USER) for the spool, command log and model slots, and
    $SLOTS_DIR for the agent's own environment slots (agent updates)
  * $LAUNCHER (0644, root): the agent's launcher, from the venv's edgeinfer (or this checkout's)
  * $CONFIG (0640, root:$SERVICE_USER): installed only if absent, from --config FILE or a
    default that talks to a broker on localhost; an existing file is never touched
  * $UNIT_PATH from the template edgeinfer-agent.service: the launcher runs the agent from the
    venv at first, Type=notify with WatchdogSec,
    Restart=on-failure (not after exit 78, a bad config), ProtectSystem=strict with
    ReadWritePaths=$DATA_DIR, NoNewPrivileges, PrivateTmp, ProtectHome, ProtectKernel*,
    RestrictAddressFamilies, an empty capability set, and SupplementaryGroups for the device nodes
    (plugdev: Coral USB/PCIe; video: cameras, Jetson GPU; render: Intel NPU) among those that exist
  * systemctl daemon-reload, enable, and (re)start when something changed; with --root only
    "systemctl --root=DIR enable" (the service starts at the image's first boot)

Options:
  --venv DIR          the venv a setup script made (default $EI_DEFAULT_VENV)
  --config FILE       initial configuration to install when $CONFIG does not exist yet
  --groups LIST       supplementary groups, comma-separated (default: from the detected device)
  --watchdog SEC      WatchdogSec (default 30); 0 turns the watchdog off and uses Type=exec
  --agent-trial SEC   seconds an updated agent has to report healthy before the launcher goes back
                      to the previous one (default 300)
  --no-systemctl      write the files only: no daemon-reload / enable / start
  --no-start          enable the service but do not start or restart it
EOF
    ei_common_help
}

VENV=$EI_DEFAULT_VENV
CONFIG_SOURCE=""
GROUPS_OPT=""
WATCHDOG=30
AGENT_TRIAL=300
SYSTEMCTL=1
START=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv) VENV=$(ei_optarg "$@"); shift 2 ;;
        --config) CONFIG_SOURCE=$(ei_optarg "$@"); shift 2 ;;
        --groups) GROUPS_OPT=$(ei_optarg "$@"); shift 2 ;;
        --watchdog)
            WATCHDOG=$(ei_optarg "$@")
            [[ "$WATCHDOG" =~ ^[0-9]+$ ]] || ei_usage_error "--watchdog takes a number of seconds"
            shift 2 ;;
        --agent-trial)
            AGENT_TRIAL=$(ei_optarg "$@")
            [[ "$AGENT_TRIAL" =~ ^[1-9][0-9]*$ ]] || ei_usage_error "--agent-trial takes a number of seconds above 0"
            shift 2 ;;
        --no-systemctl) SYSTEMCTL=0; shift ;;
        --no-start) START=0; shift ;;
        *) ei_common_option "$@" || ei_usage_error "unknown option: $1"; shift "$EI_SHIFT" ;;
    esac
done
[[ "$VENV" =~ ^/[A-Za-z0-9._/+-]+$ ]] || ei_usage_error "--venv must be an absolute path of letters, digits and ._/+-"
if [[ -n "$CONFIG_SOURCE" && ! -f "$CONFIG_SOURCE" ]]; then
    ei_usage_error "--config $CONFIG_SOURCE: no such file"
fi
[[ -f "$UNIT_TEMPLATE" ]] || ei_die "unit template $UNIT_TEMPLATE is missing"
ei_require_root

# ------------------------------------------------------------------------------------------ detect

ei_detect "$VENV"
if [[ -n "$GROUPS_OPT" ]]; then
    IFS=', ' read -r -a wanted_groups <<<"$GROUPS_OPT"
else
    # Device nodes the agent opens, by family: Coral USB/PCIe -> plugdev (udev rules of setup-pi.sh);
    # CSI/USB cameras and the Jetson GPU (/dev/nvhost-*, /dev/nvmap) -> video; Intel NPU -> render.
    # The NCS2's rule is mode 0666 and needs no group.
    case "$EI_FAMILY" in
        pi) wanted_groups=(video plugdev) ;;
        jetson) wanted_groups=(video render) ;;
        intel-npu) wanted_groups=(video render) ;;
        *) wanted_groups=(video) ;;
    esac
    if [[ "$EI_FAMILY" != pi ]] && { ei_has_coral_usb || ei_has_coral_pcie; }; then wanted_groups+=(plugdev); fi
fi
groups=()
for g in "${wanted_groups[@]}"; do
    [[ -n "$g" ]] || continue
    # A missing group in SupplementaryGroups= makes the service fail to start (status 216/GROUP).
    if ei_group_exists "$g"; then groups+=("$g"); else ei_warn "group '$g' does not exist here; not added to the unit"; fi
done
ei_check_line "service groups: ${groups[*]:-none}"

# ------------------------------------------------------------------------------------ user, dirs

ei_write_file "$SYSUSERS_CONF" 0644 < <(
    printf 'u %s - "edgeinfer agent" %s /usr/sbin/nologin\n' "$SERVICE_USER" "$DATA_DIR")
if ei_user_exists "$SERVICE_USER"; then
    ei_ok "user $SERVICE_USER exists"
elif ei_have systemd-sysusers; then
    if [[ -n "$EI_ROOT" ]]; then
        ei_run_host systemd-sysusers --root="$EI_ROOT" "$(ei_path "$SYSUSERS_CONF")"
    else
        ei_run_host systemd-sysusers "$SYSUSERS_CONF"
    fi
else
    ei_run useradd --system --user-group --home-dir "$DATA_DIR" --no-create-home \
        --shell /usr/sbin/nologin --comment "edgeinfer agent" "$SERVICE_USER"
fi

ei_mkdir "$DATA_DIR" 0750 "$SERVICE_USER:$SERVICE_USER"
ei_mkdir "$SLOTS_DIR" 0750 "$SERVICE_USER:$SERVICE_USER"
# The config may name credentials (password_file, client keys): readable by root and the agent only.
ei_mkdir /etc/edgeinfer 0750 "root:$SERVICE_USER"
if [[ -n "$CONFIG_SOURCE" ]]; then
    config_from=$CONFIG_SOURCE
else
    config_from=$DEFAULT_CONFIG_TEMPLATE
fi
ei_write_file_if_absent "$CONFIG" 0640 "root:$SERVICE_USER" <"$config_from"

# --------------------------------------------------------------------------------------- launcher

# The launcher of the edgeinfer in the venv (its state is theirs to share); this checkout's before one is installed.
launcher_from=""
for candidate in "$(ei_path "$VENV")"/lib/python3*/site-packages/edgeinfer/updates/launcher.py "$LAUNCHER_SOURCE"; do
    if [[ -f "$candidate" ]]; then launcher_from=$candidate; break; fi
done
[[ -n "$launcher_from" ]] || ei_die "no edgeinfer/updates/launcher.py in $VENV or beside this script"
ei_mkdir "$(dirname "$LAUNCHER")" 0755 root:root
ei_copy_file "$launcher_from" "$LAUNCHER" 0644 root:root

# ------------------------------------------------------------------------------------------- unit

if ((WATCHDOG > 0)); then service_type="notify"; else service_type="exec"; fi
unit_text=$(sed -e "s|@VENV@|$VENV|g" -e "s|@CONFIG@|$CONFIG|g" -e "s|@SERVICE_TYPE@|$service_type|g" \
    -e "s|@WATCHDOG_SEC@|$WATCHDOG|g" -e "s|@SUPPLEMENTARY_GROUPS@|${groups[*]:-}|g" \
    -e "s|@LAUNCHER@|$LAUNCHER|g" -e "s|@SLOTS@|$SLOTS_DIR|g" -e "s|@AGENT_TRIAL@|$AGENT_TRIAL|g" "$UNIT_TEMPLATE")
if ((${#groups[@]} == 0)); then unit_text=$(printf '%s\n' "$unit_text" | grep -v '^SupplementaryGroups=$'); fi
if ((WATCHDOG == 0)); then unit_text=$(printf '%s\n' "$unit_text" | grep -v '^NotifyAccess='); fi
if printf '%s\n' "$unit_text" | grep -Eq '@[A-Z_]+@'; then
    ei_die "unit template left a placeholder unfilled: $(printf '%s\n' "$unit_text" | grep -Eo '@[A-Z_]+@' | head -n1)"
fi
before=$EI_CHANGES
ei_write_file "$UNIT_PATH" 0644 <<<"$unit_text"
unit_changed=$((EI_CHANGES != before))

if ! ei_exists "$VENV/bin/edgeinfer"; then
    ei_warn "$VENV/bin/edgeinfer does not exist yet: run setup-pi.sh / setup-jetson.sh / setup-intel.sh first" \
        "(the service is installed but cannot start until then)"
    START=0
elif [[ -z "$EI_ROOT" ]] && ei_exists "$CONFIG"; then
    # As the service user where possible: that also catches TLS files the agent cannot read.
    as_agent=()
    if ei_user_exists "$SERVICE_USER" && ei_have runuser; then as_agent=(runuser -u "$SERVICE_USER" --); fi
    ei_check "agent config ($CONFIG)" "${as_agent[@]}" "$VENV/bin/edgeinfer" agent --config "$CONFIG" --check ||
        { ei_warn "the agent rejects $CONFIG; fix it before starting the service"; START=0; }
fi

# --------------------------------------------------------------------------------------- systemctl

if ((SYSTEMCTL == 0)); then
    ei_skip "systemctl (--no-systemctl)"
elif [[ -n "$EI_ROOT" ]]; then
    if ei_exists "/etc/systemd/system/multi-user.target.wants/$UNIT_NAME"; then
        ei_ok "$UNIT_NAME enabled"
    else
        ei_run_host systemctl --root="$EI_ROOT" enable "$UNIT_NAME"
    fi
    ei_skip "start $UNIT_NAME (--root: it starts at the image's first boot)"
else
    ((unit_changed)) && ei_run systemctl daemon-reload
    if systemctl is-enabled --quiet "$UNIT_NAME" 2>/dev/null; then
        ei_ok "$UNIT_NAME enabled"
    else
        ei_run systemctl enable "$UNIT_NAME"
    fi
    if ((START == 0)); then
        ei_skip "start $UNIT_NAME (--no-start, or the agent cannot start yet)"
    elif ! systemctl is-active --quiet "$UNIT_NAME" 2>/dev/null; then
        ei_run systemctl start "$UNIT_NAME"
    elif ((unit_changed)); then
        ei_run systemctl restart "$UNIT_NAME"
    else
        ei_ok "$UNIT_NAME is running"
    fi
fi

ei_summary
