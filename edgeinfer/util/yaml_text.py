"""**The** safe YAML reading and writing of files the agent reads and writes often, through libyaml when PyYAML was
built with it (its C parser and emitter: the pure-Python ones cost ~0.4 ms a small document, and a simulator writes
thousands of identities, a device reads its profiles at each start). Both are PyYAML's *safe* flavour either way;
``yaml.YAMLError`` is what a bad document raises, as with ``yaml.safe_load``."""

from __future__ import annotations

from typing import Any


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, by libyaml when present."""
    import yaml  # here: PyYAML is not imported by whoever never reads YAML

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def dump_yaml(data: Any, **options: Any) -> str:
    """``yaml.safe_dump(data, **options)``, by libyaml when present."""
    import yaml

    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), **options)
