"""The example decoder plug-in (examples/decoder_plugin: ``class-regions``) installed as a user installs it — pip
builds it from its pyproject.toml and installs it into a folder put on ``PYTHONPATH`` — and plug-ins that are
broken in the two ways a plug-in can be (its module does not import; its entry point names no Layout).

A child process started with :func:`plugin_env` finds them by their ``*.dist-info/entry_points.txt``, exactly as it
would find them in site-packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .assets import IMAGES, REPO

EXAMPLE = REPO / "examples" / "decoder_plugin"
NAME = "class-regions"
#: the trimap beside the photo: 0 the dog, 1 background, 2 the uncertain border
DOG = IMAGES / "dog_segmentation.bmp"
DOG_TRIMAP = IMAGES / "dog_segmentation_mask.bmp"


def install_example(folder: Path) -> Path:
    """``pip install examples/decoder_plugin`` into ``folder/site`` (built from a copy: pip's build writes beside the
    sources); the site folder."""
    source, site = folder / "decoder_plugin", folder / "site"
    shutil.copytree(EXAMPLE, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "--target", str(site), str(source)],
                   check=True, capture_output=True, text=True, timeout=300)
    return site


def install_broken(site: Path) -> dict[str, str]:
    """Two broken decoder plug-ins beside whatever ``site`` holds: ``gone`` (its module does not exist) and
    ``not-a-layout`` (names a function); {name: its entry point's target}."""
    targets = {"gone": "no_such_decoder_module:LAYOUT", "not-a-layout": "os.path:join"}
    info = site / "broken_decoders-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-decoders\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[edgeinfer.decoders]\n" + "".join(f"{name} = {target}\n" for name, target in targets.items()))
    return targets


def plugin_env(site: Path, **extra: str) -> dict[str, str]:
    """This environment with the checkout, then ``site``, on PYTHONPATH."""
    paths = [str(REPO), str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}
