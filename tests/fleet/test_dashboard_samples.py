"""The dataset view in a real headless Chromium against a real manager: samples uploaded as devices upload them
(their own credential, real JPEGs of the shared photos with the Coral SSD's own boxes on them) show as a grid,
each frame with one box per detection placed on what it boxes and the corrected labels drawn apart; the filters
narrow the grid and live in the hash (a linked view opens filtered); an operator marks a selection reviewed and
deletes one, which the API then says; an error of the API is said in the page; the export carries the filters;
a viewer sees the grid and nothing to change it with; a pose model's samples show each person's skeleton.
Screenshots: docs/img/dashboard-samples-desktop.png, docs/img/dashboard-sample-pose-desktop.png."""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.assets import IMAGES, REFERENCES
from support.browser import DESKTOP, Browser, screenshot, shared_browser, wait_for, wait_js, wait_text
from support.dashboard import fill, go, running_dashboard, settle, sign_in
from support.live_view import basic

from edgeinfer.forms.samples import COCO_SKELETON
from edgeinfer.pipeline.sampling import perceptual_hash  # the device's own hash

DOCS_IMG = Path(__file__).parents[2] / "docs" / "img"
SSD = REFERENCES / "mobilenet_ssd_v2_coco_quant_postprocess_litert.json"
#: the widest frame a sample is made at (the photos are scaled down, their boxes with them)
WIDTH = 640
#: (device, pipeline, rule, model version, photo) of each sample, oldest first
SAMPLES = [("cam-door", "door", "uncertain:0.3-0.6", "3", "grace_hopper.bmp"),
           ("cam-door", "door", "uncertain:0.3-0.6", "3", "face.jpg"),
           ("cam-door", "door", "detection:0.5/person", "3", "kite_and_cold.jpg"),
           ("cam-yard", "yard", "uncertain:0.3-0.6", "4", "pets.jpg"),
           ("cam-yard", "yard", "uncertain:0.3-0.6", "4", "cat.bmp"),
           ("cam-yard", "yard", "detection:0.5", "4", "parrot.jpg")]


def upload(url: str, auth: str, device: str, sample_id: str, body: dict) -> int:
    request = urllib.request.Request(f"{url}/api/devices/{device}/samples/{sample_id}", method="PUT",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": auth, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def sample_body(photo: str, pipeline: str, rule: str, version: str, captured_at: float) -> dict:
    """A real JPEG of the photo (at most WIDTH wide) and the SSD's own detections on it, scaled with it."""
    image = cv2.imread(str(IMAGES / photo))
    scale = min(1.0, WIDTH / image.shape[1])
    image = cv2.resize(image, (round(image.shape[1] * scale), round(image.shape[0] * scale)),
                       interpolation=cv2.INTER_AREA)
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 85])
    assert ok
    detections = [{"label": d["label"], "score": d["score"], "box": [round(v * scale, 1) for v in d["box_xyxy_px"]]}
                  for d in json.loads(SSD.read_text())["detections"][photo]]
    return {"jpeg": base64.b64encode(jpeg.tobytes()).decode(), "phash": perceptual_hash(image), "width": image.shape[1],
            "height": image.shape[0], "captured_at": captured_at, "pipeline": pipeline, "rule": rule,
            "model": {"name": "ssd_mobilenet_v2", "version": version}, "detections": detections}


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    with running_dashboard(tmp_path_factory.mktemp("samples"), devices=1, interval_s=1.0) as dashboard:
        manager = dashboard.manager
        logins = {e["device_id"]: basic(e["username"], e["password"])
                  for e in manager.access.enroll_devices(["cam-door", "cam-yard"], "dash")}
        for index, (device, pipeline, rule, version, photo) in enumerate(SAMPLES):
            body = sample_body(photo, pipeline, rule, version, time.time() - 600 * (len(SAMPLES) - index))
            assert upload(manager.http.url, logins[device], device, Path(photo).stem, body) == 201
        # a person's correction of the Grace Hopper frame: her tie is no object of this dataset, her box tighter
        [hopper] = api(dashboard, "samples?device=cam-door&rule=uncertain:0.3-0.6&label=tie")
        labels = [{"label": "person", "box": [d["box"][0] + 8, d["box"][1] + 8, d["box"][2] - 8, d["box"][3]]}
                  for d in hopper["detections"] if d["label"] == "person"]
        call(dashboard, "PATCH", "devices/cam-door/samples/grace_hopper", {"labels": labels})
        yield dashboard


def call(dashboard, method: str, path: str, body: dict | None = None, role: str = "operator") -> bytes:
    request = urllib.request.Request(f"{dashboard.manager.http.url}/api/{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {dashboard.tokens[role]}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def api(dashboard, path: str) -> list[dict]:
    return json.loads(call(dashboard, "GET", path, role="viewer"))


def tiles(browser: Browser) -> list[dict]:
    """The grid as shown: per tile its key, its boxes (model's, corrected) and whether it says reviewed."""
    return browser.driver.execute_script("""
        return Array.from(document.querySelectorAll('[data-testid=sample]')).map(li => ({
          key: li.dataset.key, reviewed: li.dataset.reviewed === 'true',
          detections: li.querySelectorAll('.box.detection rect').length,
          labels: li.querySelectorAll('.box.label rect').length,
          mark: li.querySelector('[data-testid=sample-reviewed]').textContent}));""")


def keys(browser: Browser) -> list[str]:
    return [t["key"] for t in tiles(browser)]


def wait_keys(browser: Browser, expected: list[str], timeout: float = 10) -> None:
    wait_js(browser, "return JSON.stringify(Array.from(document.querySelectorAll('[data-testid=sample]'))"
                     ".map(li => li.dataset.key)) === JSON.stringify(arguments[0])", timeout, expected)


def newest_first(*photos: str) -> list[str]:
    order = [f"{device}/{Path(photo).stem}" for device, _, _, _, photo in reversed(SAMPLES)]
    return [key for key in order if key.split("/")[1] in {Path(p).stem for p in photos}] if photos else order


def test_the_grid_draws_each_samples_boxes_on_its_frame(dash):
    stored = {f"{s['device_id']}/{s['sample_id']}": s for s in api(dash, "samples")}
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "operator")
        go(browser, dash, "#/samples")
        wait_keys(browser, newest_first())
        for tile in tiles(browser):
            sample = stored[tile["key"]]
            assert tile["detections"] == len(sample["detections"]), tile
            assert tile["labels"] == len(sample["labels"] or []), tile
        assert {t["key"]: t["labels"] for t in tiles(browser)}["cam-door/grace_hopper"] == 1
        assert wait_text(browser, "[data-testid=samples-total]", "6")
        # every frame arrives through the API (the token in a header), at its own size
        wait_js(browser, "return Array.from(document.querySelectorAll('[data-testid=sample-frame]'))"
                         ".every(img => img.naturalWidth > 0)", 15)
        # a box sits on what it boxes: the SVG scales the frame's pixels to the tile as the <img> does
        kite = stored["cam-door/kite_and_cold"]
        placed = browser.driver.execute_script("""
            const li = document.querySelector('[data-key="cam-door/kite_and_cold"]');
            const img = li.querySelector('img').getBoundingClientRect();
            const box = li.querySelector('.box.detection rect').getBoundingClientRect();
            return [img.left, img.top, img.width, img.height, box.left, box.top, box.width, box.height];""")
        left, top, width, height = placed[:4]
        scale = min(width / kite["width"], height / kite["height"])
        x0, y0 = left + (width - kite["width"] * scale) / 2, top + (height - kite["height"] * scale) / 2
        x1, y1, x2, y2 = kite["detections"][0]["box"]
        expected = [x0 + x1 * scale, y0 + y1 * scale, (x2 - x1) * scale, (y2 - y1) * scale]
        assert placed[4:] == pytest.approx(expected, abs=2.5), (placed, expected)
        DOCS_IMG.mkdir(exist_ok=True)
        fill(browser, "samples-filter-device", "cam-door")  # a view with a correction in it
        wait_keys(browser, newest_first("grace_hopper", "face", "kite_and_cold"))
        wait_js(browser, "return Array.from(document.querySelectorAll('[data-testid=sample-frame]'))"
                         ".every(img => img.complete && img.naturalWidth > 0)", 15)
        browser.driver.execute_script("document.activeElement.blur()")  # no focus ring in the picture
        settle(0.3)
        screenshot(browser, DOCS_IMG / "dashboard-samples-desktop.png")
        assert not browser.errors(), browser.errors()


def test_filters_narrow_the_grid_and_live_in_the_hash(dash):
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "operator")
        go(browser, dash, "#/samples")
        wait_keys(browser, newest_first())
        fill(browser, "samples-filter-label", "dog")
        wait_keys(browser, ["cam-yard/pets"])
        assert browser.driver.execute_script("return location.hash") == "#/samples?label=dog"
        fill(browser, "samples-filter-label", "")
        fill(browser, "samples-filter-device", "cam-door")
        wait_keys(browser, newest_first("grace_hopper", "face", "kite_and_cold"))
        fill(browser, "samples-filter-rule", "detection:0.5/person")
        wait_keys(browser, ["cam-door/kite_and_cold"])
        wait_text(browser, "[data-testid=samples-total]", "1")
        # a linked view opens filtered, its choices shown in the form
        link = "#/samples?" + urllib.parse.urlencode({"device": "cam-yard", "model_version": "4", "label": "cat"})
        browser.driver.get("about:blank")
        browser.driver.get(dash.url + link)
        wait_keys(browser, ["cam-yard/cat"])
        chosen = browser.driver.execute_script(
            "return ['device', 'model_version', 'label', 'pipeline'].map(k => "
            "document.querySelector(`[data-testid=samples-filter-${k}]`).value)")
        assert chosen == ["cam-yard", "4", "cat", ""]
        fill(browser, "samples-filter-model_version", "3")  # no cam-yard sample is of version 3
        wait_keys(browser, [])
        assert wait_for(browser, ".empty").text == "no samples match these filters"
        # a linked filter the API refuses is said in the page; the form still works
        with browser.expecting("400"):
            go(browser, dash, "#/samples?device=" + urllib.parse.quote("bad!id"))
            wait_text(browser, "[data-testid=samples-result]", lambda text: "Could not load" in text)
        fill(browser, "samples-filter-device", "")
        wait_keys(browser, newest_first())
        assert not browser.errors(), browser.errors()


def test_an_operator_marks_a_selection_reviewed_and_deletes_one(dash):
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "operator")
        go(browser, dash, "#/samples?device=cam-yard&reviewed=false")
        wait_keys(browser, newest_first("pets", "cat", "parrot"))
        assert wait_for(browser, "[data-testid=samples-mark-reviewed]").get_attribute("disabled") is not None
        for key in ("cam-yard/pets", "cam-yard/cat"):
            wait_for(browser, f'[data-key="{key}"] [data-testid=sample-select]').click()
        wait_text(browser, "[data-testid=samples-selected]", "2 selected")
        wait_for(browser, "[data-testid=samples-mark-reviewed]").click()
        wait_text(browser, "[data-testid=samples-result]", "2 samples marked reviewed.")
        wait_keys(browser, ["cam-yard/parrot"])  # no longer "not reviewed": out of this view
        reviewed = {s["sample_id"]: s["reviewed"] for s in api(dash, "samples?device=cam-yard")}
        assert reviewed == {"pets": True, "cat": True, "parrot": False}
        # without the review filter they stay, marked; then back to unreviewed, one of them
        fill(browser, "samples-filter-reviewed", "")
        wait_keys(browser, newest_first("pets", "cat", "parrot"))
        marks = {t["key"]: t["mark"] for t in tiles(browser)}
        assert marks == {"cam-yard/parrot": "not reviewed", "cam-yard/cat": "reviewed", "cam-yard/pets": "reviewed"}
        wait_for(browser, '[data-key="cam-yard/cat"] [data-testid=sample-select]').click()
        wait_for(browser, "[data-testid=samples-mark-unreviewed]").click()
        wait_text(browser, "[data-testid=samples-result]", "1 sample marked unreviewed.")
        assert {t["key"]: t["reviewed"] for t in tiles(browser)}["cam-yard/cat"] is False
        assert [s["reviewed"] for s in api(dash, "samples?device=cam-yard&label=cat")] == [False]
        # delete, after the confirmation
        browser.driver.execute_script("document.querySelector('[data-testid=samples-select-all]').click()")
        wait_text(browser, "[data-testid=samples-selected]", "3 selected")
        wait_for(browser, '[data-key="cam-yard/pets"] [data-testid=sample-select]').click()
        wait_for(browser, '[data-key="cam-yard/cat"] [data-testid=sample-select]').click()
        wait_for(browser, "[data-testid=samples-delete]").click()
        wait_for(browser, "[data-testid=confirm-cancel]").click()  # cancelled: nothing goes
        settle(0.3)
        assert len(api(dash, "samples?device=cam-yard")) == 3
        wait_for(browser, "[data-testid=samples-delete]").click()
        wait_for(browser, "[data-testid=confirm-ok]").click()
        wait_text(browser, "[data-testid=samples-result]", "1 sample deleted.")
        wait_keys(browser, newest_first("pets", "cat"))
        assert sorted(s["sample_id"] for s in api(dash, "samples?device=cam-yard")) == ["cat", "pets"]
        wait_text(browser, "[data-testid=samples-total]", "2")
        # the API's error is said in the page: a sample deleted behind the page's back
        call(dash, "DELETE", "devices/cam-yard/samples/cat")
        wait_for(browser, '[data-key="cam-yard/cat"] [data-testid=sample-select]').click()
        with browser.expecting("404"):
            wait_for(browser, "[data-testid=samples-mark-reviewed]").click()
            text = wait_text(browser, "[data-testid=samples-result]", lambda t: "could not be" in t)
        assert "cam-yard/cat" in text and "no sample cat" in text, text
        assert "error" in wait_for(browser, "[data-testid=samples-result]").get_attribute("class")
        assert not browser.errors(), browser.errors()


def test_the_export_carries_the_filters_and_a_viewer_changes_nothing(dash):
    expected = len(call(dash, "GET", "samples/export?format=yolo&device=cam-door", role="viewer"))
    everything = len(call(dash, "GET", "samples/export?format=yolo", role="viewer"))
    assert expected < everything
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/samples?device=cam-door")
        wait_keys(browser, newest_first("grace_hopper", "face", "kite_and_cold"))
        assert tiles(browser)[0]["detections"] > 0
        for testid in ("samples-delete", "samples-mark-reviewed", "samples-mark-unreviewed", "samples-select-all",
                       "sample-select"):
            assert not browser.driver.find_elements("css selector", f"[data-testid={testid}]"), testid
        fill(browser, "samples-export-format", "yolo")
        wait_for(browser, "[data-testid=samples-export]").click()
        text = wait_text(browser, "[data-testid=samples-result]", lambda t: t.startswith("samples-yolo.zip"))
        assert "3 samples" in text, text
        size = wait_for(browser, "[data-testid=samples-result]").get_attribute("data-bytes")
        assert int(size) == expected  # the same zip as the API's for this filter: not everything
        assert not browser.errors(), browser.errors()


def test_more_pages_in_the_next_samples(dash):
    """Past a page (48 tiles), *More* appends the next ones, each once."""
    [issued] = dash.manager.access.enroll_devices(["cam-bulk"], "dash")
    login = basic(issued["username"], issued["password"])
    for index in range(50):  # scenes of their own: blocks of a seed's colours hash far apart
        blocks = np.random.default_rng(100 + index).integers(0, 256, (6, 8, 3), dtype=np.uint8)
        image = cv2.resize(blocks, (160, 120), interpolation=cv2.INTER_NEAREST)
        ok, jpeg = cv2.imencode(".jpg", image)
        assert ok
        body = {"jpeg": base64.b64encode(jpeg.tobytes()).decode(), "phash": perceptual_hash(image), "width": 160,
                "height": 120, "captured_at": time.time() - 86400 + index, "pipeline": "bulk",
                "detections": [{"label": "box", "score": 0.5, "box": [10, 10, 60, 60]}]}
        assert upload(dash.manager.http.url, login, "cam-bulk", f"b{index:02d}", body) == 201
    newest = [f"cam-bulk/b{index:02d}" for index in reversed(range(50))]
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/samples?pipeline=bulk")
        wait_keys(browser, newest[:48])
        assert wait_text(browser, "[data-testid=samples-total]", "50")
        wait_for(browser, "[data-testid=samples-more]").click()
        wait_keys(browser, newest)
        wait_js(browser, "return document.querySelector('[data-testid=samples-more]').hidden", 5)
        assert not browser.errors(), browser.errors()


def test_a_pose_samples_skeleton_is_drawn_on_its_frame(dash):
    """A pose model's samples (YOLO11n-pose's reference people on two photos): each person's sure keypoints as
    points, joined by COCO's limbs — the skeleton the contract states — placed on the frame's pixels; an unsure
    keypoint and its limbs not drawn; a person's corrected keypoints drawn as labels are (hidden ones flagged 1
    drawn, unlabelled ones not). Screenshot: docs/img/dashboard-sample-pose-desktop.png."""
    [issued] = dash.manager.access.enroll_devices(["cam-gym"], "dash")
    login = basic(issued["username"], issued["password"])
    people = json.loads((REFERENCES / "yolo11n-pose_ultralytics.json").read_text())["detections"]
    expected = {}
    for offset, photo in enumerate(("grace_hopper.bmp", "squat.bmp")):
        body = sample_body(photo, "gym", "uncertain:0.3-0.6", "1", time.time() - 60 + offset)
        scale = body["width"] / cv2.imread(str(IMAGES / photo)).shape[1]
        body["model"] = {"name": "yolo11n-pose.onnx", "version": "1"}
        body["detections"] = [{"label": "person", "score": p["score"], "box": [v * scale for v in p["box_xyxy_px"]],
                               "keypoints": [[x * scale, y * scale, c] for x, y, c in p["keypoints_xy_conf"]]}
                              for p in people[photo]]
        assert upload(dash.manager.http.url, login, "cam-gym", Path(photo).stem, body) == 201
        points = body["detections"][0]["keypoints"]
        seen = [c >= 0.5 for _, _, c in points]
        expected[f"cam-gym/{Path(photo).stem}"] = {
            "points": sum(seen), "limbs": sorted(f"{a}-{b}" for a, b in COCO_SKELETON if seen[a] and seen[b]),
            "first": [round(v, 1) for v in next(p[:2] for p, s in zip(points, seen) if s)]}
    # a labeller's squat: the model's keypoints, the left ear placed but hidden (1), the right ankle not labelled
    [squat] = api(dash, "samples?device=cam-gym&label=person&rule=uncertain:0.3-0.6&limit=1")
    corrected = [[x, y, 2] for x, y, _ in squat["detections"][0]["keypoints"]]
    corrected[3], corrected[16] = [corrected[3][0], corrected[3][1], 1], [0, 0, 0]
    call(dash, "PATCH", "devices/cam-gym/samples/squat",
         {"labels": [{"label": "person", "box": squat["detections"][0]["box"], "keypoints": corrected}]})
    label_limbs = sorted(f"{a}-{b}" for a, b in COCO_SKELETON if 16 not in (a, b))
    with shared_browser(DESKTOP) as browser:
        sign_in(browser, dash, "viewer")
        go(browser, dash, "#/samples?pipeline=gym")
        wait_keys(browser, ["cam-gym/squat", "cam-gym/grace_hopper"])
        drawn = browser.driver.execute_script("""
            return Object.fromEntries(Array.from(document.querySelectorAll('[data-testid=sample]')).map(li => {
              const of = (kind) => ({
                points: li.querySelectorAll(`.box.${kind} circle.keypoint`).length,
                limbs: Array.from(li.querySelectorAll(`.box.${kind} line.limb`)).map(l => l.dataset.limb).sort(),
                first: (c => c ? [+c.getAttribute('cx'), +c.getAttribute('cy')] : null)(
                  li.querySelector(`.box.${kind} circle.keypoint`))});
              return [li.dataset.key, {detection: of('detection'), label: of('label')}];
            }));""")
        for key, want in expected.items():
            got = drawn[key]["detection"]
            assert (got["points"], got["limbs"]) == (want["points"], want["limbs"]), (key, got, want)
            assert got["first"] == pytest.approx(want["first"], abs=0.11), (key, got)
        assert len(expected["cam-gym/squat"]["limbs"]) == 17 and len(expected["cam-gym/grace_hopper"]["limbs"]) < 10
        assert drawn["cam-gym/squat"]["label"]["points"] == 16  # the hidden ear drawn, the unlabelled ankle not
        assert drawn["cam-gym/squat"]["label"]["limbs"] == label_limbs
        assert drawn["cam-gym/grace_hopper"]["label"]["points"] == 0
        # a limb sits on its keypoints: the SVG maps the frame's pixels to the tile as the <img> does
        placed = browser.driver.execute_script("""
            const li = document.querySelector('[data-key="cam-gym/squat"]');
            const img = li.querySelector('img').getBoundingClientRect();
            const dot = li.querySelector('.box.detection circle.keypoint').getBoundingClientRect();
            return [img.left, img.top, img.width, img.height, dot.left + dot.width / 2, dot.top + dot.height / 2];""")
        left, top, width, height, cx, cy = placed
        scale = min(width / squat["width"], height / squat["height"])
        x0, y0 = left + (width - squat["width"] * scale) / 2, top + (height - squat["height"] * scale) / 2
        first = expected["cam-gym/squat"]["first"]
        assert [cx, cy] == pytest.approx([x0 + first[0] * scale, y0 + first[1] * scale], abs=1.5)
        wait_js(browser, "return Array.from(document.querySelectorAll('[data-testid=sample-frame]'))"
                         ".every(img => img.complete && img.naturalWidth > 0)", 15)
        settle(0.3)
        screenshot(browser, DOCS_IMG / "dashboard-sample-pose-desktop.png")
        assert not browser.errors(), browser.errors()
