"""A real headless Chromium for browser tests: Debian's ``chromium`` driven through Debian's ``chromedriver``
(``make system-deps`` installs both; nothing is downloaded at test time) by Selenium.

``Browser`` starts one, sized like a desktop (``DESKTOP``) or a phone (``PHONE``), that reaches nothing but
127.0.0.1; it keeps every console entry the page logs (``goog:loggingPrefs``) so that a test can assert there
were no errors, with ``expecting(pattern)`` for the ones a test provokes on purpose (a refused request logs
"Failed to load resource: … 403"). ``quit()`` ends the driver, then kills whatever it left behind.
``wait_for``, ``wait_text``, ``wait_js`` and ``screenshot`` are the waits and the capture the tests share;
``serve_folder`` serves a directory over HTTP on a free port, for pages made by a test.

A browser that cannot start is an error (RuntimeError: what is missing, or chromedriver's answer — with its
exit status when it died itself — and the tail of its log: the command it launched Chromium with, what Chromium
printed) — never a skip: ``make test`` installs both, so a test that needs them and cannot have them has failed.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.server
import os
import re
import shutil
import signal
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DESKTOP = (1280, 800)
PHONE = (390, 844)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _missing() -> str | None:
    """Why a browser cannot start here (what to install), or None."""
    for binary, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(binary, os.X_OK):
            return f"{binary} not found: install the Debian package {package} (make system-deps)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]'"
    return None


MISSING = _missing()


def _parents() -> dict[int, int]:
    """{pid: parent pid} of every process on the machine (read from /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command name (field 2) is in parentheses and may hold spaces; the parent pid follows it
        table[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    return table


def descendants(pid: int) -> list[int]:
    """The pids of every process below ``pid`` (its children, theirs, …)."""
    table, found, frontier = _parents(), [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in table.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


class Browser:
    """One headless Chromium through chromedriver (a context manager; ``quit()`` when done)."""

    def __init__(self, size: tuple[int, int] = DESKTOP, *, page_load_timeout: float = 30.0,
                 accept_insecure_certs: bool = False) -> None:
        """``accept_insecure_certs``: take a certificate no system CA signed (a manager's own fleet CA, ``--tls``)."""
        if MISSING:
            raise RuntimeError(MISSING)
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self._folder = tempfile.mkdtemp(prefix="edgeinfer-chromium-")
        self._profile = os.path.join(self._folder, "profile")
        self.log = Path(self._folder) / "chromedriver.log"  # its INFO log: commands, answers (long ones cut)
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                         f"--window-size={size[0]},{size[1]}", f"--user-data-dir={self._profile}",
                         # nothing beyond this machine: every name but the loopback ones fails to resolve
                         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
                         "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--disable-features=Translate,MediaRouter,OptimizationHints",
                         "--hide-scrollbars", "--force-device-scale-factor=1", "--lang=en-US"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        options.accept_insecure_certs = accept_insecure_certs
        self.service = Service(str(CHROMEDRIVER), log_output=str(self.log))
        self.console: list[dict] = []  # every console entry read so far, oldest first
        self._expected: list[dict] = []  # entries a test provoked on purpose (expecting())
        try:
            self.driver = webdriver.Chrome(service=self.service, options=options)
        except Exception as exc:
            reason = self._start_failure(exc)
            self._kill_leftovers(self._service_pids())
            shutil.rmtree(self._folder, ignore_errors=True)
            raise RuntimeError(reason) from exc
        except BaseException:
            self._kill_leftovers(self._service_pids())
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self.driver.set_page_load_timeout(page_load_timeout)
        self.set_window_size(*size)

    def _start_failure(self, exc: Exception) -> str:
        """Why Chromium did not start: chromedriver's answer (its exit status when it died itself), the end of its
        log (the command it launched Chromium with, what Chromium printed)."""
        answer = (getattr(exc, "msg", None) or str(exc)).strip().splitlines()
        try:
            log = "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-20:])
        except OSError:
            log = ""
        return (f"Chromium did not start: {CHROMEDRIVER} driving {CHROMIUM}: "
                f"{type(exc).__name__}: {answer[0] if answer else '(no message)'}"
                + (f"\n--- the end of chromedriver's log:\n{log}" if log else " (chromedriver wrote no log)"))

    # ------------------------------------------------------------------------------ window
    def set_window_size(self, width: int, height: int) -> None:
        """Make the viewport (innerWidth × innerHeight, CSS pixels) ``width`` × ``height``: the window is set to
        that, then grown by whatever frame the headless window draws around its viewport."""
        self.driver.set_window_size(width, height)
        inner = self.driver.execute_script("return [window.innerWidth, window.innerHeight]")
        if inner and tuple(inner) != (width, height):
            self.driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])

    def get(self, url: str) -> None:
        self.driver.get(url)

    def fresh(self, size: tuple[int, int] = DESKTOP) -> Browser:
        """This browser as a new one would be for the next test (a Chromium start is ~4 CPU-seconds): one window
        of ``size`` on a blank page, the pages left before their origins' cookies, storages and the cache are
        cleared (left first: a request a page was about to make would go out without its token, a 401 in the
        console), and a console of its own (what the pages before logged is read and dropped)."""
        driver = self.driver
        handles = driver.window_handles
        origins = set()
        for handle in handles:
            driver.switch_to.window(handle)
            origin = driver.execute_script("return location.origin")
            if origin and origin.startswith("http"):
                origins.add(origin)
        for handle in handles[1:]:
            driver.switch_to.window(handle)
            driver.close()
        driver.switch_to.window(handles[0])
        driver.get("about:blank")
        for origin in sorted(origins):
            driver.execute_cdp_cmd("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
        driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
        driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        self.read_console()
        self.console.clear()
        self._expected.clear()
        self.set_window_size(*size)
        return self

    # ------------------------------------------------------------------------------ the console
    def read_console(self) -> list[dict]:
        """Read what the browser logged since the last read (Chromium hands each entry out once); keep it."""
        try:
            entries = self.driver.get_log("browser")
        except Exception:  # a closed window has no log left to read
            entries = []
        self.console += entries
        return entries

    def errors(self) -> list[str]:
        """The console's errors (level SEVERE: uncaught exceptions, console.error, failed loads) so far, less
        those a test provoked inside ``expecting()``."""
        self.read_console()
        expected = {id(e) for e in self._expected}
        return [e["message"] for e in self.console if e.get("level") == "SEVERE" and id(e) not in expected]

    @contextlib.contextmanager
    def expecting(self, pattern: str, timeout: float = 3.0) -> Iterator[None]:
        """Errors matching ``pattern`` logged inside the block are expected, not counted by ``errors()``; on
        leaving, waits up to ``timeout`` s for the first of them (the console is written asynchronously)."""
        self.read_console()
        start = len(self.console)
        yield
        regex = re.compile(pattern)

        def matching() -> list[dict]:
            self.read_console()
            return [e for e in self.console[start:] if e.get("level") == "SEVERE" and regex.search(e["message"])]

        wait_until(matching, timeout, 0.05)
        self._expected += matching()

    # ------------------------------------------------------------------------------ the end
    def _service_pids(self) -> list[int]:
        process = getattr(self.service, "process", None)
        if process is None or process.poll() is not None:
            return []
        return [process.pid, *descendants(process.pid)]

    @staticmethod
    def _kill_leftovers(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:  # reap the ones that are our children (chromedriver), so no zombie stays
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def alive(self) -> list[int]:
        """The pids of chromedriver and the Chromium processes it started that are still running."""
        return self._service_pids()

    def quit(self) -> None:
        """Quit the browser and chromedriver; then kill any of their processes still there."""
        pids = self._service_pids()
        try:
            self.read_console()
            self.driver.quit()
        except Exception:  # a browser that died already
            pass
        finally:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(_running(p) for p in pids):
                time.sleep(0.05)
            self._kill_leftovers([p for p in pids if _running(p)])
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.quit()


_shared: Browser | None = None
_shared_in_use = False


@contextlib.contextmanager
def shared_browser(size: tuple[int, int] = DESKTOP) -> Iterator[Browser]:
    """This process's one Chromium for the block, as a new one would be (:meth:`Browser.fresh`): the browser tests
    that each took a Chromium of their own started one a block, ~4 CPU-seconds each. A block inside another one, or
    after a Chromium that no longer answers, gets a Chromium of its own; the shared one quits when the process ends."""
    global _shared, _shared_in_use
    if _shared_in_use:
        with Browser(size) as own:
            yield own
        return
    if _shared is not None:
        try:
            _shared.fresh(size)
        except Exception:  # it died, or a page of the block before holds it (an alert): a new one
            _shared.quit()
            _shared = None
    if _shared is None:
        _shared = Browser(size)
        atexit.register(_shared.quit)
    _shared_in_use = True
    try:
        yield _shared
    finally:
        _shared_in_use = False
        try:  # its pages left as a quit leaves them: their requests and streams end with the block
            _shared.fresh(size)
        except Exception:
            _shared.quit()
            _shared = None


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------------------- waits
def wait_until(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something true or ``timeout`` s pass; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def _driver(browser_or_driver: Any) -> Any:
    return getattr(browser_or_driver, "driver", browser_or_driver)


def wait_for(driver: Any, css: str, timeout: float = 10.0, *, visible: bool = True) -> Any:
    """The first element matching ``css`` once it is there (and displayed, unless ``visible=False``)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = _driver(driver)
    located = (By.CSS_SELECTOR, css)
    condition = ec.visibility_of_element_located(located) if visible else ec.presence_of_element_located(located)
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)
    except TimeoutException:
        raise AssertionError(f"no {'visible ' if visible else ''}{css!r} after {timeout} s on "
                             f"{driver.current_url}") from None


def wait_text(driver: Any, css: str, predicate: Callable[[str], bool] | str, timeout: float = 10.0) -> str:
    """Wait until the text of the first element matching ``css`` satisfies ``predicate`` (or equals it, for a
    string); the text. The element may be replaced meanwhile (a re-render): it is looked up on every poll."""
    check = (lambda text: text == predicate) if isinstance(predicate, str) else predicate
    seen: list[str] = []

    def current() -> str | None:
        text = text_of(driver, css)
        if text is not None and (not seen or seen[-1] != text):
            seen.append(text)
        return text if text is not None and check(text) else None

    text = wait_until(current, timeout)
    if text is None:
        raise AssertionError(f"{css!r} never matched within {timeout} s; its texts: {seen[-5:]!r}")
    return text


def text_of(driver: Any, css: str) -> str | None:
    """The rendered text (innerText, trimmed) of the first element matching ``css``, None if there is none."""
    return _driver(driver).execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : null;", css)


def wait_js(driver: Any, script: str, timeout: float = 10.0, *args: Any) -> Any:
    """Wait until ``script`` (a function body; ``return …``) returns something true; that value."""
    value = wait_until(lambda: _driver(driver).execute_script(script, *args), timeout)
    if not value:
        raise AssertionError(f"never true within {timeout} s: {script}")
    return value


# ---------------------------------------------------------------------------------- screenshots
def screenshot(driver: Any, path: str | os.PathLike) -> Path:
    """Save the viewport as a PNG at ``path`` (folders made, the file overwritten); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _driver(driver).get_screenshot_as_png()
    path.write_bytes(data)
    return path


def png_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) from a PNG's header; ValueError if the file is not a PNG."""
    head = Path(path).read_bytes()[:24]
    if head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


# ---------------------------------------------------------------------------------- a static site
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        pass


@contextlib.contextmanager
def serve_folder(folder: str | os.PathLike) -> Iterator[str]:
    """Serve ``folder`` over HTTP on 127.0.0.1 at a free port, from a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name="test-http")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
