# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# detect.sh: which device family the target is (EI_FAMILY), from the runtime's device profiles when
# edgeinfer can answer, from this library's own probes otherwise.

# The script's own detection: sets EI_FAMILY to pi | jetson | intel-ncs2 | intel-npu | x86-64 |
# unknown, and EI_MODEL to a description. Works on an offline image too (rpi-issue, nv_tegra_release).
ei_detect_script() {
    local model arch
    model=$(ei_dt_model)
    arch=$(ei_dpkg_arch)
    if ei_exists /etc/nv_tegra_release || [[ "$model" == *Jetson* ]]; then
        EI_FAMILY=jetson
    elif ei_is_pi; then
        EI_FAMILY=pi
    elif ei_has_ncs2; then
        EI_FAMILY=intel-ncs2
    elif ei_has_npu || ei_cpu_has_npu; then
        EI_FAMILY=intel-npu
    elif [[ "$arch" == amd64 ]]; then
        EI_FAMILY=x86-64
    else
        EI_FAMILY=unknown
    fi
    EI_MODEL=${model:-$(ei_cpu_model)}
    EI_MODEL=${EI_MODEL:-unknown ${arch:-architecture}}
}

# Python that can run `edgeinfer device` for this root: $EDGEINFER_PYTHON, else the venv's python
# (running system only: an image's interpreter may be for another architecture), else python3.
_ei_profiles_python() {
    local venv=${1:-$EI_DEFAULT_VENV} py candidates=("${EDGEINFER_PYTHON:-}")
    if [[ -z "$EI_ROOT" ]]; then candidates+=("$venv/bin/python"); fi
    candidates+=(python3)
    for py in "${candidates[@]}"; do
        [[ -n "$py" ]] || continue
        ei_have "$py" || [[ -x "$py" ]] || continue
        # From /, so that an "edgeinfer" directory in the current one is not what gets imported.
        (cd / && "$py" -c 'import edgeinfer') >/dev/null 2>&1 || continue
        printf '%s' "$py"
        return 0
    done
    return 1
}

# ei_detect_profiles [VENV]: ask the runtime's profiles. Sets EI_FAMILY, EI_PROFILE; returns 1 (and
# sets EI_PROFILES_WHY) when edgeinfer is not importable or the command fails.
ei_detect_profiles() {
    local py json parsed args=(device --json)
    EI_PROFILES_WHY=""
    if ! py=$(_ei_profiles_python "${1:-}"); then
        EI_PROFILES_WHY="edgeinfer is not importable here"
        return 1
    fi
    [[ -n "$EI_ROOT" ]] && args+=(--root "$EI_ROOT")
    if ! json=$(cd / && "$py" -m edgeinfer "${args[@]}" 2>/dev/null); then
        EI_PROFILES_WHY="'$py -m edgeinfer ${args[*]}' failed (no device command in this edgeinfer?)"
        return 1
    fi
    local rc=0
    # profile_family.py prints "family<TAB>profile name"; exit 3 means no profile matched.
    parsed=$(printf '%s' "$json" | "$py" "$EI_LIB_DIR/profile_family.py" 2>/dev/null) || rc=$?
    if ((rc == 3)); then
        EI_PROFILES_WHY="no device profile matches this machine"
        return 1
    elif ((rc != 0)); then
        EI_PROFILES_WHY="'edgeinfer device --json' printed something that is not a device profile"
        return 1
    fi
    EI_FAMILY=${parsed%%$'\t'*}
    EI_PROFILE=${parsed#*$'\t'}
    return 0
}

# ei_detect [VENV]: profiles first (--detect auto|profiles), the script's own detection as fallback.
# Sets EI_FAMILY, EI_MODEL, EI_PROFILE and EI_DETECT_SOURCE; prints one [check] line.
ei_detect() {
    EI_PROFILE=""
    ei_detect_script
    local script_family=$EI_FAMILY
    EI_DETECT_SOURCE=script
    if [[ "$EI_DETECT" != script ]]; then
        if ei_detect_profiles "${1:-}"; then
            EI_DETECT_SOURCE=profiles
            if [[ "$EI_FAMILY" != "$script_family" ]]; then
                ei_warn "edgeinfer's profile says '$EI_FAMILY' ($EI_PROFILE), this script's own detection says" \
                    "'$script_family'; using the profile"
            fi
        elif [[ "$EI_DETECT" == profiles ]]; then
            ei_die "--detect profiles: $EI_PROFILES_WHY"
        else
            ei_info "device profiles unavailable ($EI_PROFILES_WHY); using the script's own detection"
        fi
    fi
    ei_check_line "device: $EI_FAMILY ($EI_MODEL${EI_PROFILE:+, profile $EI_PROFILE}; detected by $EI_DETECT_SOURCE)"
}

# Go on only on the device family $1 (named $2 in messages), or anywhere with --force (FORCE=1).
ei_expect_family() {
    [[ "$EI_FAMILY" == "$1" ]] && return 0
    ((${FORCE:-0})) || ei_die "this is not $2 (detected: $EI_FAMILY, $EI_MODEL); use the setup script for" \
        "that device, or --force"
    ei_warn "not detected as $2; going on because of --force"
}
