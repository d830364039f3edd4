"""Signed commands: what sign_command binds (device, expiry, every field) and each reason verify_command gives."""

from __future__ import annotations

import base64
import json

import pytest

from edgeinfer.errors import CommandRejected
from edgeinfer.link.protocol import decode, encode, make_command
from edgeinfer.updates.signing import (
    COMMAND_TTL_S,
    MAX_COMMAND_TTL_S,
    SigningKey,
    VerifyKey,
    canonical_json,
    check_command_expiry,
    sign_command,
)

NOW = 1_750_000_000.0


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def pinned(key) -> VerifyKey:
    return VerifyKey(key.public_key_b64())


def rollback(key: SigningKey, **overrides) -> dict:
    fields = {"device_id": "cam-01", "expires": NOW + 3600}
    fields.update(overrides)
    return sign_command(key, make_command("c-1", "rollback", {"pipeline": "main"}, ts=NOW), **fields)


def reason(pinned: VerifyKey, message: dict, device_id: str = "cam-01", **kwargs) -> str:
    with pytest.raises(CommandRejected) as info:
        pinned.verify_command(message, device_id=device_id, now=kwargs.pop("now", NOW), **kwargs)
    return info.value.reason


def test_sign_command_binds_device_and_expiry_and_survives_the_wire(key, pinned):
    original = make_command("c-1", "rollback", {"pipeline": "main"}, ts=NOW)
    signed = sign_command(key, original, device_id="cam-01", expires=NOW + 60)
    assert "sig" not in original and "device" not in original  # a copy: the input is left alone
    assert signed["device"] == "cam-01" and signed["expires"] == NOW + 60
    unsigned = {k: v for k, v in signed.items() if k != "sig"}
    assert key.sign_bytes(canonical_json(unsigned)) == signed["sig"]
    received = decode("cmd", encode(signed))  # the schema takes device and sig
    pinned.verify_command(received, device_id="cam-01", now=NOW)
    # re-signing replaces the old signature instead of signing over it
    again = sign_command(key, signed, device_id="cam-02", expires=NOW + 60)
    pinned.verify_command(again, device_id="cam-02", now=NOW)


def test_each_refusal_has_its_own_reason(key, pinned):
    good = rollback(key)
    assert reason(pinned, {k: v for k, v in good.items() if k != "sig"}) == "unsigned"
    assert reason(pinned, rollback(SigningKey.generate())) == "bad_signature"
    assert reason(pinned, {**good, "args": {"pipeline": "other"}}) == "bad_signature"  # tampered after signing
    assert reason(pinned, {**good, "id": "c-2"}) == "bad_signature"
    assert reason(pinned, {**good, "expires": NOW + 7200}) == "bad_signature"  # the expiry is signed too
    assert reason(pinned, {**good, "sig": "not base64!"}) == "bad_signature"
    assert reason(pinned, {**good, "sig": 12}) == "bad_signature"
    assert reason(pinned, rollback(key, device_id="cam-02")) == "wrong_device"
    assert reason(pinned, good, device_id="cam-02") == "wrong_device"
    no_expiry = {k: v for k, v in good.items() if k not in ("sig", "expires")}
    assert reason(pinned, {**no_expiry, "sig": key.sign_bytes(canonical_json(no_expiry))}) == "no_expiry"
    assert reason(pinned, rollback(key, expires=NOW - 1)) == "expired"
    assert reason(pinned, rollback(key, expires=NOW + MAX_COMMAND_TTL_S + 1)) == "expiry_too_far"
    assert reason(pinned, rollback(key, expires=NOW + 120), max_ttl_s=60) == "expiry_too_far"
    pinned.verify_command(rollback(key, expires=NOW + MAX_COMMAND_TTL_S), device_id="cam-01", now=NOW)
    pinned.verify_command(good, device_id="cam-01", now=NOW)


def test_a_signature_has_one_spelling(key, pinned):
    """base64 ignores the unused low bits of the last character: another spelling of a good signature is refused."""
    good = rollback(key)
    raw = base64.b64decode(good["sig"])
    assert len(good["sig"]) == 88 and good["sig"].endswith("==")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(good["sig"][-3])
    twin = good["sig"][:-3] + alphabet[last ^ 1] + "=="  # same bytes, different text
    assert base64.b64decode(twin) == raw and twin != good["sig"]
    assert reason(pinned, {**good, "sig": twin}) == "bad_signature"


def test_a_message_that_cannot_be_put_in_canonical_form_is_a_bad_signature(key, pinned):
    good = rollback(key)
    assert reason(pinned, {**good, "args": {"x": "\ud800"}}) == "bad_signature"  # a lone surrogate: not UTF-8
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert reason(pinned, {**good, "args": {"x": deep}}) == "bad_signature"


def test_expiry_rules_alone():
    check_command_expiry({"expires": NOW}, now=NOW)  # the last moment it may run
    for expires, why in [(None, "no_expiry"), ("soon", "no_expiry"), (True, "no_expiry"), (NOW - 0.001, "expired"),
                         (NOW + MAX_COMMAND_TTL_S + 0.001, "expiry_too_far")]:
        with pytest.raises(CommandRejected) as info:
            check_command_expiry({"expires": expires}, now=NOW)
        assert info.value.reason == why
    assert COMMAND_TTL_S == 24 * 3600 and MAX_COMMAND_TTL_S == 8 * 24 * 3600


def test_the_manifest_api_is_unchanged(key, pinned):
    """Manifests are signed and verified as before (sign() is now sign_bytes over the canonical JSON)."""
    from edgeinfer.updates.signing import new_manifest

    manifest = new_manifest(model_name="m", version=2, sha256="a" * 64, size=1, url="http://x/a", target="all")
    signature = key.sign(manifest)
    assert pinned.verify(manifest.to_dict(), signature) == manifest
    assert pinned.verify_bytes(canonical_json(manifest.to_dict()), signature)
    assert not pinned.verify_bytes(json.dumps(manifest.to_dict()).encode(), signature)
