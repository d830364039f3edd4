"""`edgeinfer keys` as a user runs it."""

from __future__ import annotations

import json
import subprocess

from support.processes import edgeinfer_cmd

from edgeinfer.updates.signing import SigningKey, VerifyKey, new_manifest


def test_keys_init_and_show(tmp_path):
    out = subprocess.run(edgeinfer_cmd("keys", "init", "--dir", str(tmp_path), "--json"),
                         capture_output=True, text=True, check=True)
    made = json.loads(out.stdout)
    assert (tmp_path / "fleet-signing.key").stat().st_mode & 0o777 == 0o600
    key = SigningKey.load(made["private_key"])
    manifest = new_manifest(model_name="m.tflite", version=1, sha256="a" * 64, size=1, url="http://x/y", target="all")
    VerifyKey(made["public_key"]).verify(manifest.to_dict(), key.sign(manifest))
    again = subprocess.run(edgeinfer_cmd("keys", "init", "--dir", str(tmp_path)), capture_output=True, text=True)
    assert again.returncode == 1 and "refusing to replace" in again.stderr
    shown = subprocess.run(edgeinfer_cmd("keys", "show", "--dir", str(tmp_path)), capture_output=True, text=True)
    assert shown.stdout.strip() == made["public_key"]
