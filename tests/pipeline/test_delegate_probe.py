"""The delegate probe: the fastest runtime whose answers agree with the reference's, measured once and cached.

Real runs of ``edgeinfer run`` and ``edgeinfer device`` in subprocesses, on YOLO11n-pose with ONNX Runtime (the
reference: the generic x86-64 profile's first that reads ONNX) and OpenVINO, each with a cache folder of its own.
The frame the answers are judged on is the first of the run's source, ``squat.bmp`` (one person). Which runtime
wins is this machine's business: the tests hold the structure and the rule — a runtime is chosen only when its
answers were judged to agree — never a speed. A planted runtime (tests/support/skewed_delegate.py, registered
through the public ``edgeinfer.delegates`` entry point) runs the real model, halves its outputs and answers
repeated inputs from memory: the fastest by far, and wrong; the probe measures it and refuses it, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.assets import IMAGES, MODELS, REPO
from support.processes import edgeinfer_cmd
from support.skewed_delegate import install_entry_point

from edgeinfer.util.fs import sha256_file

POSE = MODELS / "yolo11n-pose.onnx"
FRAME = IMAGES / "squat.bmp"
CACHE_FILE = "delegate-choices.json"
CANDIDATES = ["onnxruntime", "openvino:CPU"]  # the generic x86-64 profile's candidates that read ONNX


def probe_env(cache: Path, **extra: str) -> dict[str, str]:
    """The probe on (the suite turns it off), its cache in ``cache``, a short budget."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "EDGEINFER_DELEGATE_PROBE": "1",
            "EDGEINFER_CACHE_DIR": str(cache), "EDGEINFER_DELEGATE_PROBE_BUDGET_S": "2", **extra}


def run_json(env: dict[str, str], *args: str, source: Path | str = FRAME) -> tuple[dict, str]:
    """``edgeinfer run POSE --source SOURCE --json ARGS``: its summary line, and its stderr."""
    result = subprocess.run(edgeinfer_cmd("run", str(POSE), "--source", str(source), "--json", *args),
                            capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[-1]["type"] == "summary"
    return lines[-1], result.stderr


def device_json(env: dict[str, str], *args: str) -> dict:
    result = subprocess.run(edgeinfer_cmd("device", "--model", str(POSE), "--json", *args), capture_output=True,
                            text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def cache_entries(cache: Path) -> list[dict]:
    data = json.loads((cache / CACHE_FILE).read_text())
    assert data["version"] == 1
    return data["entries"]


def assert_the_rule(choice: dict) -> None:
    """The structure of a probe's result and its rule: the reference is ONNX Runtime; a chosen runtime other
    than the reference was judged to agree and was timed, and is no slower than the reference."""
    assert choice["reference"] == "onnxruntime"
    by_name = {m["delegate"]: m for m in choice["measurements"]}
    assert by_name["onnxruntime"]["verdict"] == "the reference" and by_name["onnxruntime"]["agrees"] is None
    assert choice["chosen"] in by_name
    if choice["chosen"] != choice["reference"]:
        chosen = by_name[choice["chosen"]]
        assert chosen["agrees"] is True and chosen["verdict"].startswith("agrees")
        assert chosen["ms"] < by_name["onnxruntime"]["ms"]
    for m in choice["measurements"]:  # every candidate loaded, judged and timed, whatever the budget
        assert m["ms"] > 0 and m["invokes"] >= 1
    assert choice["budget_s"] == 2 and choice["spent_s"] > 0


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, dict, str]:
    """One first run on a fresh cache: its cache folder, its summary, its stderr."""
    cache = tmp_path_factory.mktemp("probe-cache")
    summary, stderr = run_json(probe_env(cache))
    return cache, summary, stderr


def copied(cache: Path, tmp_path: Path) -> Path:
    target = tmp_path / "cache"
    shutil.copytree(cache, target)
    return target


def test_the_first_run_measures_onnxruntime_and_openvino_judges_their_answers_and_keeps_the_choice(measured):
    cache, summary, stderr = measured
    choice = summary["delegate_choice"]
    assert choice["cached"] is False
    assert [m["delegate"] for m in choice["measurements"]] == CANDIDATES
    assert_the_rule(choice)
    openvino = choice["measurements"][1]
    assert openvino["ms"] is not None and openvino["agrees"] in (True, False)  # judged: the person's box compared
    assert openvino["verdict"].startswith(("agrees: 1 of 1 boxes found", "disagrees:"))
    assert choice["judged"] is True and "squat.bmp" in choice["judged_on"]
    assert summary["delegate"] == choice["chosen"]  # the run ran on it
    from edgeinfer.device.cores import runtime_threads

    assert summary["runtime_threads"] == runtime_threads(capture_threads=1).threads  # the thread plan of one source
    assert f"note: delegate {choice['chosen']}, chosen by measurement" in stderr
    assert "ms" in stderr and "of a 2 s budget" in stderr
    [entry] = cache_entries(cache)
    key = entry["key"]
    assert key["model_sha256"] == sha256_file(POSE)
    assert [c["delegate"] for c in key["candidates"]] == CANDIDATES
    assert key["candidates"][0]["versions"]["onnxruntime"] and key["candidates"][1]["versions"]["openvino"]
    assert key["machine"]["cores"] == os.cpu_count() and key["machine"]["cpu_flags"]
    assert entry["result"]["chosen"] == choice["chosen"] and entry["result"]["measurements"] == choice["measurements"]


def test_the_second_run_reads_the_choice_from_the_cache_and_measures_nothing(measured, tmp_path):
    cache, first, _ = measured
    cache = copied(cache, tmp_path)
    before = (cache / CACHE_FILE).read_bytes()
    summary, stderr = run_json(probe_env(cache))
    choice = summary["delegate_choice"]
    assert choice["cached"] is True
    # the figures are the first run's, to the microsecond: nothing was timed again
    assert {k: v for k, v in choice.items() if k != "cached"} == \
        {k: v for k, v in first["delegate_choice"].items() if k != "cached"}
    assert summary["delegate"] == choice["chosen"]
    assert f"note: delegate {choice['chosen']}, the probe's cached choice" in stderr
    assert (cache / CACHE_FILE).read_bytes() == before  # not written again


def test_a_choice_kept_for_another_model_or_another_runtime_version_is_not_used(measured, tmp_path):
    cache, _, _ = measured
    cache = copied(cache, tmp_path)
    [entry] = cache_entries(cache)
    other_model = json.loads(json.dumps(entry))
    other_model["key"]["model_sha256"] = "0" * 64
    other_runtime = json.loads(json.dumps(entry))
    other_runtime["key"]["candidates"][1]["versions"]["openvino"] = "2020.1.0"
    for foreign in (other_model, other_runtime):  # each says a planted delegate was chosen: it must never run
        foreign["result"]["chosen"] = "skewed"
    (cache / CACHE_FILE).write_text(json.dumps({"version": 1, "entries": [other_model, other_runtime]}))
    summary, _ = run_json(probe_env(cache))
    choice = summary["delegate_choice"]
    assert choice["cached"] is False and summary["delegate"] in CANDIDATES  # measured anew
    assert_the_rule(choice)
    entries = cache_entries(cache)
    assert [e["key"] for e in entries[:2]] == [other_model["key"], other_runtime["key"]]  # kept, not used
    assert entries[2]["key"] == entry["key"]


def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_replaced(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / CACHE_FILE).write_text('{"version": 1, "entries": [{"key": ')  # cut short
    summary, stderr = run_json(probe_env(cache))
    assert "warning: the delegate probe's cache" in stderr and "is not readable" in stderr and "ignored" in stderr
    choice = summary["delegate_choice"]
    assert choice["cached"] is False and any("not readable" in note for note in choice["notes"])
    assert_the_rule(choice)
    [entry] = cache_entries(cache)  # a whole file again, written atomically
    assert entry["result"]["chosen"] == choice["chosen"]


@pytest.mark.parametrize(("args", "extra"), [
    (("--delegate", "onnxruntime"), {}),
    (("--delegate", "openvino:CPU"), {}),
    (("--no-probe",), {}),
    ((), {"EDGEINFER_DELEGATE_PROBE": "0"}),
    ((), {"EDGEINFER_DELEGATE": "onnxruntime"}),
], ids=["delegate", "delegate-openvino", "no-probe", "env-off", "env-delegate"])
def test_a_named_delegate_or_the_probe_turned_off_measures_nothing(tmp_path, args, extra):
    cache = tmp_path / "cache"
    summary, stderr = run_json(probe_env(cache, **extra), *args)
    assert summary["delegate_choice"] is None and "chosen by measurement" not in stderr
    assert not (cache / CACHE_FILE).exists()
    assert summary["delegate"] == (args[1] if args[:1] == ("--delegate",) else "onnxruntime")


def test_a_choice_made_on_the_synthetic_frame_alone_is_measured_again_when_a_run_has_a_frame(tmp_path):
    cache = tmp_path / "cache"
    env = probe_env(cache)
    summary, _ = run_json(env, "--max-frames", "1", source="synthetic:640x480")
    first = summary["delegate_choice"]
    assert first["judged"] is False and first["chosen"] == "onnxruntime" and "synthetic" in first["judged_on"]
    assert first["measurements"][1]["agrees"] is None
    assert first["measurements"][1]["verdict"].startswith("not judged: the reference finds no box")
    summary, _ = run_json(env, "--max-frames", "1", source="synthetic:640x480")
    assert summary["delegate_choice"]["cached"] is True  # nothing better to judge on: the choice stands
    summary, _ = run_json(env)  # a file: its first frame judges now
    choice = summary["delegate_choice"]
    assert choice["cached"] is False and choice["judged"] is True and "squat.bmp" in choice["judged_on"]
    assert_the_rule(choice)
    assert len(cache_entries(cache)) == 1  # the same key, replaced


def test_a_planted_runtime_whose_answers_disagree_is_measured_and_refused(tmp_path):
    site = install_entry_point(tmp_path / "site")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "lab.yaml").write_text(  # this machine, more specifically than generic-x86-64: the planted one last
        "schema: 1\nname: probe-lab\nmatch: {arch: [x86_64], cpu_flags: [sse2]}\n"
        "delegates: [onnxruntime, \"openvino:CPU\", skewed]\n")
    env = probe_env(tmp_path / "cache", EDGEINFER_PROFILE_DIRS=str(profiles))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO / "tests"), str(site)])
    summary, stderr = run_json(env)
    choice = summary["delegate_choice"]
    assert [m["delegate"] for m in choice["measurements"]] == [*CANDIDATES, "skewed"]
    skewed = choice["measurements"][2]
    assert skewed["ms"] is not None and skewed["invokes"] >= 1  # it ran, and was timed
    assert skewed["agrees"] is False
    # why, in the optimize judgement's words: the person's box is not where the reference has it
    assert skewed["verdict"].startswith("disagrees: 0 of 1 boxes found, 1 given; recall 0.0% < 80.0%")
    assert choice["chosen"] != "skewed" and summary["delegate"] != "skewed"
    assert_the_rule(choice)
    assert "skewed" in stderr and "disagrees: 0 of 1 boxes found" in stderr
    [entry] = cache_entries(tmp_path / "cache")
    assert entry["key"]["candidates"][2] == {"delegate": "skewed",
                                             "versions": {"entry point": "support.skewed_delegate:SkewedDelegate"}}


def test_device_says_the_cached_choice_and_measures_again_with_probe(measured, tmp_path):
    cache, first, _ = measured
    cache = copied(cache, tmp_path)
    env = probe_env(cache)
    shown = device_json(env)
    assert shown["probe"]["cached"] is True and shown["probe_skipped"] is None
    assert shown["probe"]["measurements"] == first["delegate_choice"]["measurements"]
    assert shown["selected"] + (f":{shown['selected_device']}" if shown["selected_device"] else "") == \
        shown["probe"]["chosen"]
    again = device_json(env, "--probe", "--image", str(FRAME))
    assert again["probe"]["cached"] is False and again["probe"]["measured_at"] > shown["probe"]["measured_at"]
    assert_the_rule(again["probe"])
    assert "squat.bmp" in again["probe"]["judged_on"]
    [entry] = cache_entries(cache)
    assert entry["result"]["measured_at"] == again["probe"]["measured_at"]  # the new measurement is kept
    off = device_json(env, "--no-probe")
    assert off["probe"] is None and "off" in off["probe_skipped"]
    named = device_json(env, "--delegate", "onnxruntime")
    assert named["probe"] is None and named["probe_skipped"] == "a delegate was named"


def test_device_in_words_names_each_runtime_its_figures_and_where_the_choice_came_from(measured, tmp_path):
    cache, first, _ = measured
    result = subprocess.run(edgeinfer_cmd("device", "--model", str(POSE)), capture_output=True, text=True,
                            env=probe_env(copied(cache, tmp_path)), timeout=240)
    assert result.returncode == 0, result.stderr
    choice = first["delegate_choice"]
    probe_lines = result.stdout[result.stdout.index("\nprobe "):].splitlines()[1:]
    assert probe_lines[0].startswith(f"probe     {choice['chosen']}, cached: ")
    for line, m in zip(probe_lines[1:], choice["measurements"]):
        assert line.split()[:3] == [m["delegate"], f"{m['ms']:.1f}", "ms"]
    assert "s of a 2 s budget, judged on the first frame of squat.bmp" in probe_lines[3]
