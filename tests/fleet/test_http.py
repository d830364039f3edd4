"""The fleet manager's HTTP server (FastAPI on uvicorn) on a real socket: Range downloads, streamed uploads,
the JSON API and its errors, OpenAPI, graceful shutdown. Requests carry a real admin token (tokens and
roles themselves: test_auth.py)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.error
import urllib.request

import pytest
from support.fleet import api_server, state_message, telemetry_message

from edgeinfer.fleet.artifacts import ArtifactStore
from edgeinfer.fleet.auth import TokenStore
from edgeinfer.fleet.client import FleetClient
from edgeinfer.fleet.db import FleetDB
from edgeinfer.fleet.http import FleetHTTPServer


@pytest.fixture
def artifact(tmp_path):
    data = os.urandom(1 << 20)
    store = ArtifactStore(tmp_path / "store")
    source = tmp_path / "model.bin"
    source.write_bytes(data)
    sha, _ = store.put(source)
    return store, sha, data


@pytest.fixture
def db(tmp_path):
    """A real (SQLite) fleet database that knows one device, cam-1, with three telemetry windows; ADMIN set to
    an admin token for ``get``."""
    db = FleetDB(f"sqlite:///{tmp_path / 'fleet.sqlite3'}")
    db.record_state("f", "cam-1", state_message("cam-1", "b" * 32))
    for seq in (1, 2, 3):
        db.record_telemetry("f", "cam-1", telemetry_message("cam-1", "b" * 32, seq))
    global ADMIN
    ADMIN = TokenStore(db).create(name="test-admin", role="admin")["token"]
    yield db
    db.close()


@pytest.fixture
def server(artifact, db, tmp_path):
    store, _, _ = artifact
    with api_server(db, tmp_path / "api", artifacts=store) as (srv, _):
        yield srv


ADMIN = ""


def bearer(extra: dict | None = None) -> dict:
    return {"Authorization": f"Bearer {ADMIN}", **(extra or {})}


def get(url: str, headers: dict | None = None, method: str = "GET") -> tuple[int, object, bytes]:
    """(status, headers — case-insensitive —, body), as the admin."""
    request = urllib.request.Request(url, headers=bearer(headers), method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


@pytest.mark.parametrize(("header", "status", "content_range", "span"), [
    (None, 200, None, (0, 1 << 20)),
    ("bytes=100-199", 206, "bytes 100-199/1048576", (100, 200)),
    ("bytes=1048000-", 206, "bytes 1048000-1048575/1048576", (1048000, 1 << 20)),
    ("bytes=-50", 206, "bytes 1048526-1048575/1048576", ((1 << 20) - 50, 1 << 20)),
    ("bytes=1048500-9999999", 206, "bytes 1048500-1048575/1048576", (1048500, 1 << 20)),
    ("bytes=1048576-", 416, "bytes */1048576", None),
    ("bytes=5-2", 400, None, None),  # not a range at all (Starlette: 400 Malformed range)
])
def test_artifact_ranges(server, artifact, header, status, content_range, span):
    _, sha, data = artifact
    code, headers, body = get(server.artifact_url(sha), {"Range": header} if header else {})
    assert code == status
    assert headers.get("Content-Range") == content_range
    if span:
        assert body == data[span[0]:span[1]] and headers["Accept-Ranges"] == "bytes"


def test_an_interrupted_download_resumes_with_range(server, artifact):
    _, sha, data = artifact
    with urllib.request.urlopen(urllib.request.Request(server.artifact_url(sha), headers=bearer()),
                                timeout=10) as response:
        first = response.read(300_000)  # then the connection is dropped
    code, _, rest = get(server.artifact_url(sha), {"Range": f"bytes={len(first)}-"})
    assert code == 206 and hashlib.sha256(first + rest).hexdigest() == sha
    code, headers, body = get(server.artifact_url(sha), method="HEAD")
    assert code == 200 and headers["Content-Length"] == str(len(data)) and body == b""


def test_uploads_stream_to_disk(tmp_path, server, artifact):
    big = tmp_path / "big.bin"
    with open(big, "wb") as out:
        for _ in range(64):
            out.write(os.urandom(1 << 20))
    tracemalloc.start()
    try:
        answer = FleetClient(server.url, token=ADMIN).upload(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer == {"sha256": hashlib.sha256(big.read_bytes()).hexdigest(), "size": 64 << 20}
    assert artifact[0].get(answer["sha256"]).read_bytes() == big.read_bytes()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB traced while uploading 64 MiB: the file went through memory"


def leftovers(store: ArtifactStore) -> list[str]:
    return [p.name for p in store.root.rglob("*") if p.is_file()]


def test_refused_and_broken_uploads_keep_nothing(tmp_path, db):
    store = ArtifactStore(tmp_path / "store")
    with api_server(db, tmp_path / "api", artifacts=store, max_upload_bytes=1000) as (server, _):
        code, _, body = get(f"{server.url}/api/artifacts", method="PUT")  # Content-Length: 0
        assert code == 400 and "empty" in json.loads(body)["error"]
        request = urllib.request.Request(f"{server.url}/api/artifacts", data=b"x" * 2000, method="PUT",
                                         headers=bearer())
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 413
        with socket.create_connection(("127.0.0.1", server.port)) as sock:  # promises 900 bytes, sends 100, leaves
            sock.sendall(b"PUT /api/artifacts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ADMIN.encode()
                         + b"\r\nContent-Length: 900\r\n\r\n" + b"y" * 100)
        time.sleep(0.5)
        assert get(f"{server.url}/healthz")[0] == 200  # still serving
    assert leftovers(store) == []


def test_json_api_routes_and_hostile_requests(server, artifact):
    base = server.url
    assert [(d["device_id"], d["online"]) for d in json.loads(get(f"{base}/api/devices")[2])] == [("cam-1", True)]
    assert get(f"{base}/api/devices/cam-1")[0] == 200
    code, _, body = get(f"{base}/api/devices/ghost")
    assert code == 404 and json.loads(body) == {"error": "no device ghost"}
    code, _, body = get(f"{base}/api/devices/no%20such")
    assert code == 400 and "device id must be 1-64" in json.loads(body)["error"]
    assert [m["seq"] for m in json.loads(get(f"{base}/api/devices/cam-1/telemetry?limit=2")[2])] == [2, 3]
    for bad in ("limit=0", "limit=999999", "limit=abc"):
        code, _, body = get(f"{base}/api/devices/cam-1/telemetry?{bad}")
        assert code == 400 and "limit" in json.loads(body)["error"]
    assert get(f"{base}/api/deployments/nope")[0] == 404
    for path in ("/artifacts/../../etc/passwd", "/artifacts/" + "0" * 64, "/nothing/here"):
        code, _, body = get(base + path)
        assert code == 404 and "error" in json.loads(body)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for payload in (b"{not json", b"[1, 2]", b'"text"', b"{}"):
        connection.request("POST", "/api/deployments", body=payload,
                           headers=bearer({"Content-Type": "application/json"}))
        response = connection.getresponse()
        assert response.status == 400 and json.loads(response.read())["error"]
    good = json.dumps({"sha256": artifact[1], "version": 2, "all": True}).encode()
    connection.request("POST", "/api/deployments", body=good, headers=bearer({"Content-Type": "application/json"}))
    response = connection.getresponse()
    created = json.loads(response.read())
    assert response.status == 201 and [t["device_id"] for t in created["devices"]] == ["cam-1"], created
    code, headers, body = get(f"{base}/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain") and b"process_cpu_seconds" in body
    assert get(f"{base}/healthz")[0] == 200
    code, headers, _ = get(f"{base}/api/devices/cam-1", method="DELETE")  # a method the path does not take
    assert code == 405 and headers["Allow"] == "GET"
    code, headers, _ = get(f"{base}/artifacts/{artifact[1]}", method="DELETE")  # two routes, one path
    assert code == 405 and headers["Allow"] == "GET, HEAD"


def test_openapi_describes_the_api(server):
    schema = json.loads(get(f"{server.url}/openapi.json")[2])
    assert schema["info"]["title"] == "edgeinfer fleet manager"
    for path in ("/api/devices", "/api/devices/{device_id}", "/api/deployments", "/api/artifacts",
                 "/artifacts/{sha256}", "/metrics"):
        assert path in schema["paths"], path


def test_close_lets_a_download_in_flight_finish_then_refuses(tmp_path, db):
    store = ArtifactStore(tmp_path / "store")
    source = tmp_path / "m.bin"
    source.write_bytes(os.urandom(32 << 20))
    sha, _ = store.put(source)
    with api_server(db, tmp_path / "api", artifacts=store) as (server, _):
        download_while_closing(server, sha)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            FleetHTTPServer(port=taken.getsockname()[1])


def download_while_closing(server: FleetHTTPServer, sha: str) -> None:
    received = bytearray()
    response = urllib.request.urlopen(urllib.request.Request(server.artifact_url(sha), headers=bearer()), timeout=30)
    received += response.read(1 << 20)
    closer = threading.Thread(target=server.close)
    closer.start()
    while chunk := response.read(1 << 20):
        received += chunk
        time.sleep(0.01)
    closer.join(15)
    assert not closer.is_alive() and hashlib.sha256(received).hexdigest() == sha
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    server.close()  # idempotent


#: a manager's HTTPS server in a child process — with uvicorn's C parts importable or hidden (``sys.modules[name] =
#: None`` makes ``import name`` fail) — answering what served the request and whose client certificate it verified
SERVE_ONE = """
import asyncio, hashlib, json, ssl, sys, urllib.request
folder, hidden = sys.argv[1], sys.argv[2:]
for name in hidden:
    sys.modules[name] = None
from edgeinfer.fleet import http

async def app(scope, receive, send):
    der = scope["state"].get(http.PEER_CERTIFICATE)
    body = json.dumps({"loop": type(asyncio.get_running_loop()).__module__,
                       "parser": getattr(http, "HTTP_PARSER", None),
                       "peer": hashlib.sha256(der).hexdigest() if der else None}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})

with http.FleetHTTPServer(tls=(folder + "/server.crt", folder + "/server.key"), client_ca=folder + "/ca.crt") as server:
    server.start(app)
    context = ssl.create_default_context(cafile=folder + "/ca.crt")
    context.load_cert_chain(folder + "/device.crt", folder + "/device.key")
    with urllib.request.urlopen(server.url + "/", timeout=10, context=context) as answer:
        print(answer.read().decode())
"""


@pytest.mark.parametrize(("hidden", "loop", "parser"), [((), "uvloop", "httptools"),
                                                        (("uvloop", "httptools"), "asyncio", "h11")])
def test_the_server_runs_on_uvloop_and_httptools_and_without_them_and_verifies_client_certificates(
        tmp_path, hidden, loop, parser):
    """uvloop and httptools (the fleet extra's) serve the manager when importable; hidden, asyncio and h11 do — and
    either way the TLS client certificate a device authenticates with reaches the request (fleet/http.py)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from edgeinfer.fleet.broker_auth import FleetCA
    from edgeinfer.fleet.device_certs import read_csr

    ca = FleetCA(tmp_path).ensure()
    ca.server_cert(["127.0.0.1"])
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    cert = ca.sign_csr(read_csr(csr.public_bytes(serialization.Encoding.PEM).decode()), "cam-1", days=1)
    (tmp_path / "device.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "device.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
    done = subprocess.run([sys.executable, "-c", SERVE_ONE, str(tmp_path), *hidden], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout)
    assert served["loop"].split(".")[0] == loop and served["parser"] == parser
    assert served["peer"] == hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


@pytest.mark.parametrize("path", ["/api/v1/provision", "/api/v1/provision/renew"])
def test_a_devices_provisioning_request_is_matched_against_the_provisioning_routes_only(server, monkeypatch, path):
    """A fleet coming up sends thousands of these: the API matches them before the dashboard's ~70 routes, which it
    tried one by one first (api/app.py, ROUTERS); the request is still answered by its route (400 here: no body)."""
    from fastapi.routing import APIRoute

    from edgeinfer.fleet.api import claims, renewal

    tried = []
    matches = APIRoute.matches

    def counted(route, scope):
        if scope.get("path") == path:
            tried.append(route.path)
        return matches(route, scope)

    monkeypatch.setattr(APIRoute, "matches", counted)
    status, _, body = get(f"{server.url}{path}", method="POST", headers={"Content-Length": "0"})
    assert status in (400, 401) and b"error" in body
    provisioning_routes = {route.path for router in (claims.router, renewal.router) for route in router.routes}
    assert tried[-1] == path and set(tried) <= provisioning_routes, tried


def test_a_provisioning_request_refused_for_its_body_takes_no_thread_from_the_pool(server, monkeypatch):
    """What every route's ``Services`` dependency resolves to is a lookup on the event loop, not a run in the thread
    pool and back (api/deps.py): a device's request with a malformed body is refused without one (its route hops
    only for the database's work)."""
    import anyio.to_thread

    runs = []
    run_sync = anyio.to_thread.run_sync

    async def counted(function, *args, **kwargs):
        runs.append(getattr(function, "__name__", repr(function)))
        return await run_sync(function, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    request = urllib.request.Request(f"{server.url}/api/v1/provision", data=b'{"claim": 1}', method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400 and b"claim" in refused.value.read()
    assert runs == []


def test_the_tls_server_sends_no_session_tickets(tmp_path):
    """No client of the manager resumes a TLS session (Python's ssl does not unless given the session): the server
    issues no TLS 1.3 session ticket, whose making was CPU spent on every connection (fleet/http.py)."""
    import ssl

    from edgeinfer.fleet.broker_auth import FleetCA

    ca = FleetCA(tmp_path).ensure()
    certfile, keyfile = ca.server_cert(["127.0.0.1"])

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with FleetHTTPServer(tls=(str(certfile), str(keyfile)), client_ca=str(ca.ca_file)) as server:
        server.start(app)
        connection = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10,
                                                 context=ssl.create_default_context(cafile=str(ca.ca_file)))
        connection.request("GET", "/")
        answer = connection.getresponse()
        assert answer.read() == b"ok"
        session = connection.sock.session
        connection.close()
    assert session is not None and not session.has_ticket
