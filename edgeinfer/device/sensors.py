"""Sensors a device profile names: temperatures of thermal zones and power on sysfs rails.

Each reader takes the profile (which zones, which rails) and a root filesystem (``/`` on the
device, a fake tree in tests) and returns only what exists and reads as a number.
"""

from __future__ import annotations

import glob as _glob
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .host import read_text

if TYPE_CHECKING:
    from .profiles import Profile


def read_temperatures(profile: Profile, root: str | os.PathLike = "/") -> dict[str, float]:
    """Degrees Celsius of the profile's thermal zones that exist under ``root``."""
    root_path = Path(root)
    by_type: dict[str, Path] = {}
    for zone in sorted(root_path.glob("sys/class/thermal/thermal_zone*")):
        kind = read_text(zone / "type")
        if kind:
            by_type.setdefault(kind, zone / "temp")
    temperatures: dict[str, float] = {}
    for label, where in profile.telemetry.thermal_zones:
        for choice in where.split("|"):  # alternatives, e.g. zone names that changed between releases
            path = root_path / choice.lstrip("/") if choice.startswith("/") else by_type.get(choice)
            value = _read_number(path) if path is not None else None
            if value is not None:
                temperatures[label] = value / 1000.0  # sysfs reports millidegrees
                break
    return temperatures


def read_power(profile: Profile, root: str | os.PathLike = "/") -> dict[str, float]:
    """Milliwatts on the profile's power rails that exist under ``root``."""
    host_root = Path(root)

    def first(pattern: str | None) -> float | None:
        if pattern is None:
            return None
        for hit in sorted(_glob.glob(str(host_root / pattern.lstrip("/")))):
            value = _read_number(Path(hit))
            if value is not None:
                return value
        return None

    power: dict[str, float] = {}
    for rail in profile.telemetry.power_rails:
        milliwatts = first(rail.power)
        if milliwatts is None:
            volts, amps = first(rail.voltage), first(rail.current)
            if volts is not None and amps is not None:
                milliwatts = volts * amps / 1000.0
        if milliwatts is not None:
            power[rail.name] = milliwatts
    return power


def _read_number(path: Path | None) -> float | None:
    text = read_text(path) if path is not None else None
    try:
        return float(text) if text else None
    except ValueError:
        return None


__all__ = ["read_power", "read_temperatures"]
