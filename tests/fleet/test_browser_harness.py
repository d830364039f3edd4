"""The browser harness itself (support.browser), on a page made here: Debian's headless Chromium runs its
JavaScript, which fetches from the same server; console errors are caught; screenshots are real PNGs;
nothing is left running afterwards."""

from __future__ import annotations

import json

import pytest
from support.browser import (
    DESKTOP,
    PHONE,
    PNG_SIGNATURE,
    Browser,
    png_size,
    screenshot,
    serve_folder,
    wait_for,
    wait_js,
    wait_text,
)

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title><link rel="icon" href="data:,">
<style>body { font: 16px sans-serif; background: #f4f6f8; } #status { color: #0a5; font-size: 40px; }</style>
</head><body>
<h1>harness</h1><p id="status">waiting</p><div id="late" hidden>late</div>
<script>
fetch("/data.json").then(r => r.json()).then(d => {
  document.getElementById("status").textContent = "fetched " + d.answer;
  setTimeout(() => { document.getElementById("late").hidden = false; }, 300);
});
console.error("deliberate harness error");
</script>
</body></html>
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    (folder / "index.html").write_text(PAGE)
    (folder / "data.json").write_text(json.dumps({"answer": 42}))
    with serve_folder(folder) as url:
        yield url


def test_chromium_runs_the_page_and_the_harness_sees_it(site, tmp_path):
    browser = Browser(DESKTOP)
    try:
        pids = browser.alive()
        assert len(pids) >= 2, pids  # chromedriver and the browser it started
        browser.get(f"{site}/index.html")
        assert wait_text(browser, "#status", "fetched 42", timeout=10) == "fetched 42"  # JS ran, fetch() answered
        assert wait_for(browser, "#late", timeout=5).text == "late"  # waits for an element to show
        assert wait_js(browser, "return document.title") == "harness"
        assert browser.driver.execute_script("return [innerWidth, innerHeight]") == list(DESKTOP)

        errors = browser.errors()
        assert len(errors) == 1 and "deliberate harness error" in errors[0], browser.console
        with browser.expecting(r"status of 404"):  # a failed load is a console error, allowed when provoked
            browser.driver.execute_script("fetch('/missing.json')")
        assert len(browser.errors()) == 1

        desktop = screenshot(browser, tmp_path / "shots" / "desktop.png")
        browser.set_window_size(*PHONE)
        assert browser.driver.execute_script("return innerWidth") == PHONE[0]
        phone = screenshot(browser, tmp_path / "shots" / "phone.png")
        for path, (width, height) in ((desktop, DESKTOP), (phone, PHONE)):
            data = path.read_bytes()
            assert data[:8] == PNG_SIGNATURE and len(data) > 2000, (path, len(data))
            assert png_size(path) == (width, height)
    finally:
        browser.quit()
    assert browser.alive() == [] and all(not _exists(p) for p in pids), pids


def test_no_network_beyond_this_machine(site):
    with Browser(PHONE) as browser:
        browser.get(f"{site}/index.html")
        wait_text(browser, "#status", "fetched 42")
        outcome = browser.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch("http://example.com/", {mode: "no-cors"}).then(() => done("reached"), e => done("refused: " + e));
        """)
        assert outcome.startswith("refused"), outcome


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
