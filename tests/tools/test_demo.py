"""`make demo` runs `edgeinfer demo`: it must work end to end on the shared assets."""

from __future__ import annotations

import json
import subprocess

from support.assets import ASSETS
from support.processes import edgeinfer_cmd


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
    fleet = summary["fleet"]  # the agent's telemetry reached the fleet manager, then v2 was deployed to it
    assert fleet["telemetry"] >= 3 and fleet["fps"] > 0 and fleet["delegate"]
    assert fleet["seqs"] == list(range(1, len(fleet["seqs"]) + 1))
    assert fleet["samples"] >= 1  # frames its sampling rule kept reached the manager
    assert fleet["deploy_exit_code"] == 0 and fleet["version_after"] == 2
    assert fleet["update_states"][-1] == "active" and fleet["agent_exit_code"] == 0
    # the agent was enrolled (the managed Mosquitto admits no anonymous client) and the deploy used a token
    assert {"token.create", "device.enroll", "artifact.upload", "deployment.create"} <= set(fleet["audit"])
