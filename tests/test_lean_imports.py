"""What keeps the agent lean: deferred modules (edgeinfer/util/defer.py) and package metadata read without
importlib.metadata (edgeinfer/util/dist.py). Each check runs in a fresh interpreter: it is about what a process
has imported, which this test process cannot show."""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import json
import subprocess
import sys
import textwrap

import pytest
from support.assets import REPO

from edgeinfer.util import dist


def run_python(code: str, *, path: tuple[str, ...] = ()) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join((str(REPO), *path))}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_deferred_module_is_imported_at_its_first_attribute_use():
    seen = run_python("""
        import json, sys
        from edgeinfer.util.defer import defer_imports, is_deferred
        deferred = defer_imports()
        import ssl, hashlib, urllib.request                 # what paho does at its import
        from paho.mqtt import client                        # paho itself, against the stand-ins
        before = {name: name in sys.modules for name in ("_ssl", "_hashlib", "http.client", "email")}
        stand_in = ssl
        context = ssl.create_default_context()              # a TLS broker: the real module now
        from ssl import SSLContext
        try:
            ssl.no_such_name
            missing = "no error"
        except AttributeError as exc:
            missing = str(exc)
        print(json.dumps({"deferred": deferred, "before": before, "is_deferred": is_deferred("ssl"),
                          "real": "_ssl" in sys.modules, "same_class": isinstance(context, SSLContext),
                          "same_objects": stand_in.SSLContext is sys.modules["ssl"].SSLContext,
                          "missing": missing, "proxies": isinstance(urllib.request.getproxies(), dict),
                          "urllib_attribute": sys.modules["urllib"].request is urllib.request,
                          "sha256": hashlib.sha256(b"edgeinfer").hexdigest()}))
    """)
    assert {"ssl", "hashlib", "urllib.request"} <= set(seen["deferred"])
    assert seen["before"] == {"_ssl": False, "_hashlib": False, "http.client": False, "email": False}
    assert seen["real"] and not seen["is_deferred"] and seen["same_class"] and seen["same_objects"]
    assert "no_such_name" in seen["missing"]
    assert seen["proxies"] and seen["urllib_attribute"]
    assert seen["sha256"] == hashlib.sha256(b"edgeinfer").hexdigest()


def test_imported_modules_are_left_alone_and_absent_ones_are_not_invented():
    seen = run_python("""
        import json, sys, ssl
        from edgeinfer.util.defer import defer_imports
        deferred = defer_imports(("ssl", "no_such_module_here"))
        print(json.dumps({"deferred": deferred, "ssl_real": type(sys.modules["ssl"]).__name__,
                          "absent": "no_such_module_here" in sys.modules}))
    """)
    assert seen == {"deferred": [], "ssl_real": "module", "absent": False}


def test_builtin_hashes_give_the_same_digests_without_openssl(tmp_path):
    blob = tmp_path / "model.bin"
    blob.write_bytes(bytes(range(256)) * 4099)
    seen = run_python(f"""
        import json, sys
        from edgeinfer.util.defer import defer_imports, prefer_builtin_hashes
        defer_imports()
        chosen = prefer_builtin_hashes()
        from edgeinfer.util.fs import sha256_file
        import hmac, secrets
        print(json.dumps({{"chosen": chosen, "digest": sha256_file({str(blob)!r}),
                          "openssl": "_hashlib" in sys.modules and sys.modules["_hashlib"] is not None,
                          "hmac": hmac.new(b"k", b"m", "sha256").hexdigest(), "token": len(secrets.token_hex(4))}}))
    """)
    assert seen["chosen"] is True and seen["openssl"] is False
    assert seen["digest"] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert seen["hmac"] == hmac.new(b"k", b"m", "sha256").hexdigest() and seen["token"] == 8


@pytest.mark.parametrize("name", ["paho-mqtt", "numpy", "ai-edge-litert", "opencv-python-headless", "PyYAML",
                                  "edgeinfer", "not-a-package-anyone-installed"])
def test_versions_read_from_dist_info_match_importlib_metadata(name):
    try:
        expected = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert dist.version(name) == expected


def test_versions_and_entry_points_without_importing_importlib_metadata(tmp_path):
    site = tmp_path / "site"
    info = site / "Lab_Tool-2.5.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-tool\nVersion: 2.5\n\nVersion: 9 (body)\n")
    legacy = site / "old_pkg-0.3-py3.11.egg-info"
    legacy.mkdir()
    (legacy / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: old-pkg\nVersion: 0.3\n")
    seen = run_python("""
        import json, sys
        from edgeinfer.util import dist
        print(json.dumps({"lab": dist.version("lab.tool"), "old": dist.version("Old-Pkg"),
                          "plugins": dist.entry_points("edgeinfer.delegates"),
                          "metadata": "importlib.metadata" in sys.modules}))
    """, path=(str(site),))
    assert seen == {"lab": "2.5", "old": "0.3", "plugins": {}, "metadata": False}

    (info / "entry_points.txt").write_text("[console_scripts]\nlab = lab:main\n\n"
                                           "[edgeinfer.delegates]\nlabcpu = labdelegate:LabCpuDelegate\n")
    seen = run_python("""
        import json, sys
        from edgeinfer.util import dist
        print(json.dumps({"plugins": dist.entry_points("edgeinfer.delegates")}))
    """, path=(str(site),))
    assert seen == {"plugins": {"labcpu": "labdelegate:LabCpuDelegate"}}


def test_an_egg_on_the_path_is_left_to_importlib_metadata(tmp_path):
    egg = tmp_path / "site" / "zipped_thing-1.0-py3.11.egg"
    egg.parent.mkdir()
    egg.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    seen = run_python("""
        import json, sys
        from edgeinfer.util import dist
        version = dist.version("numpy")
        print(json.dumps({"numpy": version, "metadata": "importlib.metadata" in sys.modules}))
    """, path=(str(egg.parent),))
    assert seen["metadata"] is True and seen["numpy"] == importlib.metadata.version("numpy")
