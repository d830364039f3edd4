"""One form of a pipeline's lines and zones (edgeinfer/_regions.py), and the places that take them agree on it
exactly: agent.yaml's ``lines`` / ``zones`` (PipelineOptions, read by the agent's real config reader), a
configuration document's check (link/config_document.py: the fleet manager's, a device revision's), the device's
``set_analytics`` command (the real command router: signature, args schema, handler, on a real pipeline runner) and
the fleet manager's ``PUT .../analytics`` (its real HTTP API, pydantic's AnalyticsSpec and the route). Each case
is accepted by all of them or refused by all; the tasks that take lines and zones are the same everywhere."""

from __future__ import annotations

import itertools
import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.agent import fleet_key, signed_command
from support.assets import IMAGES
from support.fleet import admin_of, api_server
from support.pipeline import ULTRAFACE

from edgeinfer import _regions
from edgeinfer.agent.analytics_command import AnalyticsSettings
from edgeinfer.agent.commands import CommandRouter
from edgeinfer.agent.config import parse_config
from edgeinfer.agent.runner import PipelineRunner
from edgeinfer.agent.telemetry import BootSequence
from edgeinfer.errors import ConfigError
from edgeinfer.fleet.db import FleetDB
from edgeinfer.link.config_document import document_problems
from edgeinfer.link.protocol import Topics
from edgeinfer.pipeline.options import PipelineOptions
from edgeinfer.pipeline.tasks import TASK_NAMES, TASKS
from edgeinfer.updates.signing import VerifyKey

DEVICE = "cam-01"
DOOR = [[10, 400], [300, 400]]
SHOP = [[400, 10], [630, 10], [630, 330], [400, 330]]


def circle(points: int) -> list[list[float]]:
    return [[round(300 + 200 * math.cos(2 * math.pi * i / points), 3),
             round(300 + 200 * math.sin(2 * math.pi * i / points), 3)] for i in range(points)]


#: (id, lines {name: [[x1, y1], [x2, y2]]}, zones {name: [[x, y], ...]}, accepted, expressible in agent.yaml)
CASES: list[tuple[str, dict, dict, bool, bool]] = [
    ("plain", {"door": DOOR}, {"shop": SHOP}, True, True),
    ("front door", {"front door": DOOR}, {"shop window": SHOP}, True, True),
    ("dots, dashes, underscores", {"Door_1.a-b": DOOR}, {"_zone": SHOP}, True, True),
    ("64 characters", {"a" * 64: DOOR}, {}, True, True),
    ("65 characters", {"a" * 65: DOOR}, {}, False, True),
    ("empty name", {"": DOOR}, {}, False, False),  # agent.yaml: "=x1,..." is an unnamed line (line1)
    ("space first", {" door": DOOR}, {}, False, False),  # agent.yaml strips "NAME=" of its spaces
    ("space last", {}, {"shop ": SHOP}, False, False),
    ("unicode letter", {"Tür": DOOR}, {}, False, True),
    ("unicode name", {}, {"店": SHOP}, False, True),
    ("slash", {"door/1": DOOR}, {}, False, True),
    ("colon", {"door:1": DOOR}, {}, False, True),
    ("tab", {"a\tb": DOOR}, {}, False, True),
    ("a line and a zone of one name", {"door": DOOR}, {"door": SHOP}, False, True),
    ("2-point zone", {}, {"shop": [[400, 10], [630, 330]]}, False, True),
    ("3 points, 2 distinct", {}, {"shop": [[400, 10], [400, 10], [630, 330]]}, False, True),
    ("zone without area", {}, {"shop": [[0, 0], [10, 10], [20, 20]]}, False, True),
    ("zone written closed", {}, {"shop": [*SHOP, SHOP[0]]}, True, True),
    ("65-point zone", {}, {"shop": circle(65)}, False, True),
    ("64-point zone", {}, {"shop": circle(64)}, True, True),
    ("zero-length line", {"door": [[5, 5], [5, 5]]}, {}, False, True),
    ("line under a pixel", {"door": [[5, 5], [5.5, 5]]}, {}, False, True),
    ("negative coordinate", {"door": [[-1, 5], [300, 5]]}, {}, False, True),
    ("the largest coordinate", {"door": [[0, 0], [16384, 16384]]}, {}, True, True),
    ("past the largest", {"door": [[0, 0], [16385, 5]]}, {}, False, True),
    ("32 lines", {f"l{i}": DOOR for i in range(32)}, {}, True, True),
    ("33 lines", {f"l{i}": DOOR for i in range(33)}, {}, False, True),
]
IDS = [case[0] for case in CASES]


def _numbers(values: list[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


# ------------------------------------------------------------------------------------ the three places

def yaml_entry(lines: dict, zones: dict, task: str = "detect") -> dict[str, Any]:
    """agent.yaml's pipeline entry (a configuration document's too) with these ``lines`` / ``zones``."""
    entry: dict[str, Any] = {"name": "main", "model": str(ULTRAFACE), "source": str(IMAGES / "face.jpg"), "task": task}
    if lines:
        entry["lines"] = [f"{name}={_numbers([*a, *b])}" for name, (a, b) in lines.items()]
    if zones:
        entry["zones"] = [f"{name}={_numbers([v for p in points for v in p])}" for name, points in zones.items()]
    return entry


def yaml_accepts(lines: dict, zones: dict, task: str = "detect") -> bool:
    """agent.yaml's pipeline entry with these ``lines`` / ``zones`` read by the agent's config reader."""
    try:
        parse_config({"device_id": DEVICE, "fleet": "f", "pipelines": [yaml_entry(lines, zones, task)]})
    except ConfigError:
        return False
    return True


def document_accepts(lines: dict, zones: dict, task: str = "detect") -> bool:
    """The configuration document's check (link/config_document.py: the fleet manager's, before a revision is sent)."""
    return not document_problems({"pipelines": [yaml_entry(lines, zones, task)]})


class Device:
    """The device's side: the agent's real command router and ``set_analytics`` handler, its pipeline runners
    built from a real agent.yaml (not started: the command judges them by their configured task)."""

    def __init__(self, folder: Path) -> None:
        pipelines = [{"name": task, "model": str(ULTRAFACE), "source": str(IMAGES / "face.jpg"), "task": task}
                     for task in TASK_NAMES]
        self.config = parse_config({"device_id": DEVICE, "fleet": "f", "data_dir": str(folder), "pipelines": pipelines,
                                    "update_public_key": fleet_key().public_key_b64()})
        self.topics, self.boot, self.figures, self.versions = Topics("f", DEVICE), BootSequence(), None, {}
        self.stopping, self.spool, self.link, self.runners = False, None, None, []
        self.emitted: list[tuple[str, str | None, dict]] = []
        self._runners = {p.name: PipelineRunner(p, emit=self.emit, on_change=lambda: None)
                         for p in self.config.pipelines}
        self.router = CommandRouter(self, folder / "commands.sqlite3", key=VerifyKey(fleet_key().public_key_b64()),
                                    device_id=DEVICE)
        AnalyticsSettings(self, folder).register(self.router)
        self._ids = itertools.count()

    # what the router and the handler use of the agent
    def runner(self, name: str) -> PipelineRunner:
        return self._runners[name]

    def emit(self, event: str, level: str, message: str, *, pipeline: str | None = None,
             cmd_id: str | None = None, data: dict | None = None) -> None:
        self.emitted.append((str(event), cmd_id, dict(data or {})))

    def state_changed(self) -> None:
        pass

    def send(self, lines: dict, zones: dict, pipeline: str = "detect") -> dict:
        """The answer (``cmd_result`` / ``cmd_rejected`` and its data) to a signed set_analytics."""
        command_id = f"sa-{next(self._ids)}"
        args = {"pipeline": pipeline, "revision": 1, "lines": {n: [*a, *b] for n, (a, b) in lines.items()},
                "zones": zones}
        self.router.handle(self.topics.cmd, signed_command(command_id, "set_analytics", args, device=DEVICE))
        [(event, data)] = [(e, d) for e, c, d in self.emitted if c == command_id and e.startswith("cmd_")]
        return {"event": event, **data}


class Manager:
    """The fleet manager's side: its HTTP API on a real database, the device's state as it reported it."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def put(self, lines: dict, zones: dict, pipeline: str = "main", device: str = DEVICE) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{self.url}/api/devices/{device}/pipelines/{pipeline}/analytics", method="PUT",
            data=json.dumps({"lines": lines, "zones": zones}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    made = Device(tmp_path_factory.mktemp("device"))
    try:
        yield made
    finally:
        made.router.stop()


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    folder = tmp_path_factory.mktemp("manager")
    db = FleetDB(f"sqlite:///{folder / 'fleet.sqlite3'}")
    with api_server(db, folder / "api") as (server, _services):
        for task in (*TASK_NAMES, "auto"):  # a device per task its pipeline "main" reported running
            db.record_state("f", f"cam-{task}", {
                "v": 1, "type": "state", "fleet": "f", "device": f"cam-{task}", "ts": 1.0, "online": True,
                "boot_id": "0" * 32, "pipelines": [{"name": "main", "status": "running", "task": task}]})
        db.record_state("f", DEVICE, {"v": 1, "type": "state", "fleet": "f", "device": DEVICE, "ts": 1.0,
                                      "online": True, "boot_id": "0" * 32,
                                      "pipelines": [{"name": "main", "status": "running", "task": "detect"}]})
        yield Manager(server.url, admin_of(folder / "api"))


# ------------------------------------------------------------------------------------------------ tests

@pytest.mark.parametrize(("lines", "zones", "accepted", "in_yaml"), [case[1:] for case in CASES], ids=IDS)
def test_agent_yaml_the_device_and_the_manager_accept_and_refuse_the_same_lines_and_zones(
        device, manager, lines, zones, accepted, in_yaml):
    answer = device.send(lines, zones)
    status, body = manager.put(lines, zones)
    said = {"device": answer["event"] == "cmd_result", "manager": status == 202}
    if in_yaml:
        said["agent.yaml"] = yaml_accepts(lines, zones)
        said["configuration document"] = document_accepts(lines, zones)
    assert said == dict.fromkeys(said, accepted), (answer, status, body)
    if not accepted:
        assert answer["reason"] == "invalid_geometry" and status in (400, 409), (answer, status, body)


def test_a_bad_name_is_refused_in_words_everywhere_never_as_a_pattern(device, manager):
    answer = device.send({"door/1": DOOR}, {})
    status, body = manager.put({"door/1": DOOR}, {})
    with pytest.raises(ValueError) as raised:
        PipelineOptions(lines=("door/1=10,400,300,400",))
    for words in (answer["error"], body["error"], str(raised.value)):
        assert "'door/1' is not " + _regions.NAME_FORM in words and "[A-Za-z" not in words, words
    assert status == 400


@pytest.mark.parametrize("task", TASK_NAMES)
def test_every_task_with_boxes_takes_lines_and_zones_and_the_others_are_told_which_do(device, manager, task):
    takes = task in _regions.BOX_TASKS
    assert TASKS[task].boxes is takes
    answer = device.send({"door": DOOR}, {"shop": SHOP}, pipeline=task)
    status, body = manager.put({"door": DOOR}, {"shop": SHOP}, device=f"cam-{task}")
    assert (answer["event"] == "cmd_result", status == 202, yaml_accepts({"door": DOOR}, {}, task),
            document_accepts({"door": DOOR}, {}, task)) == (takes,) * 4
    if not takes:
        words = f"lines and zones need a task with boxes (detect, pose, segment, obb), not {task!r}"
        assert answer["reason"] == "task_without_boxes" and answer["error"].endswith(words)
        assert (status, body["error"]) == (409, words)


def test_a_device_that_has_not_read_its_model_yet_is_sent_its_lines(manager):
    assert manager.put({"door": DOOR}, {}, device="cam-auto")[0] == 202


def test_the_box_tasks_are_tasks_and_the_document_carries_the_name_rule_and_the_bounds(manager):
    assert set(_regions.BOX_TASKS) <= set(TASK_NAMES)
    request = urllib.request.Request(f"{manager.url}/openapi.json",
                                     headers={"Authorization": f"Bearer {manager.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        spec = json.loads(response.read())["components"]["schemas"]["AnalyticsSpec"]["properties"]
    zones: Any = spec["zones"]
    for shapes, most in ((spec["lines"], _regions.MAX_LINES), (zones, _regions.MAX_ZONES)):
        assert list(shapes["patternProperties"]) == [_regions.NAME_PATTERN]
        assert shapes["propertyNames"]["description"] == _regions.NAME_FORM and shapes["maxProperties"] == most
    zone = zones["patternProperties"][_regions.NAME_PATTERN]
    assert (zone["minItems"], zone["maxItems"]) == (_regions.MIN_ZONE_POINTS, _regions.MAX_ZONE_POINTS)
    assert zone["items"]["items"]["maximum"] == _regions.MAX_COORDINATE
