"""edgeinfer.util.config: one keyed reader for agent.yaml and the device profiles, errors naming the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.errors import ConfigError, ProfileError
from edgeinfer.util.config import KeyedReader, read_document, suggestion


def lenient(data: dict, where: str = "") -> KeyedReader:
    return KeyedReader(data, where, "agent.yaml", error=ConfigError, base=Path("/etc/edgeinfer"))


def strict(data: dict) -> KeyedReader:
    return KeyedReader(data, "", "board.yaml", error=ProfileError, strict=True)


def test_typed_accessors_and_defaults():
    r = lenient({"max_fps": 5, "size": "640x480", "loop": True, "spool": "64MiB", "model": "m.tflite",
                 "mqtt_version": 5, "threads": None})
    assert r.number("max_fps", None, above=0) == 5 and r.number("missing", 2.5) == 2.5
    assert r.pair("size") == (640, 480) and r.boolean("loop", False) is True
    assert r.size("spool", 0, minimum=1024) == 64 * 1024 * 1024
    assert r.path("model") == "/etc/edgeinfer/m.tflite"
    assert r.string("mqtt_version") == "5"  # lenient: a number is read as its text
    assert r.positive_int("threads", 4) == 4 and not r.has("threads") and r.is_null("threads")  # null: left out


def test_the_error_class_is_the_readers_and_the_message_names_file_and_key():
    with pytest.raises(ConfigError) as info:
        lenient({"max_fps": -1}, "pipelines[0].").number("max_fps", None, above=0)
    assert str(info.value) == "agent.yaml: pipelines[0].max_fps: must be a number > 0, got -1"
    with pytest.raises(ProfileError) as info:
        strict({"match": {"usb": ["1a6e:089a", ""]}}).mapping("match").strings("usb")
    assert str(info.value) == "board.yaml: match.usb[1]: must be a non-empty string, got ''"


def test_strict_reads_a_present_key_as_written():
    r = strict({"name": 42, "description": None, "threads": None, "camera": None, "delegates": "xnnpack"})
    with pytest.raises(ProfileError, match=r"^board\.yaml: name: must be a non-empty string, got 42$"):
        r.string("name")
    with pytest.raises(ProfileError, match=r"^board\.yaml: description: must be a non-empty string, got None$"):
        r.string("description")
    assert r.positive_int("threads", nullable=True) is None and r.mapping("camera", nullable=True) is None
    assert r.strings("delegates") == ("xnnpack",)  # a lone string is a list of one
    with pytest.raises(ProfileError, match=r"^board\.yaml: threads: must be a positive integer, got None$"):
        r.positive_int("threads")


def test_regex_items_and_the_top_level():
    r = strict({"model": "Pi (4", "l4t": 35})
    with pytest.raises(ProfileError, match=r"^board\.yaml: model: is not a valid regular expression \("):
        r.regex("model")
    releases = r.items("l4t")
    assert dict(releases.data) == {"l4t[0]": 35} and releases.positive_int("l4t[0]") == 35
    with pytest.raises(ProfileError, match=r"^board\.yaml: \(top level\): must be a mapping, got list$"):
        read_document(["a"], "board.yaml", ("name",), error=ProfileError)


def test_unknown_keys_get_the_closest_known_one_or_the_list():
    with pytest.raises(ConfigError) as info:
        lenient({"delegate": 1}).check_unknown({"delegates", "threads"})
    assert str(info.value) == "agent.yaml: delegate: unknown key — did you mean 'delegates'?"
    nested = strict({"telemetry": {"power_rails": {"vdd_in": {"pwr": "/x"}}}}).mapping("telemetry")
    with pytest.raises(ProfileError) as info:
        nested.mapping("power_rails").mapping("vdd_in", ("power", "voltage", "current"))
    assert str(info.value) == "board.yaml: telemetry.power_rails.vdd_in.pwr: unknown key — did you mean 'power'?"
    # a sequence is listed in its order, a set sorted
    assert suggestion("zzz", ("power", "voltage", "current")) == " (known: power, voltage, current)"
    assert suggestion("zzz", {"power", "voltage", "current"}) == " (known: current, power, voltage)"
