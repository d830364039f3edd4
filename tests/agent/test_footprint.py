"""What the agent loads and costs, as its telemetry's ``footprint`` reports it: a real agent process on a
real Mosquitto, running MobileNet v2 on XNNPACK from a folder of photos, with the fleet key pinned.

Nothing is loaded that the configuration does not use: no ONNX Runtime or OpenVINO (their availability is
checked without importing them), no PyAV (not an MJPEG source), no ``cryptography`` until a signed
command arrives. The figures themselves (RSS against a bare script, cold start) are bench/footprint.py's.
"""

from __future__ import annotations

from pathlib import Path

from support.agent import AgentProcess, fleet_key, signed_command, write_config
from support.assets import IMAGES, MODELS
from support.broker import Collector

from edgeinfer.link.protocol import Topics, validate

UNUSED = {"onnxruntime", "openvino", "tensorrt", "av", "cryptography", "scipy", "trackers", "sqlalchemy"}
#: Python's own extension modules for TLS and OpenSSL's hashes: an agent on a plain mqtt:// broker maps neither
#: (paho's ssl/hashlib/urllib.request imports are deferred, hashlib uses Python's own sha256: edgeinfer/util/defer.py)
OPENSSL_EXTENSIONS = ("_ssl.cpython", "_hashlib.cpython")


def mapped_files(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/" in line}



def footprints(collector: Collector) -> list[dict]:
    return [m["footprint"] for m in collector.of_kind("telemetry") if "footprint" in m]


def test_the_agent_loads_only_what_its_pipeline_uses_and_reports_it(tmp_path, broker):
    config = write_config(
        tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url, profile="none",
        data_dir=str(tmp_path / "data"), telemetry_interval_s=0.25, update_public_key=fleet_key().public_key_b64(),
        pipelines=[{"name": "main", "model": str(MODELS / "mobilenet_v2_1.0_224_quant.tflite"),
                    "source": str(IMAGES / "*.jpg"), "loop": True, "max_fps": 20, "threads": 1}])
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: any(f["first_result_s"] for f in footprints(c)), 30), agent.output()
        footprint = footprints(collector)[-1]
        runtimes = set(footprint["runtimes"])
        assert {"ai_edge_litert", "numpy", "cv2"} <= runtimes and not runtimes & UNUSED, runtimes
        assert 0 < footprint["first_result_s"] < 30, footprint  # from the process's exec to its first result
        assert 0 < footprint["rss_bytes"] <= footprint["peak_rss_bytes"], footprint
        for message in collector.of_kind("telemetry"):
            validate("telemetry", message)
        openssl = [f for f in mapped_files(agent.pid) if any(name in f for name in OPENSSL_EXTENSIONS)]
        assert not openssl, openssl  # the model's sha256 was taken (inspect_model) without them

        # a signed command is the first use of the pinned key: only now is cryptography loaded
        collector.publish(Topics("test", "cam-01").cmd, signed_command("c-1", "ping"))
        assert collector.wait_until(lambda c: any(
            e["event"] == "cmd_result" and e.get("cmd_id") == "c-1" for e in c.of_kind("events")), 20), agent.output()
        seen = len(footprints(collector))
        assert collector.wait_until(lambda c: len(footprints(c)) > seen + 1, 10)
        assert "cryptography" in footprints(collector)[-1]["runtimes"]
