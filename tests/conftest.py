"""Session fixtures. Shared helpers live in the ``support`` package (tests/support/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.assets import ASSETS, LABELS, MODELS

if not MODELS.is_dir():
    pytest.exit(f"test assets not found at {ASSETS}; set EDGEINFER_ASSETS", returncode=4)

# The delegate probe picks a runtime by this machine's speed, which no test may depend on: the suite's runs (and
# the processes they start, which inherit this) take the plan's first delegate, as without it, and the probe's own
# tests (tests/pipeline/test_delegate_probe.py, tests/agent/test_delegate_choice.py) turn it on where it is the subject
os.environ.setdefault("EDGEINFER_DELEGATE_PROBE", "0")


@pytest.fixture(scope="session")
def assets() -> Path:
    return ASSETS


@pytest.fixture(scope="session")
def imagenet_labels() -> Path:
    return LABELS / "imagenet_labels.txt"


@pytest.fixture(scope="session")
def clip(tmp_path_factory) -> Path:
    """The MJPEG clip of the reference photos (support.pipeline.reference_clip), made once per run."""
    from support.pipeline import reference_clip

    return reference_clip(tmp_path_factory.mktemp("clips"))


#: the modules that take longest (minutes each under `make test`'s workers, mostly one test each): run first, so
#: that none of them is left running alone at the end. `make test` passes --no-loadscope-reorder: xdist would
#: otherwise start the modules with the most tests first and these last
LONG_MODULES = (
    "fleet/test_openapi_contract.py", "fleet/test_ingest_fuzz.py", "fleet/test_deploy.py",
    "agent/test_command_fuzz.py", "fleet/test_fleet_evaluate.py", "tools/test_bench_cli.py",
    "pipeline/test_sampling_rules.py", "pipeline/test_detector_references.py", "test_examples.py",
    "fleet/test_fleet_evidence.py", "tools/test_evaluate.py", "fleet/test_canary.py",
    "tools/test_optimize_detectors.py", "tools/test_optimize.py", "pipeline/test_events.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: index for index, module in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))
