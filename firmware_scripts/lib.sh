# shellcheck shell=bash
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

# The helpers, one concern per file in lib/ beside this one:
#   output.sh    log messages, action lines, the count of changes, the summary, the ERR trap
#   target.sh    --root: paths under the target root; whether this run may change it
#   commands.sh  running commands (in the target, on this machine, on its hardware), read-only checks
#   options.sh   the options every script takes and their --help text
#   users.sh     users and groups
#   files.sh     directories, files and symlinks, written only when they differ
#   apt.sh       the dpkg database, signing keys, apt-get
#   python.sh    interpreters, the venv, pip install of edgeinfer
#   probes.sh    read-only facts: os-release, device-tree model, USB/PCI ids, CPU, L4T, accelerators
#   detect.sh    the device family (profile_family.py maps `edgeinfer device --json` to one)

[[ -n "${EI_LIB_LOADED:-}" ]] && return 0
EI_LIB_LOADED=1

# Resolved from this file's own path, not the caller's working directory.
EI_SCRIPTS_DIR=$(CDPATH='' cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
EI_LIB_DIR=$EI_SCRIPTS_DIR/lib

# shellcheck source=lib/output.sh
. "$EI_LIB_DIR/output.sh"
# shellcheck source=lib/target.sh
. "$EI_LIB_DIR/target.sh"
# shellcheck source=lib/commands.sh
. "$EI_LIB_DIR/commands.sh"
# shellcheck source=lib/options.sh
. "$EI_LIB_DIR/options.sh"
# shellcheck source=lib/users.sh
. "$EI_LIB_DIR/users.sh"
# shellcheck source=lib/files.sh
. "$EI_LIB_DIR/files.sh"
# shellcheck source=lib/apt.sh
. "$EI_LIB_DIR/apt.sh"
# shellcheck source=lib/python.sh
. "$EI_LIB_DIR/python.sh"
# shellcheck source=lib/probes.sh
. "$EI_LIB_DIR/probes.sh"
# shellcheck source=lib/detect.sh
. "$EI_LIB_DIR/detect.sh"
