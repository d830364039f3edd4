"""What this device runs: software versions and delegates, as the ``state`` (birth) message reports them."""

from __future__ import annotations

import logging
import platform
from typing import Any

from .._version import __version__
from ..link.protocol import PROTOCOL_VERSION

log = logging.getLogger(__name__)

#: the packages whose versions the state message reports (read from metadata, never imported)
VERSION_PACKAGES = ("paho-mqtt", "ai-edge-litert", "tflite-runtime", "onnxruntime", "openvino", "numpy",
                    "opencv-python-headless")


def software_versions() -> dict[str, str | None]:
    """edgeinfer, Python and the installed runtimes' versions, read from package metadata (nothing imported)."""
    from ..util.dist import versions

    out: dict[str, str | None] = {"edgeinfer": __version__, "python": platform.python_version(),
                                  "protocol": str(PROTOCOL_VERSION)}
    out.update(versions(VERSION_PACKAGES))
    return out


def delegate_report(profile: Any = None, root: str = "/") -> list[dict[str, Any]]:
    """Every registered delegate with ``available`` and the reason when it is not.

    With a device profile: its delegate plan for this host (its order first, then the others),
    as ``edgeinfer device --json`` lists it.
    """
    if profile is not None:
        try:
            from ..runtime.selection import plan

            return plan(None, profile=profile, root=root, include_others=True).to_dict()["delegates"]
        except Exception as exc:  # the report must never stop the agent
            log.warning("delegate plan for profile %s failed (%s); listing delegates without it",
                        getattr(profile, "name", profile), exc)
    from ..runtime.delegates.registry import delegate_names, get_delegate

    out = []
    for name in delegate_names():
        try:
            reason = get_delegate(name).unavailable_reason()
        except Exception as exc:  # a broken third-party delegate must not stop the report
            reason = f"cannot load the delegate: {exc}"
        out.append({"name": name, "available": reason is None, "reason": reason})
    return out
