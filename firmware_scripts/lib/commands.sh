# shellcheck shell=bash
# commands.sh: running commands as actions (printed, counted, skipped in a dry run), in the target
# (chroot with --root) or on this machine, and read-only checks of the running system.

ei_have() { command -v "$1" >/dev/null 2>&1; }

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
