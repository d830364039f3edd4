"""**The** redaction of secrets in text a device or the fleet shows or sends: its log lines (the ring the fleet may
ask for, agent/log_ring.py; the lines the manager stores, fleet/diagnosis.py), its doctor's report, and every
stream URL named in a log or an error (capture/media.py). One function, so what is masked is the same everywhere.

What it masks: a URL's password (``rtsp://user:***@host``; user info without a password whole: a token is often
sent as the user name), the credential after ``Bearer``/``Basic``/``Digest``, the secret part of the fleet's API
tokens (``eit_<id>_***``), the value of a ``key=value`` / ``key: value`` whose key names a secret (``password``,
``token``, ``secret``, ``api_key``, ``grant``, ``signature``, ``credentials``…; ``password_file`` is left alone), and a
PEM private key.
"""

from __future__ import annotations

import re
from typing import Any

#: what stands where a secret was
MASK = "***"

# A URL's user info: everything up to the last "@" before the authority ends ("/", "?", "#"), as ffmpeg and
# OpenCV split it, so a password holding an unencoded "@" is masked whole. A user name is kept when a password
# follows it; user info without a colon is masked (a token is often sent as the user name).
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^\s/?#@'\"<>]*(?:@[^\s/?#@'\"<>]*)*)@")
# Authorization header values: the scheme stays, the credential goes (an API token: its id stays, below)
_AUTH_SCHEME = re.compile(
    r"(?i)\b(?P<scheme>Bearer|Basic|Digest)(?P<gap>\s+)(?!eit_[0-9a-f]{12}_)[A-Za-z0-9._~+/=-]{6,}")
# the fleet's API tokens (eit_<12 hex id>_<secret>): the id stays, it names the token without opening anything
_API_TOKEN = re.compile(r"\b(?P<id>eit_[0-9a-f]{12}_)[A-Za-z0-9_-]{8,}")
# key = value and key: value (YAML, JSON, query strings, headers) where the key names a secret; a key that only
# mentions one (``password_file``) is left alone
_SECRET_WORDS = (r"pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|private[_-]?key|auth(?:orization)?"
                 r"|credentials?|grant|sig(?:nature)?|session[_-]?id|cookie")
_KEY_VALUE = re.compile(
    rf"(?i)(?P<key>\b[A-Za-z0-9_.-]*?(?:{_SECRET_WORDS}))(?P<sep>[\"']?\s*[=:]\s*[\"']?)"
    r"(?P<value>[^\s&\"',;(){}\[\]]+)")
_PEM = re.compile(r"-----BEGIN (?P<kind>[A-Z0-9 ]*PRIVATE KEY)-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
                  re.DOTALL)


def _userinfo(match: re.Match[str]) -> str:
    user, colon, _secret = match.group("info").partition(":")
    return f"{match.group('scheme')}{user}:{MASK}@" if colon else f"{match.group('scheme')}{MASK}@"


def redact(text: str) -> str:
    """``text`` with the secrets it may hold masked: passwords in URLs (``rtsp://user:***@host``), credentials
    after ``Bearer``/``Basic``, API tokens, ``password=…``/``token: …``-like values, private keys (PEM)."""
    if not text:
        return text
    text = _PEM.sub(lambda m: f"-----BEGIN {m.group('kind')}----- {MASK} -----END {m.group('kind')}-----", text)
    text = _URL_USERINFO.sub(_userinfo, text)
    text = _API_TOKEN.sub(lambda m: f"{m.group('id')}{MASK}", text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group('scheme')}{m.group('gap')}{MASK}", text)
    return _KEY_VALUE.sub(lambda m: f"{m.group('key')}{m.group('sep')}{MASK}", text)


def redact_values(value: Any) -> Any:
    """A JSON value with :func:`redact` applied to every string in it (a doctor report)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_values(item) for item in value]
    if isinstance(value, dict):
        return {key: redact_values(item) for key, item in value.items()}
    return value
