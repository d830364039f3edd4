# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# target.sh: the system being provisioned. With --root DIR every device path resolves under DIR;
# without it, the running system.

EI_ROOT=""              # target root, no trailing slash; "" is the running system

# ei_set_root DIR: resolve everything under DIR ("/" means the running system).
ei_set_root() {
    local dir=${1:-}
    [[ -n "$dir" ]] || ei_usage_error "--root needs a directory"
    [[ -d "$dir" ]] || ei_usage_error "--root $dir: no such directory"
    dir=$(cd "$dir" && pwd -P)
    if [[ "$dir" == / ]]; then EI_ROOT=""; else EI_ROOT=$dir; fi
}

# Changing the running system needs root; a dry run or a --root tree the caller owns does not.
ei_require_root() {
    ((EI_DRY_RUN)) && return 0
    [[ -n "$EI_ROOT" && -w "$EI_ROOT" ]] && return 0
    [[ "$(id -u)" -eq 0 ]] || ei_die "run as root (sudo $EI_SCRIPT ...), or try --dry-run first"
}

# ------------------------------------------------------------------------------------------- paths

# ei_path /etc/foo -> the file under the target root.
ei_path() { printf '%s%s' "$EI_ROOT" "$1"; }

# Exists under the root; a symlink counts even when its (absolute, device) target does not resolve here.
ei_exists() { [[ -e "$(ei_path "$1")" || -L "$(ei_path "$1")" ]]; }

# First line of a file under the root, NUL bytes removed (device-tree strings end in NUL).
ei_read_line() {
    local f s
    f=$(ei_path "$1")
    [[ -r "$f" && -f "$f" ]] || return 1
    s=$(tr -d '\0' <"$f")
    printf '%s' "${s%%$'\n'*}"
}
