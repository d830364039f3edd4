"""Modules the agent's process imports only when something uses them (docs/agent.md, "Footprint").

paho-mqtt imports ``ssl``, ``hashlib`` and ``urllib.request``, and PySocks when it is installed, at its
own import: for TLS, the WebSocket handshake and proxies. An agent on a plain ``mqtt://`` broker uses
none of them, and together they are ~8 MiB resident (OpenSSL's libcrypto alone 3.4 MiB; ``urllib.request``
brings ``http.client`` and ``email``), measured with bench/footprint.py. :func:`defer_imports` puts a
stand-in for each in ``sys.modules``: every ``import`` of it succeeds, and the real module is imported the
first time one of its attributes is used — a TLS broker, a proxy or an update download loads what it
needs then, exactly as before.

Why not :class:`importlib.util.LazyLoader`: its module loads as soon as anything reads its ``__spec__``,
and every later ``import`` statement does (CPython's import checks ``__spec__._initializing``), so paho's
own ``import ssl`` would load it. The stand-in has a spec of its own and loads on a missing attribute.

Only the agent command calls it, at its start, before anything has imported these (a module already
imported is left as it is).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

#: what paho imports at its own import and an agent on a plain broker never uses
AGENT_DEFERRED = ("ssl", "hashlib", "urllib.request", "socks")

_load_lock = threading.RLock()


class DeferredModule(types.ModuleType):
    """Stands for a module in ``sys.modules`` until an attribute of it is first used; then imports it and
    takes on its namespace (so code that imported the stand-in sees the real module's objects)."""

    def __init__(self, spec: Any) -> None:
        super().__init__(spec.name)
        self.__spec__ = spec  # what the import system reads (not initialising): `import name` returns this

    def __getattr__(self, attribute: str) -> Any:  # only for what is not in the namespace yet
        real = _load(self)
        return getattr(real, attribute)


def _load(stand_in: DeferredModule) -> types.ModuleType:
    name = stand_in.__name__
    with _load_lock:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
            try:
                real = importlib.import_module(name)
            except BaseException:
                sys.modules[name] = stand_in
                raise
            stand_in.__dict__.update(real.__dict__)
        return sys.modules[name]


def defer_imports(names: tuple[str, ...] = AGENT_DEFERRED) -> list[str]:
    """Put a :class:`DeferredModule` in ``sys.modules`` for each of ``names`` not imported yet; the names
    deferred. A module that is not installed is left alone (its importers see their ImportError as before)."""
    deferred = []
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)  # imports a dotted name's parent package (small: `urllib`)
        if spec is None:
            continue
        sys.modules[name] = stand_in = DeferredModule(spec)
        parent, _, child = name.rpartition(".")
        if parent:  # as the import system does for a submodule: `urllib.request` is urllib's attribute
            setattr(sys.modules[parent], child, stand_in)
        deferred.append(name)
    return deferred


def prefer_builtin_hashes() -> bool:
    """Make ``hashlib`` use Python's own hash implementations instead of OpenSSL's: the agent hashes a model
    file at start (sha256) and an update's artifact, and OpenSSL's libcrypto is 3.4 MiB resident for that.
    Python's sha256 is slower (290 MB/s against OpenSSL's 1,600 here: a 14 MB model in ~50 ms), which an
    agent pays once per model and update.
    A TLS broker still loads OpenSSL through ``ssl``. False (nothing done) when hashlib is already imported
    or this Python was built without its own sha256."""
    if "hashlib" in sys.modules and not isinstance(sys.modules["hashlib"], DeferredModule):
        return False
    if not any(importlib.util.find_spec(name) for name in ("_sha2", "_sha256")):  # 3.12+, 3.10-3.11
        return False
    sys.modules.setdefault("_hashlib", None)  # hashlib's own fallback when OpenSSL is absent
    return sys.modules["_hashlib"] is None


def is_deferred(name: str) -> bool:
    """Whether ``name`` is a stand-in that nothing has used yet."""
    return isinstance(sys.modules.get(name), DeferredModule) and "__file__" not in sys.modules[name].__dict__
