"""`make demo` runs `edgeinfer demo`: it must work end to end on the shared assets."""

from __future__ import annotations

import json
import subprocess

from conftest import ASSETS, edgeinfer_cmd


def test_demo_runs_end_to_end(tmp_path):
    result = subprocess.run(
        edgeinfer_cmd("demo", "--assets", str(ASSETS), "--workdir", str(tmp_path), "--json"),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    delegates = {row["delegate"].split(":")[0] for row in summary["photos"]}
    assert {"xnnpack", "onnxruntime", "openvino"} <= delegates
    for row in summary["photos"]:
        assert row["top1"][0] == "macaw" and row["top1"][1] == "Egyptian cat"
    assert summary["clip"]["frames"] == 40
    assert summary["clip"]["labels"]["macaw"] >= 9
    assert (tmp_path / "demo_clip.avi").stat().st_size > 10_000
    agent = summary["agent"]  # the agent ran the clip and its telemetry arrived over a local Mosquitto
    if "skipped" in agent:
        assert "pipeline" in agent["skipped"]  # only until the pipeline is merged
    else:
        assert agent["exit_code"] == 0 and agent["telemetry"] >= 3 and agent["fps"] > 0
        assert agent["seqs"] == list(range(1, len(agent["seqs"]) + 1)) and agent["delegate"]
