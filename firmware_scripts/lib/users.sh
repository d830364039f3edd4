# shellcheck shell=bash
# users.sh: users and groups of the target, read from its own /etc/passwd and /etc/group (a name may
# exist only under --root), and the actions that add them.

ei_user_exists() { [[ -r "$(ei_path /etc/passwd)" ]] && grep -q "^$1:" "$(ei_path /etc/passwd)"; }
ei_group_exists() { [[ -r "$(ei_path /etc/group)" ]] && grep -q "^$1:" "$(ei_path /etc/group)"; }

ei_user_in_group() {
    local user=$1 group=$2
    [[ -r "$(ei_path /etc/group)" ]] || return 1
    awk -F: -v g="$group" -v u="$user" '
        $1 == g { n = split($4, m, ","); for (i = 1; i <= n; i++) if (m[i] == u) found = 1 }
        END { exit !found }' "$(ei_path /etc/group)"
}

# Numeric ids from the target's own databases (a name may exist only under --root).
ei_uid() { awk -F: -v u="$1" '$1 == u { print $3; exit }' "$(ei_path /etc/passwd)" 2>/dev/null; }
ei_gid() { awk -F: -v g="$1" '$1 == g { print $3; exit }' "$(ei_path /etc/group)" 2>/dev/null; }

ei_ensure_group() {
    if ei_group_exists "$1"; then
        ei_ok "group $1 exists"
    else
        ei_run groupadd --system "$1"
    fi
}

# ei_ensure_membership USER GROUP...: add USER to each GROUP it is not in yet.
ei_ensure_membership() {
    local user=$1 g missing=()
    shift
    if ! ei_user_exists "$user"; then
        ei_warn "user '$user' does not exist; not adding it to: $*"
        return 0
    fi
    for g in "$@"; do
        if ei_user_in_group "$user" "$g"; then
            ei_ok "user $user is in group $g"
        else
            missing+=("$g")
        fi
    done
    if ((${#missing[@]})); then
        ei_run usermod -aG "$(IFS=,; printf '%s' "${missing[*]}")" "$user"
        ei_info "user $user must log in again for the new groups to apply"
    fi
}

# The person who ran `sudo`, when there is one: gets device access for interactive use.
ei_default_user() {
    if [[ -n "${SUDO_USER:-}" && "${SUDO_USER}" != root && -z "$EI_ROOT" ]]; then
        printf '%s' "$SUDO_USER"
    fi
}
