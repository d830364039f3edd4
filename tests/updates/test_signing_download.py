"""Signed manifests, the artifact server's Range support and resumable downloads, over real sockets."""

from __future__ import annotations

import hashlib
import urllib.request

import pytest
from support.assets import MODELS
from support.fleet import DEVICE_LOGIN, CuttingProxy, artifact_server
from support.processes import run_without

from edgeinfer.errors import ConfigError, DownloadError, UpdateRejected
from edgeinfer.fleet.artifacts import ArtifactStore
from edgeinfer.updates.download import basic_auth, download
from edgeinfer.updates.signing import Manifest, SigningKey, VerifyKey, new_manifest

MODEL = MODELS / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
SHA = hashlib.sha256(MODEL.read_bytes()).hexdigest()
SIZE = MODEL.stat().st_size


@pytest.fixture
def server(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    assert store.put(MODEL) == (SHA, SIZE)
    with artifact_server(store, tmp_path) as srv:
        yield srv


AS_DEVICE = basic_auth(*DEVICE_LOGIN)  # what an enrolled agent sends


def manifest(**overrides) -> Manifest:
    fields = dict(model_name="birds", version=2, sha256=SHA, size=SIZE, url="http://127.0.0.1/a", target="all")
    fields.update(overrides)
    return new_manifest(**fields)


def test_signature_round_trip_and_tamper_detection(tmp_path):
    key = SigningKey.generate()
    private, public = key.save(tmp_path)
    assert private.stat().st_mode & 0o777 == 0o600
    loaded = SigningKey.load(private)
    pinned = VerifyKey.from_config_value(str(public))
    signed = manifest()
    signature = loaded.sign(signed)
    assert pinned.verify(signed.to_dict(), signature) == signed
    tampered = signed.to_dict() | {"sha256": "0" * 64}
    with pytest.raises(UpdateRejected) as info:
        pinned.verify(tampered, signature)
    assert info.value.reason == "bad_signature"
    other = VerifyKey(SigningKey.generate().public_key_b64())
    with pytest.raises(UpdateRejected, match="bad_signature"):
        other.verify(signed.to_dict(), signature)
    with pytest.raises(ConfigError, match="exists"):
        key.save(tmp_path)


def test_a_missing_cryptography_names_the_pip_extra():
    """Without cryptography, pinning or loading a key is a MissingDependency that says what to install."""
    done = run_without({"cryptography"}, """
        from edgeinfer.errors import MissingDependency
        from edgeinfer.updates.signing import SigningKey, VerifyKey
        for make in (lambda: VerifyKey('AAAA'), SigningKey.generate, lambda: SigningKey.load('k')):
            try:
                make()
            except MissingDependency as exc:
                print(exc)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("pip install 'edgeinfer[fleet]'") == 3


def test_expired_and_malformed_manifests(tmp_path):
    key = SigningKey.generate()
    pinned = VerifyKey(key.public_key_b64())
    old = manifest(now=1000.0, ttl_s=10)
    with pytest.raises(UpdateRejected) as info:
        pinned.verify(old.to_dict(), key.sign(old))
    assert info.value.reason == "expired"
    bad = manifest(size=-5)
    with pytest.raises(UpdateRejected) as info:
        pinned.verify(bad.to_dict(), key.sign(bad))
    assert info.value.reason == "bad_manifest"
    with pytest.raises(UpdateRejected, match="bad_manifest"):
        Manifest.from_dict({"unexpected": 1})
    with pytest.raises(ConfigError):
        VerifyKey("not base64!")


def test_server_honours_range(server):
    request = urllib.request.Request(server.artifact_url(SHA), headers={"Range": "bytes=100-199", **AS_DEVICE})
    with urllib.request.urlopen(request) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes 100-199/{SIZE}"
        assert response.read() == MODEL.read_bytes()[100:200]


def test_download_completes_and_verifies(server, tmp_path):
    seen = []
    path = download(server.artifact_url(SHA), tmp_path / "m.tflite", sha256=SHA, size=SIZE, progress=seen.append,
                    headers=AS_DEVICE)
    assert path.read_bytes() == MODEL.read_bytes()
    assert seen[-1] == SIZE and not (tmp_path / "m.tflite.part").exists()


def test_download_cut_several_times_resumes(server, tmp_path):
    proxy = CuttingProxy(server.port, cut_after=700_000, cuts=4)
    try:
        url = f"http://127.0.0.1:{proxy.port}/artifacts/{SHA}"
        path = download(url, tmp_path / "m.tflite", sha256=SHA, size=SIZE, backoff_s=0.01, headers=AS_DEVICE)
    finally:
        proxy.close()
    assert path.read_bytes() == MODEL.read_bytes()
    assert proxy.connections >= 5  # four cut connections, then one that finished


def test_tampered_artifact_is_rejected_and_removed(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    sha, size = store.put(MODEL)
    stored = store.get(sha)
    data = bytearray(stored.read_bytes())
    data[1000] ^= 0xFF  # flip a byte on the server's disk
    stored.write_bytes(bytes(data))
    with artifact_server(store, tmp_path) as srv, pytest.raises(UpdateRejected) as info:
        download(srv.artifact_url(sha), tmp_path / "m.tflite", sha256=sha, size=size, headers=AS_DEVICE)
    assert info.value.reason == "sha256_mismatch"
    assert not (tmp_path / "m.tflite").exists() and not (tmp_path / "m.tflite.part").exists()


def test_size_mismatch_missing_artifact_and_refused_credentials(server, tmp_path):
    with pytest.raises(UpdateRejected, match="size_mismatch"):
        download(server.artifact_url(SHA), tmp_path / "m", sha256=SHA, size=SIZE - 1, headers=AS_DEVICE)
    # a refusal ends the download at once (no retries), saying what it means
    with pytest.raises(DownloadError, match=r"HTTP 404.*does not have this artifact"):
        download(server.artifact_url("a" * 64), tmp_path / "n", sha256="a" * 64, size=10, headers=AS_DEVICE)
    for headers in ({}, basic_auth(DEVICE_LOGIN[0], "wrong")):
        with pytest.raises(DownloadError, match=r"HTTP 401.*credential was refused"):
            download(server.artifact_url(SHA), tmp_path / "o", sha256=SHA, size=SIZE, headers=headers)
    assert not (tmp_path / "o").exists()
