"""The dashboard with a thousand devices: time to first render, and the time to apply a live update.

A fleet manager (its managed Mosquitto, SQLite) with ``--devices`` simulated agents enrolled and
reporting every ``--interval`` seconds (``edgeinfer.tools.simulate``, in this process), and a real
headless Chromium (Debian's, through Selenium, as the browser tests use it) signed in as an
operator. Measured in the page (``window.edgeinferTimings``, ``performance.now()``):

- **first render**: a fresh load of ``#/devices`` until its table holds every device, and of
  ``#/`` (the overview); ``--reps`` loads each, median and spread. The baseline, in the same run
  and the same page: fetching ``/api/devices`` and parsing its JSON, nothing drawn (render / fetch
  is the page's own cost on top of the data it needs).
- **live update**: while the devices page is open for ``--watch`` seconds, how long each
  ``devices`` frame from ``/api/changes`` took to apply (rows per frame; median, p95, max ms), and
  the browser's long tasks (> 50 ms: what a person would feel as a stall).

    python bench/dashboard.py [--devices 1000] [--interval 1.0] [--reps 5] [--watch 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def median_spread(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 1), "min": round(ordered[0], 1),
            "max": round(ordered[-1], 1), "n": len(ordered)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def first_render(browser, dashboard, route: str, ready_page: str, rows: int | None) -> float:
    """ms from navigation start to the page's first complete render (a fresh load, the token kept)."""
    from support.browser import wait_js

    driver = browser.driver
    driver.get("about:blank")
    driver.get(dashboard.url + route)
    condition = ("const t = window.edgeinferTimings; return !!t && t.readyPage === arguments[0] && "
                 "(arguments[1] === null || document.querySelectorAll('tr[data-device-id]').length === arguments[1])")
    wait_js(driver, condition, 120, ready_page, rows)
    return driver.execute_script("return window.edgeinferTimings.readyAt")


def fetch_only(browser) -> float:
    """ms to fetch /api/devices and parse it in the same page (the data a first render needs, nothing drawn)."""
    return browser.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const token = sessionStorage.getItem('edgeinfer.token');
        const started = performance.now();
        fetch('/api/devices', {headers: {Authorization: 'Bearer ' + token}})
          .then(r => r.json()).then(rows => done(performance.now() - started));
    """)


def watch_updates(browser, seconds: float) -> dict:
    driver = browser.driver
    driver.execute_script("""
        window.benchLongTasks = [];
        new PerformanceObserver(list => { for (const e of list.getEntries()) window.benchLongTasks.push(e.duration); })
          .observe({type: 'longtask'});
        window.edgeinferTimings.apply.length = 0;
    """)
    time.sleep(seconds)
    applied = driver.execute_script("return window.edgeinferTimings.apply")
    long_tasks = driver.execute_script("return window.benchLongTasks")
    frames = [(rows, ms) for name, rows, ms in applied if name == "devices"]
    if not frames:
        return {"frames": 0}
    times = [ms for _rows, ms in frames]
    return {"frames": len(frames), "rows_per_frame": round(statistics.median(r for r, _ms in frames)),
            "apply_ms_median": round(statistics.median(times), 2), "apply_ms_p95": round(percentile(times, 0.95), 2),
            "apply_ms_max": round(max(times), 2), "long_tasks": len(long_tasks),
            "long_task_ms_max": round(max(long_tasks), 1) if long_tasks else 0.0,
            "other_events": len(applied) - len(frames)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between one device's telemetry")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--watch", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from support.browser import DESKTOP, Browser
    from support.dashboard import running_dashboard, sign_in

    workdir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-dashboard-"))
    started = time.monotonic()
    with running_dashboard(workdir / "fleet", devices=args.devices, interval_s=args.interval,
                           online_timeout=180.0) as dashboard:
        setup_s = time.monotonic() - started
        browser = Browser(DESKTOP)
        try:
            sign_in(browser, dashboard, "operator", timeout=60)
            devices = [first_render(browser, dashboard, "#/devices", "devices", args.devices) for _ in range(args.reps)]
            overview = [first_render(browser, dashboard, "#/", "overview", None) for _ in range(args.reps)]
            fetched = [fetch_only(browser) for _ in range(args.reps)]
            first_render(browser, dashboard, "#/devices", "devices", args.devices)
            live = watch_updates(browser, args.watch)
            errors = browser.errors()
        finally:
            browser.quit()
    result = {"devices": args.devices, "interval_s": args.interval, "setup_s": round(setup_s, 1),
              "first_render_devices_ms": median_spread(devices), "first_render_overview_ms": median_spread(overview),
              "fetch_devices_json_ms": median_spread(fetched),
              "render_over_fetch": round(statistics.median(devices) / statistics.median(fetched), 2),
              "live": live, "console_errors": errors}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
