"""Detection: which device profile describes the machine under a root filesystem, and why.

Every profile whose ``match`` criteria all hold against the :class:`~edgeinfer.device.host.Host`
is a candidate; the most *specific* one wins: "Pi 4 + Coral USB" (device-tree model and a USB id)
beats "Pi 4" (model only), which beats "generic aarch64" (architecture only). Detection is an
explicit call, :func:`detect`; nothing is probed at import time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ProfileError
from .host import Host, probe_host
from .profiles import PROFILE_ENV, Match, Profile, load_profiles


@dataclass(frozen=True)
class DeviceMatch:
    """The profile that describes a host, the host facts, why it matched, and every other profile that matched."""

    profile: Profile | None
    host: Host
    score: int = 0
    evidence: tuple[str, ...] = ()
    #: every matching profile as (name, specificity), best first
    ranking: tuple[tuple[str, int], ...] = ()

    @classmethod
    def named(cls, profile: Profile, host: Host, why: str) -> DeviceMatch:
        """A profile chosen by name (the caller, ``$EDGEINFER_PROFILE``) rather than matched; ``why`` says by whom."""
        return cls(profile, host, profile.specificity, (why,), ((profile.name, profile.specificity),))

    @property
    def ambiguous(self) -> bool:
        """Two profiles matched with the same specificity (a user's profile, else the first by name, was taken)."""
        return len(self.ranking) > 1 and self.ranking[0][1] == self.ranking[1][1]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for --json)."""
        return {"profile": self.profile.name if self.profile else None, "score": self.score,
                "evidence": list(self.evidence), "ranking": [list(r) for r in self.ranking],
                "host": self.host.to_dict()}


def match_evidence(match: Match, host: Host) -> tuple[str, ...] | None:
    """The evidence that ``host`` satisfies every criterion of ``match``, or None when one fails."""
    evidence: list[str] = []
    for check in (_board_evidence, _bus_evidence, _cpu_evidence):
        found = check(match, host)
        if found is None:
            return None
        evidence += found
    return tuple(evidence)


def _board_evidence(match: Match, host: Host) -> list[str] | None:
    evidence = []
    if match.device_tree_model is not None:
        if not host.model or not re.search(match.device_tree_model, host.model):
            return None
        evidence.append(f"device-tree model {host.model!r}")
    if match.tegra_release is not None:
        if host.tegra_release is None or not re.search(match.tegra_release, host.tegra_release):
            return None
        evidence.append(f"/etc/nv_tegra_release (L4T {host.l4t_string or '?'})")
    return evidence


def _bus_evidence(match: Match, host: Host) -> list[str] | None:
    evidence = []
    for key, present in (("usb", host.usb_ids), ("pci", host.pci_ids)):
        wanted = getattr(match, key)
        if wanted:
            hits = [i for i in wanted if i in present]
            if not hits:
                return None
            evidence.append(f"{key.upper()} {', '.join(hits)}")
    if match.device_nodes:
        nodes = [n for pattern in match.device_nodes for n in host.glob(pattern)]
        if not nodes:
            return None
        evidence.append(f"device node {', '.join(nodes)}")
    return evidence


def _cpu_evidence(match: Match, host: Host) -> list[str] | None:
    evidence = []
    if match.cpu_model is not None:
        if not host.cpu_model or not re.search(match.cpu_model, host.cpu_model):
            return None
        evidence.append(f"CPU {host.cpu_model!r}")
    if match.cpu_flags:
        if not set(match.cpu_flags) <= host.cpu_flags:
            return None
        evidence.append(f"CPU flags {' '.join(match.cpu_flags)}")
    if match.arch:
        if host.arch not in match.arch:
            return None
        evidence.append(f"architecture {host.arch}")
    return evidence


def detect(root: str | os.PathLike = "/", *, profiles: Mapping[str, Profile] | None = None,
           profile_dirs: Iterable[str | os.PathLike] = (), arch: str | None = None,
           env: Mapping[str, str] | None = None) -> DeviceMatch:
    """Match the profiles against ``root``; the most specific match wins (ties: by name).

    ``$EDGEINFER_PROFILE`` names a profile to use without matching (it must exist).
    """
    env = os.environ if env is None else env
    host = probe_host(root, arch=arch)
    known = load_profiles(profile_dirs, env=env) if profiles is None else profiles
    forced = env.get(PROFILE_ENV, "").strip()
    if forced:
        if forced not in known:
            raise ProfileError(f"${PROFILE_ENV}: no profile named {forced!r} (known: {', '.join(sorted(known))})")
        return DeviceMatch.named(known[forced], host, f"${PROFILE_ENV}={forced}")
    matches = []
    for profile in known.values():
        evidence = match_evidence(profile.match, host)
        if evidence is not None:
            matches.append((profile.specificity, profile.layer, profile.name, profile, evidence))
    # most specific first; on a tie the profile from a later directory (a user's) wins, then by name
    matches.sort(key=lambda m: (-m[0], -m[1], m[2]))
    if not matches:
        return DeviceMatch(None, host)
    score, _layer, _name, best, evidence = matches[0]
    return DeviceMatch(best, host, score, evidence, tuple((m[2], m[0]) for m in matches))


__all__ = ["DeviceMatch", "detect", "match_evidence"]
