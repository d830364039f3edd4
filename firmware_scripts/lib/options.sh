# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# options.sh: the options every script takes (--root, --dry-run, --detect, --help) and their help text.

EI_DETECT=auto          # auto | profiles | script

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
