"""edgeinfer._redact: the one redaction of secrets — in the agent's log ring, the lines the manager stores, a doctor's
report and every stream URL a log or an error names."""

from __future__ import annotations

import pytest

from edgeinfer._redact import redact, redact_values
from edgeinfer.capture.media import redact_url, stream_description

TOKEN = "eit_0123456789ab_" + "Zx9" * 14 + "Q"


@pytest.mark.parametrize(("text", "masked"), [
    # passwords in URLs: the user stays, the password goes — whatever it holds
    ("cannot open rtsp://admin:s3cr3t@10.0.0.5:554/Streaming/101 (timeout)",
     "cannot open rtsp://admin:***@10.0.0.5:554/Streaming/101 (timeout)"),
    ("rtsp://admin:p@ss@cam.local/stream?mail=a@b", "rtsp://admin:***@cam.local/stream?mail=a@b"),
    ("'http://viewer:pa:ss@127.0.0.1:8080/video.mjpeg'", "'http://viewer:***@127.0.0.1:8080/video.mjpeg'"),
    ("mqtts://edgeinfer-f-cam:AbC%2Fd@broker:8883", "mqtts://edgeinfer-f-cam:***@broker:8883"),
    ("https://ghp_abcdef123456@github.com/x.git", "https://***@github.com/x.git"),  # a token as the user name
    ("a=rtsp://u:one@h1/x b=rtsp://u:two@h2/y", "a=rtsp://u:***@h1/x b=rtsp://u:***@h2/y"),
    # credentials in headers and the fleet's API tokens (their id stays: it names the token, opens nothing)
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: *** ***"),
    ("sent Bearer abcdefghijklmnop", "sent Bearer ***"),
    (f"token file holds {TOKEN}", "token file holds eit_0123456789ab_***"),
    # key = value, key: value, JSON
    ("password=hunter2&user=bob", "password=***&user=bob"),
    ('{"password": "hunter2", "user": "bob"}', '{"password": "***", "user": "bob"}'),
    ("mqtt: {username: bob, password: hunter2}", "mqtt: {username: bob, password: ***}"),
    ("X-Api-Key: 12345", "X-Api-Key: ***"),
    ("GET /artifacts/abc?grant=1718.cam-01.c2lnbmF0dXJl HTTP/1.1", "GET /artifacts/abc?grant=*** HTTP/1.1"),
    ("client_secret = 'xyz'", "client_secret = '***'"),
    ("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n-----END PRIVATE KEY-----\nnext",
     "-----BEGIN PRIVATE KEY----- *** -----END PRIVATE KEY-----\nnext"),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB (cut)",
     "-----BEGIN EC PRIVATE KEY----- *** -----END EC PRIVATE KEY-----"),
])
def test_secrets_are_masked(text, masked):
    assert redact(text) == masked
    assert redact(masked) == masked  # masking twice changes nothing (the device and the manager both do)


@pytest.mark.parametrize("text", [
    "rtsp://cam.local:554/stream1 opened (1920x1080)",
    "password_file: /etc/edgeinfer/broker.password",  # names where a secret is, holds none
    "signal: 15 received, stopping",
    "3 tokens left in the bucket",
    "pipeline main failed: CaptureError: cannot open stream rtsp://viewer:***@cam/x",
    "update_public_key: MCowBQYDK2VwAyEA",
    "",
])
def test_what_holds_no_secret_is_left_as_it_is(text):
    assert redact(text) == text


def test_a_report_is_masked_in_every_string_it_holds():
    report = {"findings": [{"check": "camera", "detail": "rtsp://u:pw@h/x refused", "fix": None, "n": 3}],
              "user": "root"}
    assert redact_values(report) == {"findings": [{"check": "camera", "detail": "rtsp://u:***@h/x refused",
                                                   "fix": None, "n": 3}], "user": "root"}


def test_stream_urls_in_logs_and_errors_are_masked_by_the_same_function():
    url = "rtsp://admin:p@ss@cam.local/stream"
    assert redact_url(url) == redact(url) == "rtsp://admin:***@cam.local/stream"  # no "ss@" left over
    assert stream_description(url) == "stream rtsp://admin:***@cam.local/stream"
