# shellcheck shell=bash
# files.sh: directories, files and symlinks under the target root, written only when their content,
# mode or owner differ.

# "0644" and "644" compare equal.
_ei_mode_eq() { (( 8#$1 == 8#$2 )); }

# _ei_owner_ids OWNER[:GROUP] -> "uid:gid" from the target's databases; empty when unknown there.
_ei_owner_ids() {
    local owner=${1%%:*} group uid gid
    group=${1#*:}
    [[ "$group" == "$1" ]] && group=$owner
    uid=$(ei_uid "$owner")
    gid=$(ei_gid "$group")
    if [[ -n "$uid" && -n "$gid" ]]; then printf '%s:%s' "$uid" "$gid"; fi
}

# _ei_apply_meta PATH MODE [OWNER[:GROUP]]: fix mode and owner of an existing path.
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
    local path=$1 mode=$2 owner=${3:-} dest tmp
    dest=$(ei_path "$path")
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
    ((${EI_HIDE_CONTENT:-0})) || _ei_show_content "$tmp"
    if ((EI_DRY_RUN)); then
        rm -f "$tmp"
        return 0
    fi
    _ei_replace_file "$tmp" "$path" "$mode" "$owner"
}

# _ei_replace_file TMP PATH MODE [OWNER[:GROUP]]: move TMP's content to PATH under the root (TMP is
# removed). Same-directory temporary file, then rename: readers never see half a file.
_ei_replace_file() {
    local tmp=$1 path=$2 mode=$3 owner=${4:-} dest dir staged
    dest=$(ei_path "$path")
    dir=$(dirname "$dest")
    [[ -d "$dir" ]] || mkdir -p "$dir"
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

# ei_copy_file SOURCE PATH MODE [OWNER[:GROUP]]: ei_write_file with SOURCE's content, not shown (a program,
# not a setting to read).
ei_copy_file() {
    local source=$1
    shift
    EI_HIDE_CONTENT=1 ei_write_file "$@" <"$source"
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
