# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# python.sh: the target's Python interpreters, the venv, and installing edgeinfer into it with pip.

EI_DEFAULT_VENV=/opt/edgeinfer/venv

# ------------------------------------------------------------------------------------------ python

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

# The edgeinfer package to install: the checkout that holds firmware_scripts/ when run from one on the
# running system, else the name on the package index. --package overrides it.
ei_default_package() {
    local checkout
    checkout=$(dirname "$EI_SCRIPTS_DIR")
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
