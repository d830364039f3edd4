"""Build hook (the project is configured in pyproject.toml).

The device profiles live at the top of the repository (``device_profiles/``) and are shipped inside
the package as ``edgeinfer/device_profiles/`` so ``importlib.resources`` finds them in a wheel.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithProfiles(build_py):
    """build_py, then copy device_profiles/*.yaml into the built package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "edgeinfer" / "device_profiles"
        self.mkpath(str(target))
        for source in sorted((HERE / "device_profiles").glob("*.yaml")):
            self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPyWithProfiles})
