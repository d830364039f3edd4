"""``edgeinfer agent --check`` opens each pipeline's model as its run reads it, and every configuration error is exit
78 (EX_CONFIG: the systemd unit does not restart on it) — at ``--check``, and when a real agent's pipeline cannot
start as configured. The rules are checked against the model with the words ``edgeinfer run`` and ``Pipeline(...)``
use (pipeline/rule_check.py)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

from support.agent import AgentProcess, agent_config, write_config
from support.assets import IMAGES, LABELS, MODELS
from support.broker import Collector
from support.processes import edgeinfer_cmd

from edgeinfer.agent.config import parse_config
from edgeinfer.agent.config_check import source_problems

SSD = MODELS / "mobilenet_ssd_v2_coco_quant_postprocess.tflite"
COCO = LABELS / "coco_labels.txt"
EX_CONFIG = 78
DID_YOU_MEAN = f"event rule 'detection:0.8/persn': {SSD.name} has no label 'persn' — did you mean 'person'?"


def _check(tmp_path: Path, *pipelines: dict) -> subprocess.CompletedProcess:
    path = write_config(tmp_path / "agent.yaml", device_id="cam-01", data_dir=str(tmp_path / "data"),
                        pipelines=list(pipelines))
    return subprocess.run(edgeinfer_cmd("agent", "--config", str(path), "--check"), capture_output=True, text=True,
                          timeout=120)


def _door(**values) -> dict:
    return {"name": "door", "model": str(SSD), "labels": str(COCO), "source": str(IMAGES), **values}


def _error(result: subprocess.CompletedProcess) -> str:
    [line] = [line for line in result.stderr.splitlines() if line.startswith("edgeinfer: error:")]
    assert "Traceback" not in result.stderr
    return line


def test_check_refuses_a_model_that_is_not_there_or_is_cut(tmp_path):
    missing = tmp_path / "models" / "gone.tflite"
    result = _check(tmp_path, _door(model=str(missing)))
    assert result.returncode == EX_CONFIG, result.stderr
    assert _error(result) == (f"edgeinfer: error: {tmp_path / 'agent.yaml'}: pipelines[0].model: model not found: "
                              f"{missing} — check the path")
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(SSD.read_bytes()[: SSD.stat().st_size // 3])
    result = _check(tmp_path, _door(), _door(name="yard", model=str(cut)))  # the second pipeline's model
    assert result.returncode == EX_CONFIG and f"pipelines[1].model: {cut}" in _error(result), result.stderr
    assert not (tmp_path / "data").exists()  # --check starts nothing


def test_check_reads_the_model_as_the_run_does_without_opening_the_source(tmp_path):
    result = _check(tmp_path, _door(source="/dev/video99", events=["detection:0.8/person"],
                                    capture=["uncertain:0.5-0.7/person,kite"]))
    assert result.returncode == 0, result.stderr
    [model] = json.loads(result.stdout)["models"]
    assert (model["pipeline"], model["task"], model["layout"]) == ("door", "detect", "tflite-ssd")
    assert model["warnings"] == []
    assert model["labels"] == len(COCO.read_text().splitlines()) and len(model["sha256"]) == 64
    # a decoder the outputs do not fit is the configuration's too
    mismatch = _check(tmp_path, _door(decoder="yolo"))
    assert mismatch.returncode == EX_CONFIG and "pipelines[0].model:" in _error(mismatch), mismatch.stderr


def test_check_refuses_a_rule_naming_a_label_the_model_does_not_have(tmp_path):
    result = _check(tmp_path, _door(events=["detection:0.8/persn"]))
    assert result.returncode == EX_CONFIG, result.stderr
    assert _error(result) == f"edgeinfer: error: {tmp_path / 'agent.yaml'}: pipelines[0].events: {DID_YOU_MEAN}"
    capture = _check(tmp_path, _door(capture=["event:detection:0.9/dgo"]))
    assert capture.returncode == EX_CONFIG
    assert "pipelines[0].capture: capture rule 'event:detection:0.9/dgo'" in _error(capture)
    assert "has no label 'dgo' — did you mean 'dog'?" in _error(capture)
    # an uncertain band the score threshold hides is refused, saying so; lowered, it is accepted
    band = _check(tmp_path, _door(capture=["uncertain:0.3-0.6"]))
    assert band.returncode == EX_CONFIG and "the band starts below score_threshold 0.5" in _error(band)
    assert _check(tmp_path, _door(capture=["uncertain:0.3-0.6"], score_threshold=0.3)).returncode == 0


def test_a_model_without_labels_cannot_have_its_rules_checked_a_warning(tmp_path):
    result = _check(tmp_path, _door(labels=None, events=["detection:0.8/person"]))
    assert result.returncode == 0, result.stderr
    [warning] = json.loads(result.stdout)["models"][0]["warnings"]
    assert f"{SSD.name} has no labels" in warning and "'person' cannot be checked" in warning
    assert "cannot be checked" in result.stderr  # logged too


def test_run_refuses_the_rule_with_the_same_words(tmp_path):
    result = subprocess.run(edgeinfer_cmd("run", str(SSD), "--labels", str(COCO), "-s", str(IMAGES), "--event",
                                          "detection:0.8/persn", "--evidence-dir", str(tmp_path / "ev")),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and DID_YOU_MEAN in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_an_agent_whose_model_is_missing_reports_it_and_exits_78(tmp_path, broker):
    missing = tmp_path / "gone.tflite"
    config = agent_config(tmp_path, broker.url, pipelines=[
        {"name": "main", "model": str(MODELS / "mobilenet_v1_0.25_128_quant.tflite"), "source": str(IMAGES),
         "loop": True, "max_fps": 5},
        {"name": "door", "model": str(missing), "source": str(IMAGES)}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert agent.wait(60) == EX_CONFIG, agent.output()
        assert (f"edgeinfer: error: {config}: pipelines[1].model: model not found: {missing} — check the path"
                in agent.output())
        # the fleet hears why before the agent goes (the systemd unit will not start it again)
        assert collector.wait_until(lambda c: any(
            e["event"] == "pipeline_failed" and e["pipeline"] == "door" for e in c.of_kind("events")), 10)


def test_an_agent_whose_first_model_is_missing_exits_78_not_1(tmp_path):
    config = agent_config(tmp_path, "mqtt://127.0.0.1:1", pipelines=[
        {"name": "main", "model": str(tmp_path / "gone.tflite"), "source": str(IMAGES)}])
    with AgentProcess(config, tmp_path / "agent.log") as agent:
        assert agent.wait(60) == EX_CONFIG, agent.output()
        assert f"{config}: pipelines[0].model: model not found" in agent.output()


def test_an_agent_with_a_rule_the_model_cannot_take_exits_78(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(SSD, models / SSD.name)  # relative paths: to the config file
    config = agent_config(tmp_path, "mqtt://127.0.0.1:1", pipelines=[
        {"name": "door", "model": f"models/{SSD.name}", "labels": str(COCO), "source": str(IMAGES),
         "events": ["detection:0.8/persn"]}])
    with AgentProcess(config, tmp_path / "agent.log") as agent:
        assert agent.wait(60) == EX_CONFIG, agent.output()
        assert f"edgeinfer: error: {config}: pipelines[0].events: {DID_YOU_MEAN}" in agent.output()


def test_a_source_that_does_not_open_is_named_without_its_secrets():
    """A revision's refusal goes to the fleet (an update event, the state): the source is named through the one
    redaction (_redact.py), its URL's password and a token in its query masked alike."""
    with socket.socket() as free:  # a port nothing listens on: the camera is down
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    source = f"rtsp://admin:s3cret@127.0.0.1:{port}/stream?token=abcdef123456"
    config = parse_config({"device_id": "cam-01", "pipelines": [{"model": str(SSD), "source": source}]})
    [problem] = source_problems(config, [0], timeout=10)
    assert problem.startswith(f"pipelines[0].source: rtsp://admin:***@127.0.0.1:{port}/stream?token=*** did not "
                              "open"), problem
    assert "s3cret" not in problem and "abcdef123456" not in problem, problem
