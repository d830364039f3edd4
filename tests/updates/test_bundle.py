"""The agent bundle (edgeinfer/updates/bundle.py): edgeinfer's wheel and the wheels beside it as one file, the same
bytes from the same wheels, unpacked on the device only as what it must be; an edgeinfer version as a deployment's
version number; and ``edgeinfer deploy --agent`` refusing what is not an agent before anything is sent."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from support.processes import edgeinfer_cmd

from edgeinfer.errors import UpdateRejected
from edgeinfer.updates.bundle import pack, unpack, version_number, wheel_metadata


def wheel(folder: Path, name: str, version: str) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{name.replace('-', '_')}/__init__.py", "")
    return path


@pytest.fixture
def wheels(tmp_path) -> tuple[Path, Path]:
    deps = tmp_path / "deps"
    deps.mkdir()
    wheel(deps, "numpy", "1.26.4")
    wheel(deps, "paho-mqtt", "2.1.0")
    return wheel(tmp_path, "edgeinfer", "0.4.2"), deps


def test_a_bundle_is_the_same_bytes_from_the_same_wheels_and_unpacks_to_them(tmp_path, wheels):
    main, deps = wheels
    first, second = tmp_path / "one.tar", tmp_path / "two.tar"
    bundle = pack(main, first, wheels_dir=deps)
    (deps / "numpy-1.26.4-py3-none-any.whl").touch()  # a newer mtime changes nothing
    pack(main, second, wheels_dir=deps)
    assert first.read_bytes() == second.read_bytes()
    assert (bundle.version, bundle.name, bundle.number) == ("0.4.2", "edgeinfer-0.4.2", 4002)
    unpacked = unpack(first, tmp_path / "out")
    assert unpacked.wheel == main.name and unpacked.version == "0.4.2" and unpacked.pip_wheel() is None
    assert sorted(w.name for w in unpacked.wheels) == sorted([main.name, *(p.name for p in deps.glob("*.whl"))])
    assert all(w.read_bytes() == ((deps / w.name) if w.name != main.name else main).read_bytes()
               for w in unpacked.wheels)


def hostile(tmp_path: Path, members: list[tuple[str, bytes | None, bytes]]) -> Path:
    """A tar of (name, type, data) members; type None is a regular file."""
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as archive:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind is None:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname = kind, data.decode()
                archive.addfile(info)
    return path


INDEX = b'{"format": 1, "name": "edgeinfer", "version": "0.4.2", "wheel": "edgeinfer-0.4.2-py3-none-any.whl"}'
OWN = ("wheels/edgeinfer-0.4.2-py3-none-any.whl", None, b"PK")


@pytest.mark.parametrize(("members", "words"), [
    ([("bundle.json", None, INDEX), OWN, ("wheels/../../evil.whl", None, b"x")], "unexpected member"),
    ([("bundle.json", None, INDEX), OWN, ("/etc/cron.d/x.whl", None, b"x")], "unexpected member"),
    ([("bundle.json", None, INDEX), OWN, ("wheels/link.whl", tarfile.SYMTYPE, b"/etc/passwd")], "unexpected member"),
    ([("bundle.json", None, INDEX), OWN, ("wheels/hard.whl", tarfile.LNKTYPE, b"bundle.json")], "unexpected member"),
    ([("bundle.json", None, INDEX), OWN, ("setup.py", None, b"import os")], "unexpected member"),
    ([OWN], "no bundle.json"),
    ([("bundle.json", None, INDEX)], "does not hold its own wheel"),
    ([("bundle.json", None, INDEX.replace(b"edgeinfer\"", b"other\"")), OWN], "not an index"),
    ([("bundle.json", None, INDEX.replace(b"0.4.2\"", b"banana\"", 1)), OWN], "not a version"),
    ([("bundle.json", None, b"{not json"), OWN], "does not unpack"),
    ([("bundle.json", None, INDEX), OWN, OWN], "twice"),
])
def test_a_bundle_is_unpacked_only_as_what_it_must_be(tmp_path, members, words):
    with pytest.raises(UpdateRejected) as refused:
        unpack(hostile(tmp_path, members), tmp_path / "out")
    assert refused.value.reason == "bad_bundle" and words in refused.value.detail, refused.value.detail
    assert not (tmp_path / "evil.whl").exists() and not list((tmp_path / "out").rglob("link.whl"))


def test_not_a_tar_at_all(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x89PNG not a tar" * 100)
    with pytest.raises(UpdateRejected, match="bad_bundle"):
        unpack(junk, tmp_path / "out")


def test_version_numbers_order_releases():
    assert version_number("0.1.0") < version_number("0.1.1") < version_number("0.2.0") < version_number("1.0")
    assert version_number("1.2.3") == 1_002_003 and version_number("2") == 2_000_000
    assert version_number("0.2.0rc1") == version_number("0.2.0") == version_number("0.2.0.post1+local")
    for bad in ("", "banana", "1!2.0", "1.2.3.4", "0.1000.0", "3000.0.0"):
        with pytest.raises(ValueError):
            version_number(bad)


def test_pack_refuses_what_is_not_an_agent(tmp_path, wheels):
    main, deps = wheels
    with pytest.raises(ValueError, match="not of edgeinfer"):
        pack(deps / "numpy-1.26.4-py3-none-any.whl", tmp_path / "b.tar")
    wheel(deps, "edgeinfer", "0.4.1")
    with pytest.raises(ValueError, match="another edgeinfer wheel"):
        pack(main, tmp_path / "b.tar", wheels_dir=deps)
    with pytest.raises(ValueError, match="not a wheel"):
        wheel_metadata(tmp_path / "missing.whl")


def test_deploy_agent_refuses_bad_input_before_anything_is_sent(tmp_path, wheels):
    main, _ = wheels
    fleet = ["--fleet-url", "http://127.0.0.1:9"]  # nothing listens there: nothing may be sent
    env = {**os.environ, "EDGEINFER_FLEET_TOKEN": "eit_000000000000_x"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(edgeinfer_cmd("deploy", *args, *fleet), capture_output=True, text=True, timeout=120,
                              env=env)

    both = run(str(main), "--agent", str(main), "--all")
    assert both.returncode == 2 and "one of them" in both.stderr
    versioned = run("--agent", str(main), "--version", "3", "--all")
    assert versioned.returncode == 2 and "takes its version from the wheel" in versioned.stderr
    not_a_wheel = tmp_path / "notes.whl"
    not_a_wheel.write_text("hello")
    refused = run("--agent", str(not_a_wheel), "--all")
    assert refused.returncode == 2 and "is not a wheel" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1  # one line, no traceback
    model = run(str(main), "--all")
    assert model.returncode == 2 and "needs --version" in model.stderr
