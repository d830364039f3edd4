# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source this file
# lib.sh: shared helpers of edgeinfer's provisioning scripts. Sourced by them, never run directly.
#
# What every script gets from here:
#   * --root DIR: every path the scripts read or write is resolved under DIR (a mounted SD-card image,
#     a chroot, or a fake tree in the tests). Commands that change the system run in `chroot DIR`;
#     commands that act on this machine's hardware (udevadm, nvpmodel, jetson_clocks, starting a
#     service) are skipped, because the hardware is not this machine's.
#   * --dry-run: print every action, change nothing (read-only checks of the running system still run).
#   * idempotence: files are written only when their content, mode or owner differs; packages already
#     installed are not installed again; a second run reports "no changes".
#
# Output contract (people and tests read it). On stdout, one line per action:
#   [dry-run] <verb>: <object>    what a real run would do (verbs: run, write, mkdir, chmod, chown,
#                                 symlink, fetch, extract)
#   [change] <verb>: <object>     what this run did
#   [ok] <what>                   already in the wanted state, nothing to do
#   [skip] <what> (<why>)         deliberately not done
#   [check] <what>: <result>      a read-only check
#   [summary] ...                 the last line
# Indented "    | " lines after a write show the file's content. Log messages go to stderr.
# Exit codes: 0 done, 1 failed, 2 bad usage, 3 done except for a step that needs a person (see stderr).

[[ -n "${EI_LIB_LOADED:-}" ]] && return 0
EI_LIB_LOADED=1

EI_SCRIPT=${EI_SCRIPT:-$(basename "${0:-edgeinfer}")}
EI_ROOT=""              # target root, no trailing slash; "" is the running system
EI_DRY_RUN=0
EI_CHANGES=0            # actions taken (or, in a dry run, planned)
EI_INCOMPLETE=0         # set when a step needs a person; the script then exits 3
EI_APT_UPDATED=0
EI_DETECT=auto          # auto | profiles | script
EI_DEFAULT_VENV=/opt/edgeinfer/venv

# ----------------------------------------------------------------------------------------- logging

ei_info() { printf '%s: %s\n' "$EI_SCRIPT" "$*" >&2; }
ei_warn() { printf '%s: warning: %s\n' "$EI_SCRIPT" "$*" >&2; }
ei_die() { printf '%s: error: %s\n' "$EI_SCRIPT" "$*" >&2; exit 1; }
ei_usage_error() { printf '%s: usage error: %s (see --help)\n' "$EI_SCRIPT" "$*" >&2; exit 2; }

# A step that needs a person (a download behind a login, a reboot): say what to do, exit 3 at the end.
ei_incomplete() {
    EI_INCOMPLETE=1
    printf '%s: action needed: %s\n' "$EI_SCRIPT" "$*" >&2
}

_ei_on_error() {
    local rc=$? line=$1 cmd=$2
    printf '%s: error: command failed (exit %s) at line %s: %s\n' "$EI_SCRIPT" "$rc" "$line" "$cmd" >&2
    exit 1  # 2 and 3 mean "bad usage" and "needs a person"; a failed command is a failure
}
trap '_ei_on_error "$LINENO" "$BASH_COMMAND"' ERR

# Shell-quote arguments for display: bare when safe, single-quoted otherwise.
ei_quote() {
    local out="" a
    for a in "$@"; do
        if [[ -z "$a" ]]; then
            a="''"
        elif [[ ! "$a" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
            a="'${a//\'/\'\\\'\'}'"
        fi
        out+="${out:+ }$a"
    done
    printf '%s' "$out"
}

# Counting happens in this shell: an action run in a pipeline or $(...) would lose its count (and
# any state it sets), so that is refused. Feed content with `< <(printf ...)` or a here-document.
_ei_mark() {
    ((BASH_SUBSHELL == 0)) || ei_die "internal error: an action ran in a subshell (${FUNCNAME[*]})"
    EI_CHANGES=$((EI_CHANGES + 1))
}

# "[dry-run] verb: object" or "[change] verb: object", counted as one change.
ei_note_change() {
    _ei_mark
    if ((EI_DRY_RUN)); then
        printf '[dry-run] %s: %s\n' "$1" "$2"
    else
        printf '[change] %s: %s\n' "$1" "$2"
    fi
}

ei_ok() { printf '[ok] %s\n' "$*"; }
ei_skip() { printf '[skip] %s\n' "$*"; }
ei_check_line() { printf '[check] %s\n' "$*"; }

ei_summary() {
    if ((EI_CHANGES == 0)); then
        printf '[summary] no changes\n'
    elif ((EI_DRY_RUN)); then
        printf '[summary] %d change(s) planned; nothing was changed (dry run)\n' "$EI_CHANGES"
    else
        printf '[summary] %d change(s) made\n' "$EI_CHANGES"
    fi
    if ((EI_INCOMPLETE)); then
        ei_warn "not finished: a step above needs a person (lines starting with 'action needed')"
        exit 3
    fi
}

# ----------------------------------------------------------------------------------- common options

# ei_set_root DIR: resolve everything under DIR ("/" means the running system).
ei_set_root() {
    local dir=${1:-}
    [[ -n "$dir" ]] || ei_usage_error "--root needs a directory"
    [[ -d "$dir" ]] || ei_usage_error "--root $dir: no such directory"
    dir=$(cd "$dir" && pwd -P)
    if [[ "$dir" == / ]]; then EI_ROOT=""; else EI_ROOT=$dir; fi
}

ei_set_detect() {
    case "${1:-}" in
        auto | profiles | script) EI_DETECT=$1 ;;
        *) ei_usage_error "--detect takes auto, profiles or script, not '${1:-}'" ;;
    esac
}

# Options every script takes, for the scripts' --help.
ei_common_help() {
    cat <<'EOF'
Common options:
  --root DIR        treat DIR as the filesystem root: detection reads DIR/proc, DIR/sys, DIR/etc;
                    files are written under DIR; system commands run in `chroot DIR` (a foreign-
                    architecture image needs qemu-user-static); commands that act on this machine's
                    hardware (udevadm, nvpmodel, jetson_clocks, starting services) are skipped
  --dry-run         print every action and change nothing
  --detect MODE     auto (default): ask `edgeinfer device --json` when edgeinfer is importable, else
                    use the script's own detection; profiles: require edgeinfer; script: own only
  -h, --help        this help

Output: one line per action on stdout ([dry-run]/[change]/[ok]/[skip]/[check]), logs on stderr.
Exit codes: 0 done, 1 failed, 2 bad usage, 3 done except for a step that needs a person.
EOF
}

# The next value of an option that needs one, or a usage error.
ei_optarg() {
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || ei_usage_error "$1 needs a value"
    printf '%s' "$2"
}

# An option every script takes (--root, --dry-run, --detect, -h/--help; help calls the script's
# usage). Sets EI_SHIFT to the arguments it used; returns 1 when $1 is not one of them.
ei_common_option() {
    case "$1" in
        --root) ei_set_root "$(ei_optarg "$@")"; EI_SHIFT=2 ;;
        --dry-run) EI_DRY_RUN=1; EI_SHIFT=1 ;;
        --detect) ei_set_detect "$(ei_optarg "$@")"; EI_SHIFT=2 ;;
        -h | --help) usage; exit 0 ;;
        *) return 1 ;;
    esac
}

# Go on only on the device family $1 (named $2 in messages), or anywhere with --force (FORCE=1).
ei_expect_family() {
    [[ "$EI_FAMILY" == "$1" ]] && return 0
    ((${FORCE:-0})) || ei_die "this is not $2 (detected: $EI_FAMILY, $EI_MODEL); use the setup script for" \
        "that device, or --force"
    ei_warn "not detected as $2; going on because of --force"
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

# ---------------------------------------------------------------------------------------- commands

_ei_exec() {
    _ei_mark
    if ((EI_DRY_RUN)); then
        printf '[dry-run] run: %s\n' "$(ei_quote "$@")"
        return 0
    fi
    printf '[change] run: %s\n' "$(ei_quote "$@")"
    "$@"
}

# A command that changes the target system: runs inside `chroot ROOT` when --root is set.
ei_run() {
    if [[ -n "$EI_ROOT" ]]; then
        _ei_exec chroot "$EI_ROOT" "$@"
    else
        _ei_exec "$@"
    fi
}

# A command that runs on this machine even with --root (it takes the root as an argument itself,
# or only reads from the network and writes under the root).
ei_run_host() { _ei_exec "$@"; }

# A command that acts on this machine's hardware or services: skipped with --root.
ei_run_live() {
    if [[ -n "$EI_ROOT" ]]; then
        ei_skip "run: $(ei_quote "$@") (acts on the running system's hardware; not run with --root)"
        return 0
    fi
    _ei_exec "$@"
}

# A read-only check of the running system; runs in dry runs too, never with --root.
# Prints "[check] WHAT: ok|failed (output)" and returns the command's status.
ei_check() {
    local what=$1 out rc=0
    shift
    if [[ -n "$EI_ROOT" ]]; then
        ei_skip "check: $what (needs the running system; not run with --root)"
        return 0
    fi
    out=$("$@" 2>&1) || rc=$?
    out=$(printf '%s' "$out" | tr '\n' ' ' | cut -c1-300)
    if ((rc == 0)); then
        ei_check_line "$what: ok${out:+ ($out)}"
    else
        ei_check_line "$what: failed (exit $rc)${out:+ ($out)}"
    fi
    return "$rc"
}

ei_have() { command -v "$1" >/dev/null 2>&1; }

# -------------------------------------------------------------------------------- users and groups

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

# -------------------------------------------------------------------------------------------- files

# "0644" and "644" compare equal.
_ei_mode_eq() { (( 8#$1 == 8#$2 )); }

# ei_owner_ids OWNER[:GROUP] -> "uid:gid" from the target's databases; empty when unknown there.
_ei_owner_ids() {
    local owner=${1%%:*} group uid gid
    group=${1#*:}
    [[ "$group" == "$1" ]] && group=$owner
    uid=$(ei_uid "$owner")
    gid=$(ei_gid "$group")
    if [[ -n "$uid" && -n "$gid" ]]; then printf '%s:%s' "$uid" "$gid"; fi
}

# ei_apply_meta PATH MODE [OWNER[:GROUP]]: fix mode and owner of an existing path.
_ei_apply_meta() {
    local path=$1 mode=$2 owner=${3:-} dest ids
    dest=$(ei_path "$path")
    if ! _ei_mode_eq "$(stat -c %a "$dest")" "$mode"; then
        ei_note_change chmod "$mode $path"
        ((EI_DRY_RUN)) || chmod "$mode" "$dest"
    fi
    [[ -n "$owner" ]] || return 0
    ids=$(_ei_owner_ids "$owner")
    if [[ -z "$ids" ]]; then
        if ((EI_DRY_RUN)); then
            ei_note_change chown "$owner $path"
            return 0
        fi
        ei_die "cannot chown $path to $owner: not in $(ei_path /etc/passwd) or /etc/group"
    fi
    if [[ "$(stat -c %u:%g "$dest")" != "$ids" ]]; then
        ei_note_change chown "$owner ($ids) $path"
        ((EI_DRY_RUN)) || chown "$ids" "$dest"
    fi
}

# ei_mkdir PATH MODE [OWNER[:GROUP]]
ei_mkdir() {
    local path=$1 mode=$2 owner=${3:-} dest
    dest=$(ei_path "$path")
    if [[ -d "$dest" ]]; then
        _ei_apply_meta "$path" "$mode" "$owner"
        return 0
    fi
    [[ -e "$dest" ]] && ei_die "$path exists and is not a directory"
    ei_note_change mkdir "$path (mode $mode${owner:+, owner $owner})"
    if ((EI_DRY_RUN)); then return 0; fi
    local ids=""
    if [[ -n "$owner" ]]; then
        ids=$(_ei_owner_ids "$owner")
        [[ -n "$ids" ]] || ei_die "cannot chown $path to $owner: not in $(ei_path /etc/passwd) or /etc/group"
    fi
    mkdir -p "$dest"
    chmod "$mode" "$dest"
    [[ -z "$ids" ]] || chown "$ids" "$dest"
}

_ei_show_content() {
    local file=$1
    sed 's/^/    | /' "$file"
}

# ei_write_file PATH MODE [OWNER[:GROUP]] < content: write when content, mode or owner differ.
ei_write_file() {
    local path=$1 mode=$2 owner=${3:-} dest dir tmp
    dest=$(ei_path "$path")
    dir=$(dirname "$dest")
    tmp=$(mktemp "${TMPDIR:-/tmp}/edgeinfer-write.XXXXXX")
    cat >"$tmp"
    if [[ -f "$dest" ]] && cmp -s "$tmp" "$dest"; then
        rm -f "$tmp"
        _ei_apply_meta "$path" "$mode" "$owner"
        ei_ok "$path is up to date"
        return 0
    fi
    [[ -e "$dest" && ! -f "$dest" ]] && { rm -f "$tmp"; ei_die "$path exists and is not a regular file"; }
    if [[ -f "$dest" ]]; then
        ei_note_change write "$path (mode $mode${owner:+, owner $owner}; replaces different content)"
    else
        ei_note_change write "$path (mode $mode${owner:+, owner $owner})"
    fi
    _ei_show_content "$tmp"
    if ((EI_DRY_RUN)); then
        rm -f "$tmp"
        return 0
    fi
    [[ -d "$dir" ]] || mkdir -p "$dir"
    # Same-directory temporary file, then rename: readers never see half a file.
    local staged
    staged=$(mktemp "$dir/.$(basename "$dest").XXXXXX")
    cat "$tmp" >"$staged"
    rm -f "$tmp"
    chmod "$mode" "$staged"
    if [[ -n "$owner" ]]; then
        local ids
        ids=$(_ei_owner_ids "$owner")
        [[ -n "$ids" ]] || { rm -f "$staged"; ei_die "cannot chown $path to $owner: unknown in the target"; }
        chown "$ids" "$staged"
    fi
    mv -f "$staged" "$dest"
}

# ei_write_file_if_absent PATH MODE [OWNER[:GROUP]] < content: never touches an existing file
# (a person's configuration), not even its mode.
ei_write_file_if_absent() {
    local path=$1
    if [[ -e "$(ei_path "$path")" ]]; then
        cat >/dev/null
        ei_ok "keep existing $path (never overwritten)"
        return 0
    fi
    ei_write_file "$@"
}

# ei_symlink TARGET LINK
ei_symlink() {
    local target=$1 link=$2 dest
    dest=$(ei_path "$link")
    if [[ -L "$dest" && "$(readlink "$dest")" == "$target" ]]; then
        ei_ok "$link -> $target"
        return 0
    fi
    [[ -e "$dest" && ! -L "$dest" ]] && ei_die "$link exists and is not a symlink"
    ei_note_change symlink "$link -> $target"
    ((EI_DRY_RUN)) && return 0
    mkdir -p "$(dirname "$dest")"
    ln -sfn "$target" "$dest"
}

# ei_fetch_keyring URL PATH: an apt signing key, dearmored into PATH (kept once present; delete the
# file to fetch it again). The download runs on this machine, the file lands under the root.
ei_fetch_keyring() {
    local url=$1 path=$2 dest tmp
    dest=$(ei_path "$path")
    if [[ -s "$dest" ]]; then
        ei_ok "keyring $path present"
        return 0
    fi
    ei_note_change fetch "$url | gpg --dearmor > $path (mode 0644)"
    ((EI_DRY_RUN)) && return 0
    ei_have curl || ei_die "curl is needed to fetch $url (apt-get install curl)"
    ei_have gpg || ei_die "gpg is needed to store $url (apt-get install gnupg)"
    tmp=$(mktemp -d)
    curl -fsSL --retry 3 -o "$tmp/key" "$url" || { rm -rf "$tmp"; ei_die "could not download $url"; }
    gpg --batch --yes --dearmor -o "$tmp/key.gpg" "$tmp/key" || { rm -rf "$tmp"; ei_die "$url is not a PGP key"; }
    mkdir -p "$(dirname "$dest")"
    install -m 0644 "$tmp/key.gpg" "$dest"
    rm -rf "$tmp"
}

# --------------------------------------------------------------------------------------------- apt

# ei_pkg_installed NAME: installed according to the target's dpkg database.
ei_pkg_installed() {
    local status
    status=$(ei_path /var/lib/dpkg/status)
    [[ -r "$status" ]] || return 1
    awk -v p="$1" '
        BEGIN { RS = ""; FS = "\n" }
        {
            pkg = ""; st = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^Package: /) pkg = substr($i, 10)
                if ($i ~ /^Status: /) st = substr($i, 9)
            }
            if (pkg == p && st ~ /ok installed$/) found = 1
        }
        END { exit !found }' "$status"
}

# The target's dpkg architecture (amd64, arm64, armhf), from its database or this machine.
ei_dpkg_arch() {
    local status arch=""
    status=$(ei_path /var/lib/dpkg/status)
    if [[ -r "$status" ]]; then
        arch=$(awk 'BEGIN { RS = ""; FS = "\n" }
            /(^|\n)Package: (libc6|base-files)\n/ {
                for (i = 1; i <= NF; i++) if ($i ~ /^Architecture: /) { print substr($i, 15); exit }
            }' "$status")
    fi
    if [[ -z "$arch" && -z "$EI_ROOT" ]] && ei_have dpkg; then arch=$(dpkg --print-architecture); fi
    printf '%s' "$arch"
}

# Force `apt-get update` before the next install (after a repository was added).
ei_apt_sources_changed() { EI_APT_UPDATED=0; }

ei_apt_update() {
    ((EI_APT_UPDATED)) && return 0
    ei_run apt-get update
    EI_APT_UPDATED=1
}

# ei_apt_install PKG...: installs only the packages not installed yet (one apt-get call).
ei_apt_install() {
    local p present=() missing=()
    for p in "$@"; do
        if ei_pkg_installed "${p%%[=:]*}"; then present+=("$p"); else missing+=("$p"); fi
    done
    ((${#present[@]})) && ei_ok "packages already installed: ${present[*]}"
    ((${#missing[@]})) || return 0
    ei_apt_update
    ei_run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# ------------------------------------------------------------------------------------- os, python

# ei_os_release KEY: a value from the target's /etc/os-release (quotes removed).
ei_os_release() {
    local f
    f=$(ei_path /etc/os-release)
    [[ -r "$f" ]] || f=$(ei_path /usr/lib/os-release)
    [[ -r "$f" ]] || return 0
    awk -F= -v k="$1" '$1 == k { v = substr($0, length(k) + 2); gsub(/^"|"$/, "", v); print v; exit }' "$f"
}

# The newest python3.N interpreter under the root's /usr/bin, as "3.N" (empty when none).
ei_system_python_version() {
    local f best="" minor best_minor=-1
    for f in "$(ei_path /usr/bin)"/python3.*; do
        [[ -x "$f" && ! -d "$f" ]] || continue
        minor=${f##*/python3.}
        [[ "$minor" =~ ^[0-9]+$ ]] || continue
        if ((minor > best_minor)); then best_minor=$minor; best="3.$minor"; fi
    done
    printf '%s' "$best"
}

# The distribution's python3 ("3.11"), from the /usr/bin/python3 link; the newest python3.N otherwise.
ei_default_python_version() {
    local link
    link=$(readlink "$(ei_path /usr/bin/python3)" 2>/dev/null || true)
    if [[ "${link##*/}" =~ ^python(3\.[0-9]+)$ ]]; then
        printf '%s' "${BASH_REMATCH[1]}"
    else
        ei_system_python_version
    fi
}

# ei_version_ge 3.10 3.8 -> true
ei_version_ge() {
    [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" == "$2" ]]
}

# ------------------------------------------------------------------------------------------- venvs

# ei_venv_site VENV PYVER -> the venv's site-packages path (device path, not resolved under root).
ei_venv_site() { printf '%s/lib/python%s/site-packages' "$1" "$2"; }

# ei_venv_dist_version VENV PYVER NAME -> version of an installed distribution (from *.dist-info).
ei_venv_dist_version() {
    local site d name norm
    site=$(ei_path "$(ei_venv_site "$1" "$2")")
    norm=$(printf '%s' "$3" | tr 'A-Z-.' 'a-z__')
    for d in "$site"/*.dist-info; do
        [[ -d "$d" ]] || continue
        name=${d##*/}
        name=${name%.dist-info}
        if [[ "$(printf '%s' "${name%-*}" | tr 'A-Z-.' 'a-z__')" == "$norm" ]]; then
            printf '%s' "${name##*-}"
            return 0
        fi
    done
    return 1
}

# ei_venv_create VENV PYTHON SYSTEM_SITE(0|1): create once; fix include-system-site-packages after.
ei_venv_create() {
    local venv=$1 python=$2 system_site=$3 cfg want
    cfg=$(ei_path "$venv/pyvenv.cfg")
    if [[ ! -f "$cfg" ]]; then
        local args=(-m venv)
        ((system_site)) && args+=(--system-site-packages)
        ei_run "$python" "${args[@]}" "$venv"
        return 0
    fi
    ei_ok "venv $venv exists"
    if ((system_site)); then want=true; else want=false; fi
    if grep -q "^include-system-site-packages = $want\$" "$cfg"; then
        ei_ok "venv $venv: include-system-site-packages = $want"
    else
        ei_write_file "$venv/pyvenv.cfg" 0644 < <(
            sed "s/^include-system-site-packages = .*/include-system-site-packages = $want/" "$cfg")
    fi
}

# The edgeinfer package to install: a checkout beside this script when run from one on the running
# system, else the name on the package index. --package overrides it.
ei_default_package() {
    local here checkout
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
    checkout=$(dirname "$here")
    if [[ -z "$EI_ROOT" && -f "$checkout/pyproject.toml" ]] &&
        grep -q '^name = "edgeinfer"' "$checkout/pyproject.toml"; then
        printf '%s' "$checkout"
    else
        printf 'edgeinfer'
    fi
}

# ei_pip_install VENV PYVER UPGRADE(0|1) "SPEC[extras]" [more requirements...]: install when
# edgeinfer or a required distribution is missing (or when UPGRADE), in one resolver run.
# Distribution names to check come from EI_PIP_REQUIRED_DISTS (space-separated).
ei_pip_install() {
    local venv=$1 pyver=$2 upgrade=$3 d missing=()
    shift 3
    for d in edgeinfer ${EI_PIP_REQUIRED_DISTS:-}; do
        ei_venv_dist_version "$venv" "$pyver" "$d" >/dev/null || missing+=("$d")
    done
    if ((${#missing[@]} == 0 && upgrade == 0)); then
        ei_ok "venv $venv has edgeinfer ${EI_PIP_REQUIRED_DISTS:-} (pass --upgrade to reinstall)"
        return 0
    fi
    local args=(-m pip install --disable-pip-version-check)
    ((upgrade)) && args+=(--upgrade)
    ei_run "$venv/bin/python" "${args[@]}" "$@"
}

# -------------------------------------------------------------------------------------- detection

# The device-tree model string ("Raspberry Pi 5 Model B Rev 1.0", "NVIDIA Jetson Orin Nano ...").
ei_dt_model() {
    ei_read_line /proc/device-tree/model || ei_read_line /sys/firmware/devicetree/base/model || true
}

# ei_usb_present VID:PID: a USB device with these ids under ROOT/sys/bus/usb/devices.
ei_usb_present() {
    local want=${1,,} d
    for d in "$(ei_path /sys/bus/usb/devices)"/*; do
        [[ -r "$d/idVendor" && -r "$d/idProduct" ]] || continue
        [[ "$(tr -d '[:space:]' <"$d/idVendor"):$(tr -d '[:space:]' <"$d/idProduct")" == "$want" ]] && return 0
    done
    return 1
}

# ei_pci_present VENDOR:DEVICE (hex without 0x): a PCI function under ROOT/sys/bus/pci/devices.
ei_pci_present() {
    local want=${1,,} d v p
    for d in "$(ei_path /sys/bus/pci/devices)"/*; do
        [[ -r "$d/vendor" && -r "$d/device" ]] || continue
        v=$(tr -d '[:space:]' <"$d/vendor")
        p=$(tr -d '[:space:]' <"$d/device")
        [[ "${v#0x}:${p#0x}" == "$want" ]] && return 0
    done
    return 1
}

ei_cpu_model() {
    local f
    f=$(ei_path /proc/cpuinfo)
    [[ -r "$f" ]] || return 0
    awk -F': *' '/^model name/ { print $2; exit }' "$f"
}

# Jetson: L4T release from /etc/nv_tegra_release ("# R36 (release), REVISION: 3.0, ...").
# Sets EI_L4T_MAJOR (36), EI_L4T_REVISION (3.0) and EI_L4T ("36.3.0"); returns 1 when absent.
ei_l4t_release() {
    local line
    line=$(ei_read_line /etc/nv_tegra_release) || return 1
    if [[ "$line" =~ ^#[[:space:]]*R([0-9]+)[[:space:]]*\(release\),[[:space:]]*REVISION:[[:space:]]*([0-9.]+) ]]; then
        EI_L4T_MAJOR=${BASH_REMATCH[1]}
        EI_L4T_REVISION=${BASH_REMATCH[2]}
        EI_L4T="$EI_L4T_MAJOR.$EI_L4T_REVISION"
        return 0
    fi
    ei_warn "cannot parse $(ei_path /etc/nv_tegra_release): $line"
    return 1
}

# Accelerator facts, from the root (sysfs ids, device nodes, cpuinfo).
EI_CORAL_USB_IDS="1a6e:089a 18d1:9302"   # before / after libedgetpu loads its firmware
EI_CORAL_PCI_IDS="1ac1:089a"
EI_NCS2_USB_IDS="03e7:2485 03e7:f63b"    # Myriad X before / after boot
EI_NCS1_USB_IDS="03e7:2150"
EI_NPU_PCI_IDS="8086:7d1d 8086:ad1d 8086:643e 8086:b03e"   # Meteor, Arrow, Lunar, Panther Lake

_ei_any_usb() { local id; for id in $1; do ei_usb_present "$id" && return 0; done; return 1; }
_ei_any_pci() { local id; for id in $1; do ei_pci_present "$id" && return 0; done; return 1; }

ei_has_coral_usb() { _ei_any_usb "$EI_CORAL_USB_IDS"; }
ei_has_coral_pcie() { _ei_any_pci "$EI_CORAL_PCI_IDS" || ei_exists /dev/apex_0; }
ei_has_ncs2() { _ei_any_usb "$EI_NCS2_USB_IDS"; }
ei_has_ncs1() { _ei_any_usb "$EI_NCS1_USB_IDS"; }
ei_has_npu() { ei_exists /dev/accel/accel0 || _ei_any_pci "$EI_NPU_PCI_IDS"; }
ei_cpu_has_npu() { [[ "$(ei_cpu_model)" == *"Core(TM) Ultra"* ]]; }
ei_is_pi() {
    [[ "$(ei_dt_model)" == "Raspberry Pi"* ]] || ei_exists /etc/rpi-issue
}

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

# Reads `edgeinfer device --json` on stdin; prints "family<TAB>profile name". The family comes from the
# profile's setup_script (setup-pi.sh, setup-jetson.sh, setup-intel.sh, install-agent.sh) when the
# output has one, else from a "family" key, else from the words of the profile's name.
_EI_PROFILE_PARSER='
import json, re, sys
data = json.load(sys.stdin)
if isinstance(data, list):
    data = data[0] if data else {}
if not isinstance(data, dict):
    raise SystemExit(1)
def find(obj, key):
    if isinstance(obj, dict):
        if isinstance(obj.get(key), str):
            return obj[key]
        for value in obj.values():
            hit = find(value, key)
            if hit:
                return hit
    elif isinstance(obj, list):
        for value in obj:
            hit = find(value, key)
            if hit:
                return hit
    return ""
prof = data.get("profile")
if isinstance(prof, dict):
    name = prof.get("name") or prof.get("id") or ""
elif isinstance(prof, str):
    name = prof
else:
    name = data.get("name") or ""
if not name:
    raise SystemExit(3)  # a valid answer: no profile matched
script = find(data, "setup_script")
family = find(data, "family")
words = set(re.split(r"[^a-z0-9]+", f"{family} {name}".lower())) - {""}
def has(*ws):
    return any(x.startswith(w) for w in ws for x in words)
if script == "setup-pi.sh" or (not script and (has("raspberry", "rpi") or words & {"pi", "pi3", "pi4", "pi5"})):
    fam = "pi"
elif script == "setup-jetson.sh" or (not script and has("jetson", "tegra")):
    fam = "jetson"
elif script == "setup-intel.sh" or (not script and has("ncs2", "npu", "myriad")):
    fam = "intel-ncs2" if has("ncs2", "myriad", "movidius") else "intel-npu"
elif has("x86", "amd64"):
    fam = "x86-64"
else:
    fam = "unknown"
print(fam + "\t" + name)
'

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
    parsed=$(printf '%s' "$json" | "$py" -c "$_EI_PROFILE_PARSER" 2>/dev/null) || rc=$?
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
