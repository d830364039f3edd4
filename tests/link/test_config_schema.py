"""The configuration document's schema: derived from PipelineOptions, committed into link/, and the one check that the
fleet manager (link/config_document.py, no pipeline, no agent) and the device (agent.yaml, ``agent --check``, a fleet
revision) run, with the same words naming the key."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.assets import MODELS, REPO
from support.processes import edgeinfer_cmd

from edgeinfer.agent.config import load_config
from edgeinfer.agent.document_schema import schema_module
from edgeinfer.errors import ConfigError, ConfigTooLarge
from edgeinfer.forms import regions
from edgeinfer.link.config_document import (
    MAX_DOCUMENT_BYTES,
    check_document,
    document_problems,
    encode_document,
    parse_document,
)
from edgeinfer.link.config_schema import BOOTSTRAP_KEYS, CONFIG_SCHEMA
from edgeinfer.link.schema_fast import pattern
from edgeinfer.pipeline.options import PipelineOptions
from edgeinfer.util.backoff import Backoff

SCHEMA_FILE = REPO / "edgeinfer" / "link" / "config_schema.py"
MODEL = str(MODELS / "mobilenet_v2_1.0_224_quant.tflite")
PIPELINE = CONFIG_SCHEMA["properties"]["pipelines"]["items"]["properties"]


def test_the_committed_schema_is_the_one_the_definitions_give():
    assert SCHEMA_FILE.read_text() == schema_module(), (
        "edgeinfer/link/config_schema.py is stale: regenerate it with "
        "`python -m edgeinfer.agent.document_schema > edgeinfer/link/config_schema.py`")


def test_every_option_is_a_key_with_the_choices_and_bounds_its_checks_use():
    assert set(PipelineOptions.names()) <= set(PIPELINE)
    for option in dataclasses.fields(PipelineOptions):
        schema = PIPELINE[option.name]
        if option.metadata.get("choices"):
            assert schema["enum"] == list(option.metadata["choices"])
        for word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            assert schema.get(word) == option.metadata.get(word), (option.name, word)


def _bounded_options():
    for option in dataclasses.fields(PipelineOptions):
        for word in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if word in option.metadata:
                yield option.name, word, option.metadata[word]


@pytest.mark.parametrize(("name", "word", "bound"), list(_bounded_options()))
def test_the_options_check_and_the_schema_refuse_the_same_numbers(name, word, bound):
    """Just outside each bound both refuse; on an inclusive bound both take it: one set of numbers."""
    integer = PIPELINE[name]["type"] == "integer"
    step = 1 if integer else 1e-6
    outside = {"minimum": bound - step, "exclusiveMinimum": bound, "maximum": bound + step,
               "exclusiveMaximum": bound}[word]
    with pytest.raises(ValueError, match=name):
        PipelineOptions(**{name: outside})
    problems = document_problems({"pipelines": [{"model": MODEL, "source": 0, name: outside}]})
    assert problems and problems[0].startswith(f"pipelines[0].{name}: must be ")
    if word in ("minimum", "maximum"):
        PipelineOptions(**{name: bound})
        assert document_problems({"pipelines": [{"model": MODEL, "source": 0, name: bound}]}) == []


def test_backoff_checks_the_bounds_its_schema_states():
    schema = PIPELINE["backoff"]["properties"]
    for option in dataclasses.fields(Backoff):
        for word, bound in option.metadata.items():
            assert schema[option.name][word] == bound
            outside = {"minimum": bound - 1e-6, "exclusiveMinimum": bound, "exclusiveMaximum": bound}[word]
            values = {"initial_s": 0.5, "max_s": 1.0, option.name: outside}
            with pytest.raises(ValueError, match="invalid backoff"):
                Backoff(**values)
            assert document_problems({"pipelines": [{"model": MODEL, "source": 0, "backoff": values}]})


def test_lines_and_zones_are_stated_by_regions_the_one_definition():
    """The schema's lines and zones are forms.regions' text form: its pattern (the name rule inside it), its bounds (the
    most lines and zones, a zone's points) and its words, never a second copy."""
    for key, kind in (("lines", "line"), ("zones", "zone")):
        rule = regions.text_rule(kind)
        schema = PIPELINE[key]
        assert schema["maxItems"] == rule["maxItems"] == (regions.MAX_LINES if kind == "line" else regions.MAX_ZONES)
        assert schema["items"]["pattern"] == rule["pattern"] and regions.NAME_PATTERN[1:-1] in rule["pattern"]
        assert schema["items"]["errorMessage"] == f"must be {rule['form']}" and regions.NAME_FORM in rule["form"]
    assert f"{{{regions.MIN_ZONE_POINTS - 1},{regions.MAX_ZONE_POINTS - 1}}}" in regions.ZONE_TEXT_PATTERN


def _reads(kind: str, text: str) -> bool:
    """What the device reads as a line / zone text, bounds and shapes aside (they are checked once it is read)."""
    name, rest = regions.named_text(text, f"{kind}1")
    try:
        shape = regions.parse_line(rest) if kind == "line" else regions.parse_zone(rest)
    except ValueError:
        return False
    return regions.name_problem(name, kind) is None and len(shape) <= regions.MAX_ZONE_POINTS


def _texts(seed: int, count: int) -> list[str]:
    """Line and zone texts, and near misses: one to three characters inserted, dropped or replaced."""
    rng = random.Random(seed)
    seeds = ["10,400,300,400", "door=10,400,300,400", " front door = 1.5, 2e1 ; 3 ,4 ", ",1,,2;3,4,", "-1,+2,.5,6.",
             "0,0,9,0,9,9", "shop=0,0;630,10;630,330;400,330", "a.b_c-d=1,2,3,4,5,6,7,8",
             ",".join(["1,2"] * 64), ",".join(["1,2"] * 65)]
    alphabet = "0123456789.,; =-+eE/:a\té"
    texts = list(seeds)
    while len(texts) < count:
        text = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            where = rng.randrange(len(text) + 1)
            action = rng.choice(("insert", "drop", "replace"))
            if action == "insert":
                text.insert(where, rng.choice(alphabet))
            elif text and where < len(text):
                text[where: where + 1] = [] if action == "drop" else [rng.choice(alphabet)]
        texts.append("".join(text))
    return texts


def test_the_text_patterns_take_exactly_what_the_device_reads():
    """A document's check (the schema's pattern) and the device's reader (regions.parse_line / parse_zone) agree
    on every text: the schema refuses no line the device would read, and passes none it would not."""
    for kind, rule in (("line", regions.LINE_TEXT_PATTERN), ("zone", regions.ZONE_TEXT_PATTERN)):
        matches = pattern(rule).search
        disagree = [text for text in _texts(7, 3000) if bool(matches(text)) != _reads(kind, text)]
        assert not disagree, (kind, disagree[:5])


#: (a document, the words it is refused with: the key first)
REFUSED = [
    ({"pipelines": [{"model": MODEL, "source": 0, "max_fps": -1}]},
     "pipelines[0].max_fps: must be a number > 0, got -1"),
    ({"pipelines": [{"model": MODEL, "source": 0, "max_fps": "fast"}]},
     "pipelines[0].max_fps: must be a number, got 'fast'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "score_threshold": 1.5}]},
     "pipelines[0].score_threshold: must be a number <= 1, got 1.5"),
    ({"pipelines": [{"model": MODEL, "source": 0, "task": "dance"}]},
     "pipelines[0].task: must be one of classify, detect, pose, segment, obb, got 'dance'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "decoder": "yolo 9000"}]},
     "pipelines[0].decoder: must be a decoder's name (a built-in's or an installed plug-in's), got 'yolo 9000'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "modle": "x"}]}, "pipelines[0].modle: unknown key — did you mean "
                                                                   "'model'?"),
    ({"pipelines": [{"model": MODEL, "source": 0, "loop": "yes"}]}, "pipelines[0].loop: must be true or false, got "
                                                                    "'yes'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "size": "big"}]},
     "pipelines[0].size: must be WIDTHxHEIGHT such as 640x480, or [640, 480], got 'big'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "samples_per_minute": 0}]},
     "pipelines[0].samples_per_minute: must be an integer >= 1, got 0"),
    ({"pipelines": [{"model": MODEL, "source": 0, "backoff": {"intial_s": 1}}]},
     "pipelines[0].backoff.intial_s: unknown key — did you mean 'initial_s'?"),
    ({"pipelines": [{"model": MODEL, "source": 0, "lines": [[1, 2]]}]},
     f"pipelines[0].lines[0]: must be {regions.LINE_TEXT_FORM}, got a JSON array"),
    # lines and zones: forms.regions' form, bounds and shapes, in its words (the device's, the manager's)
    ({"pipelines": [{"model": MODEL, "source": 0, "lines": "door/1=10,400,300,400"}]},
     f"pipelines[0].lines[0]: must be {regions.LINE_TEXT_FORM}, got 'door/1=10,400,300,400'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "zones": ["shop=0,0,9,0"]}]},
     f"pipelines[0].zones[0]: must be {regions.ZONE_TEXT_FORM}, got 'shop=0,0,9,0'"),
    ({"pipelines": [{"model": MODEL, "source": 0, "lines": [f"l{i}=0,0,9,9" for i in range(33)]}]},
     "pipelines[0].lines: must be a list of at most 32 lines (or one line)"),
    ({"pipelines": [{"model": MODEL, "source": 0, "lines": ["door=5,5,5,5"]}]},
     "pipelines[0]: line 'door' has no length"),
    ({"pipelines": [{"model": MODEL, "source": 0, "lines": ["door=0,0,16385,5"]}]},
     "pipelines[0]: line 'door': coordinates are source pixels from 0 to 16384, not 16385.0"),
    ({"pipelines": [{"model": MODEL, "source": 0, "zones": ["shop=0,0,10,10,20,20"]}]},
     "pipelines[0]: zone 'shop' encloses no area"),
    ({"pipelines": [{"model": MODEL, "source": 0, "lines": ["door=0,0,9,9"], "zones": ["door=0,0,9,0,9,9"]}]},
     "pipelines[0]: the name 'door' is used twice"),
    ({"pipelines": [{"model": MODEL, "source": 0, "task": "classify", "lines": ["door=0,0,9,9"]}]},
     "pipelines[0]: tracking, lines and zones need a task with boxes (detect, pose, segment, obb), not 'classify'"),
    ({"pipelines": [{"source": 0}]}, "pipelines[0]: missing required key 'model'"),
    ({"pipelines": [{"model": MODEL}]}, "pipelines[0].source: required"),
    ({"pipelines": [{"model": MODEL, "source": 0, "sources": [1]}]},
     "pipelines[0].sources: give either source (one stream) or sources (several), not both"),
    ({"pipelines": [{"model": MODEL, "sources": [0, {"name": "stream0", "source": 1}]}]},
     "pipelines[0].sources[1]: two streams are named 'stream0'; stream names must be unique"),
    ({"pipelines": [{"model": MODEL, "source": 0}, {"name": "main", "model": MODEL, "source": 1}]},
     "pipelines: two pipelines are named 'main'; names must be unique"),
    ({"pipelines": [{"model": MODEL, "source": 0, "name": "front door"}]},
     "pipelines[0].name: must be 1-64 of A-Z a-z 0-9 . _ - (starting with a letter or digit), got 'front door'"),
    ({"pipelines": {"main": {}}}, "pipelines: must be an array, got a JSON object"),
    ({"pipelines": [{"model": MODEL, "source": 0}] * 33}, "pipelines: allows at most 32 items"),
    ({"telemetry_interval_s": 0}, "telemetry_interval_s: must be a number >= 0.01, got 0"),
]


@pytest.mark.parametrize(("document", "words"), REFUSED)
def test_a_refused_document_names_its_key_in_the_same_words_on_the_manager_and_the_device(tmp_path, document, words):
    problems = document_problems(document)  # the fleet manager's check (link/ only)
    assert problems and problems[0].startswith(words), problems
    with pytest.raises(ConfigError) as refused:
        check_document(document)
    assert str(refused.value).startswith(problems[0])
    path = tmp_path / "agent.yaml"  # the device: the same keys in agent.yaml, the same words after the file's name
    path.write_text(yaml.safe_dump({"device_id": "cam-01", **document}))
    with pytest.raises(ConfigError) as device:
        load_config(path)
    assert str(device.value) == f"{path}: {problems[0]}"


def test_a_decoder_the_device_has_not_installed_passes_the_manager_and_the_device_names_those_it_has(tmp_path):
    """The manager cannot know a device's decoder plug-ins: any decoder's name is its to send; the device refuses
    one it has neither built in nor installed, listing what it has."""
    document = {"pipelines": [{"model": MODEL, "source": 0, "decoder": "yolo9000"}]}
    assert document_problems(document) == []
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"device_id": "cam-01", **document}))
    with pytest.raises(ConfigError) as device:
        load_config(path)
    assert str(device.value).startswith(f"{path}: pipelines[0].decoder: must be one of tflite-ssd, yolox, ")
    assert str(device.value).endswith("not 'yolo9000'")


def test_agent_check_refuses_with_the_managers_words_and_exit_78(tmp_path):
    document, _ = REFUSED[0]
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"device_id": "cam-01", "data_dir": str(tmp_path / "d"), **document}))
    result = subprocess.run(edgeinfer_cmd("agent", "--config", str(path), "--check"), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 78
    assert result.stderr.strip() == f"edgeinfer: error: {path}: {document_problems(document)[0]}"


def test_the_bootstrap_is_agent_yamls_alone():
    assert {"device_id", "broker", "password", "password_file", "data_dir", "update_public_key"} <= set(BOOTSTRAP_KEYS)
    assert set(BOOTSTRAP_KEYS).isdisjoint(CONFIG_SCHEMA["properties"])
    for key in ("broker", "device_id", "update_public_key", "data_dir"):
        assert document_problems({key: "x", "pipelines": []}) == [
            f"{key}: set only in the device's agent.yaml (it is the device's bootstrap), not by the fleet"]


def test_a_huge_document_is_refused_by_its_size_before_it_is_read():
    line = {"model": MODEL, "source": 0, "lines": [f"l{i}=0,0,10,10" for i in range(64)]}
    huge = json.dumps({"pipelines": [line] * 32, "padding": "x" * MAX_DOCUMENT_BYTES}).encode()
    with pytest.raises(ConfigTooLarge, match=rf"the document is {len(huge)} bytes; at most {MAX_DOCUMENT_BYTES}"):
        parse_document(huge)
    with pytest.raises(ConfigError, match="nests deeper than 16 levels"):
        parse_document(b"[" * 40 + b"]" * 40)
    with pytest.raises(ConfigError, match=r"\(top level\): not a JSON document"):
        parse_document(b'{"telemetry_interval_s": NaN}')
    with pytest.raises(ConfigError, match=r"\(top level\): must be an object"):
        parse_document(b"[]")


def test_a_document_is_read_as_agent_yaml_is():
    """YAML's forms: a null is the key left out, a number where text is wanted is its text, one rule a list of one;
    the normal form is what the device is given, and its canonical bytes are what a revision's hash is taken of."""
    document = {"pipelines": [{"model": MODEL, "source": 0, "version": 3, "threads": None, "lines": "door=1,2,3,4",
                               "events": [], "opencv_threads": None, "size": [640, 480]}]}
    assert check_document(document) == {"pipelines": [{
        "model": MODEL, "source": 0, "version": "3", "lines": ["door=1,2,3,4"], "events": [], "opencv_threads": None,
        "size": [640, 480]}]}
    assert parse_document(encode_document(document)) == check_document(document)
    assert encode_document({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


def test_the_fleet_manager_reads_the_schema_without_the_pipeline_or_the_agent():
    code = ("import sys, edgeinfer.link.config_document as d; d.check_document({'pipelines': []}); "
            "print(sorted(m for m in sys.modules if m.startswith(('edgeinfer.pipeline', 'edgeinfer.agent', 'numpy'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(REPO), check=True)
    assert result.stdout.strip() == "[]"
