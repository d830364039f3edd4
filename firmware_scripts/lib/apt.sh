# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# apt.sh: the target's dpkg database, apt repositories' signing keys, and installing only the packages
# that are missing.

EI_APT_UPDATED=0

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
