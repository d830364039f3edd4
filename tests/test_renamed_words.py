"""Words that mean one thing (docs/architecture.md, *Words*): dataset sampling is *sample*, no longer *capture* (the
cameras' word). Each new name works, and each old name still does where someone may have written it — agent.yaml,
a configuration document, ``Pipeline(...)``, ``edgeinfer run``'s flags, ``fleet dataset``'s command, the device
command, the event a device of an older version sends, a stored command record — read as the new name."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner
from support.pipeline import ULTRAFACE
from support.processes import edgeinfer_cmd
from support.scenes import make_scene_clip

from edgeinfer.agent.config import load_config
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError
from edgeinfer.fleet.verdicts import record
from edgeinfer.link.config_document import check_document, document_problems
from edgeinfer.link.protocol import validate
from edgeinfer.link.vocabulary import Command, EventKind
from edgeinfer.pipeline.options import RENAMED_OPTIONS, PipelineOptions

OLD_KEYS = {"capture": ["random:1"], "capture_dir": "kept", "capture_max_mb": 5, "capture_per_minute": 7}
NEW_KEYS = {"sample": ["random:1"], "samples_dir": "kept", "samples_max_mb": 5, "samples_per_minute": 7}


def _agent_yaml(tmp_path, **keys):
    pipeline = {"name": "door", "model": str(ULTRAFACE), "source": 0, "task": "detect", **keys}
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({"device_id": "cam-01", "broker": "mqtt://127.0.0.1:1883", "pipelines": [pipeline]}))
    return path


def _sampling(options: PipelineOptions) -> tuple:
    return tuple(options.sample), options.samples_dir, options.samples_max_mb, options.samples_per_minute


def test_the_old_option_names_are_the_new_ones_and_nothing_else():
    assert {old: new for old, new in zip(OLD_KEYS, NEW_KEYS)} == RENAMED_OPTIONS
    assert set(RENAMED_OPTIONS.values()) <= set(PipelineOptions.names())
    assert not set(RENAMED_OPTIONS) & set(PipelineOptions.names())


@pytest.mark.parametrize("keys", [NEW_KEYS, OLD_KEYS], ids=["name", "old name"])
def test_agent_yaml_takes_a_sampling_key_by_its_name_and_its_old_name(tmp_path, keys):
    options = load_config(_agent_yaml(tmp_path, **keys)).pipelines[0].options
    assert _sampling(options) == (("random:1",), str(tmp_path / "kept"), 5.0, 7)


def test_agent_yaml_refuses_a_key_under_both_names(tmp_path):
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.capture: the old name of sample; give sample alone"):
        load_config(_agent_yaml(tmp_path, sample=["random:1"], capture=["random:0.5"]))


@pytest.mark.parametrize("keys", [NEW_KEYS, OLD_KEYS], ids=["name", "old name"])
def test_a_configuration_document_takes_the_old_names_and_keeps_the_new(keys):
    document = {"pipelines": [{"name": "door", "model": "m.onnx", "source": "door.mp4", **keys}]}
    assert document_problems(document) == []
    checked = check_document(document)["pipelines"][0]
    assert {key: checked[key] for key in NEW_KEYS} == NEW_KEYS and not set(OLD_KEYS) & set(checked)


def test_a_configuration_document_refuses_a_key_under_both_names():
    document = {"pipelines": [{"model": "m.onnx", "source": 0, "samples_dir": "a", "capture_dir": "b"}]}
    assert document_problems(document) == [
        "pipelines[0].capture_dir: the old name of samples_dir; give samples_dir alone"]


@pytest.mark.parametrize("keys", [NEW_KEYS, OLD_KEYS], ids=["name", "old name"])
def test_pipeline_options_take_the_old_names(keys):
    assert _sampling(PipelineOptions.merged(None, keys)) == (("random:1",), "kept", 5, 7)
    with pytest.raises(TypeError, match="capture: the old name of sample"):
        PipelineOptions.merged(None, {"sample": ["random:1"], "capture": ["random:1"]})


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return make_scene_clip(tmp_path_factory.mktemp("scene") / "scene.avi")


@pytest.mark.parametrize("flags", [("--sample", "--samples-dir", "--samples-per-minute"),
                                   ("--capture", "--capture-dir", "--capture-per-minute")], ids=["name", "old name"])
def test_run_keeps_samples_by_the_new_flags_and_the_old(tmp_path, clip, flags):
    rule, folder, rate = flags
    done = subprocess.run(edgeinfer_cmd("run", str(ULTRAFACE), "-s", str(clip), "--task", "detect", "--max-frames",
                                        "5", "--json", rule, "random:1", folder, str(tmp_path / "kept"), rate, "100"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["type"] == "summary" and summary["samples"]["written"] == 5, summary
    assert len([p for p in (tmp_path / "kept").iterdir() if p.is_dir()]) == 5


def test_run_lists_the_new_flags_only():
    shown = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--sample RULE" in shown and "--samples-dir" in shown and "--capture" not in shown


def test_fleet_dataset_sample_and_its_old_name():
    runner = CliRunner()
    listed = runner.invoke(main, ["fleet", "dataset", "--help"]).output
    assert "  sample " in listed and "capture" not in listed  # the old name works, unlisted
    for name in ("sample", "capture"):
        shown = runner.invoke(main, ["fleet", "dataset", name, "--help"])
        assert shown.exit_code == 0 and "--frames" in shown.output, shown.output


def test_the_device_command_and_the_event_have_their_names_and_old_names():
    assert (Command.SAMPLE.value, Command.CAPTURE.value) == ("sample", "capture")
    assert (EventKind.SAMPLE_FAILED.value, EventKind.CAPTURE_FAILED.value) == ("sample_failed", "capture_failed")
    for word in ("sample_failed", "capture_failed"):  # a device of an older version sends the old one
        message = {"v": 1, "type": "event", "fleet": "f", "device": "d", "ts": 1.0, "boot_id": "a" * 32, "seq": 2,
                   "event": word, "level": "warning", "message": "disk full", "pipeline": "door", "cmd_id": None,
                   "data": {"error": "disk full"}}
        assert validate("events", message)["event"] == word


@pytest.mark.parametrize("cmd", ["sample", "capture"], ids=["name", "old name"])
def test_a_stored_sample_command_says_what_came_of_it_under_either_word(cmd):
    row = {"command_id": "c" * 32, "device_id": "cam-1", "cmd": cmd, "pipeline": "door", "summary": {"frames": 5},
           "state": "applied", "result": {"frames": 5, "streams": [""]}, "samples_stored": 2,
           "samples_duplicates": 3, "sent_at": 1.0, "expires_at": 1e12, "updated_at": 2.0}
    found = record(row, 3.0)
    assert found["samples"] == {"requested": 5, "stored": 2, "duplicates": 3}
    assert found["text"] == "5 frames sampled: 2 stored, 3 near-duplicates of stored samples"
