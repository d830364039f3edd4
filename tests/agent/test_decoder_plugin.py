"""A real agent whose pipeline names a decoder plug-in (``decoder: class-regions``, examples/decoder_plugin,
pip-installed): ``agent --check`` reads the model with it, and the running agent's ``detection`` events carry what
the plug-in gives (the dog's box and its mask's outline) over a real Mosquitto. A broken plug-in named in
agent.yaml is the configuration's error, naming the plug-in and its entry point."""

from __future__ import annotations

import json
import subprocess

from support.agent import AgentProcess, write_config
from support.assets import LABELS, MODELS
from support.broker import Collector
from support.decoder_plugin import DOG, NAME, install_broken, install_example, plugin_env
from support.processes import edgeinfer_cmd

from edgeinfer.link.protocol import validate

DEEPLAB = MODELS / "deeplabv3_mnv2_dm05_pascal_quant.tflite"
PASCAL = LABELS / "pascal_voc_segmentation_labels.txt"
EX_CONFIG = 78


def _pipeline(**values) -> dict:
    return {"name": "main", "model": str(DEEPLAB), "labels": str(PASCAL), "source": str(DOG), "loop": True,
            "max_fps": 5, "threads": 1, "delegate": "xnnpack", "decoder": NAME, **values}


def test_an_agent_runs_a_pipeline_with_the_installed_plugin_and_its_events_carry_the_mask(tmp_path, broker,
                                                                                            monkeypatch):
    site = install_example(tmp_path)
    install_broken(site)
    monkeypatch.setenv("PYTHONPATH", plugin_env(site)["PYTHONPATH"])
    config = write_config(tmp_path / "agent.yaml", device_id="cam-01", fleet="test", broker=broker.url,
                          data_dir=str(tmp_path / "data"), telemetry_interval_s=0.25,
                          pipelines=[_pipeline(events=["detection:0.5/dog"])])
    checked = subprocess.run(edgeinfer_cmd("agent", "--config", str(config), "--check"), capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    [model] = json.loads(checked.stdout)["models"]
    assert (model["layout"], model["task"]) == (NAME, "segment")
    with Collector(broker.port) as collector, AgentProcess(config, tmp_path / "agent.log") as agent:
        assert collector.wait_subscribed()
        assert collector.wait_until(lambda c: any(m["event"] == "rule_triggered" for m in c.of_kind("events")), 60), \
            agent.output()
        [message, *_] = [m for m in collector.of_kind("events") if m["event"] == "rule_triggered"]
    validate("events", message)
    data = message["data"]
    assert data["label"] == "dog" and data["kind"] == "detection"
    [outline, *_] = data["polygons"]
    xs, ys = [x for x, _ in outline], [y for _, y in outline]
    x1, y1, x2, y2 = data["box"]
    assert len(outline) >= 8 and x1 <= min(xs) and max(xs) <= x2 and y1 <= min(ys) and max(ys) <= y2


def test_a_broken_plugin_named_in_agent_yaml_is_the_configurations_error(tmp_path):
    site = tmp_path / "site"
    install_broken(site)
    config = write_config(tmp_path / "agent.yaml", device_id="cam-01", data_dir=str(tmp_path / "data"),
                          pipelines=[_pipeline(decoder="gone")])
    checked = subprocess.run(edgeinfer_cmd("agent", "--config", str(config), "--check"), capture_output=True,
                             text=True, env=plugin_env(site), timeout=120)
    assert checked.returncode == EX_CONFIG and "Traceback" not in checked.stderr, checked.stderr
    assert (f"{tmp_path / 'agent.yaml'}: pipelines[0].decoder: decoder plug-in 'gone' (entry point "
            "edgeinfer.decoders: gone = no_such_decoder_module:LAYOUT, from broken-decoders 0.1) does not load: "
            "ModuleNotFoundError") in checked.stderr
