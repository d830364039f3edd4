"""Helpers for tests/test_examples.py: run an example as a user would, read the README's code blocks,
parse Prometheus' text format, and a real Prometheus server when one is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from .assets import ASSETS, REPO

EXAMPLES = REPO / "examples"


def example_env(cache: Path, **extra: str) -> dict[str, str]:
    """The environment of an example run: this checkout first on the path, the shared assets, a private cache."""
    return dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                EDGEINFER_ASSETS=str(ASSETS), EDGEINFER_CACHE=str(cache), PYTHONUNBUFFERED="1", **extra)


def run_example(name: str, *args: str, cache: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python examples/NAME ARGS`` as a subprocess; fails the test with its output if it does not exit 0."""
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                            timeout=timeout, env=example_env(cache), cwd=REPO)
    assert result.returncode == 0, f"{name} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def readme_block(first_line: str) -> str:
    """The fenced code block of examples/README.md whose first line is ``first_line`` (without that line)."""
    text = (EXAMPLES / "README.md").read_text()
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        lines = block.splitlines()
        if lines and lines[0].strip() == first_line:
            return "\n".join(lines[1:]) + "\n"
    raise AssertionError(f"examples/README.md has no code block starting with {first_line!r}")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(body: str) -> dict[str, list[dict[str, str]]]:
    """Prometheus text format -> {metric name: [labels of each sample]} (samples only, not # TYPE lines)."""
    metrics: dict[str, list[dict[str, str]]] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name, labels, _value = match.groups()
        metrics.setdefault(name, []).append(dict(_LABEL.findall(labels or "")))
    return metrics


class Prometheus:
    """A real Prometheus scraping ``targets`` every second, in a temporary folder; close() stops it."""

    BINARY = shutil.which("prometheus")

    def __init__(self, workdir: Path, targets: list[str], port: int) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "edgeinfer", "static_configs": [{"targets": targets}]}],
        }))
        self.url = f"http://127.0.0.1:{port}"
        self._log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [self.BINARY, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=self._log, stderr=subprocess.STDOUT)
        self.log_path = workdir / "prometheus.log"

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready within {timeout} s: {self.log_path.read_text()[-3000:]}")

    def query(self, expr: str) -> list[dict]:
        """An instant query; the result vector (AssertionError with Prometheus' message if it is invalid)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:  # 400: a PromQL error, explained in the body
            raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from None
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (to prove a script left nothing behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found
