# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# output.sh: log messages on stderr, the one-line-per-action output on stdout, the count of actions
# and the closing summary (the output contract is in lib.sh's header).

EI_SCRIPT=${EI_SCRIPT:-$(basename "${0:-edgeinfer}")}
EI_DRY_RUN=0
EI_CHANGES=0            # actions taken (or, in a dry run, planned)
EI_INCOMPLETE=0         # set when a step needs a person; the script then exits 3

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

# ----------------------------------------------------------------------------------- action lines

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
