"""A real Mosquitto broker that the tests start themselves, and a subscriber that collects messages.

The broker runs as a subprocess on a free port with persistence off, can be SIGKILLed and restarted
on the same port (a broker crash that loses every session and in-flight message), and can serve
TLS or require a password.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.ports import free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"



def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_key: Path  # a valid key that belongs to no certificate here


def make_tls_files(folder: Path) -> TlsFiles:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost, and a client certificate (openssl CLI)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=edgeinfer test CA")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject in (("server", "/CN=localhost"), ("client", "/CN=cam-01")):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []))
    openssl("genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "other.key")
    return TlsFiles(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "client.crt",
                    folder / "client.key", folder / "other.key")


class Broker:
    """One Mosquitto process on a fixed port; start/kill/restart at will."""

    def __init__(self, workdir: Path, *, port: int | None = None, tls: TlsFiles | None = None,
                 users: dict[str, str] | None = None, config: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.tls = tls
        self.proc: subprocess.Popen | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        # run as whoever runs the tests (started as root, mosquitto would switch to a user that cannot
        # read the test's temporary files)
        lines = [f"user {getpass.getuser()}", f"listener {self.port} 127.0.0.1", "persistence false",
                 "log_dest stderr",
                 "log_type error", "log_type warning", "log_type notice", "log_type information"]
        if users:
            passwd = workdir / "passwd"
            passwd.write_text("")
            for user, password in users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True,
                               capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        if tls:
            lines += [f"cafile {tls.ca}", f"certfile {tls.server_cert}", f"keyfile {tls.server_key}",
                      "require_certificate true", "tls_version tlsv1.2"]
        lines += config  # extra mosquitto.conf lines, e.g. "max_packet_size 2000"
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.log = workdir / "mosquitto.log"

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10) -> Broker:
        """Start it and wait until it listens; a RuntimeError that says why if it cannot (never a skip: `make
        test` installs Mosquitto)."""
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        command = [MOSQUITTO, "-c", str(self.conf)]
        try:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(command, stdout=log, stderr=log)
        except OSError as exc:
            raise RuntimeError(f"`{shlex.join(command)}` could not run: {exc} (apt-get install mosquitto, or make "
                               "system-deps)") from exc
        deadline = time.monotonic() + timeout
        while not _port_open(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"`{shlex.join(command)}` exited with status {self.proc.returncode}:\n"
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"`{shlex.join(command)}` did not listen on {self.port} within {timeout} s:\n"
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL: the broker loses every session and every message it held (persistence is off)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@contextlib.contextmanager
def running_broker(workdir: Path) -> Iterator[Broker]:
    """A fresh Mosquitto on a free port, killed on exit (test modules wrap it in a `broker` fixture)."""
    b = Broker(workdir / "broker").start()
    try:
        yield b
    finally:
        b.kill()


class Collector:
    """A subscriber on ``edgeinfer/v1/#`` (like a fleet manager) that records every message it gets.

    It reconnects by itself after a broker restart; ``wait_subscribed()`` says when it is listening again.
    """

    def __init__(self, port: int, topic: str = "edgeinfer/v1/#", *, tls: TlsFiles | None = None) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.messages: list[tuple[str, Any, bool]] = []  # (topic, decoded JSON or raw bytes, retained)
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.topic = topic
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"collector-{os.getpid()}-{port}",
                                  protocol=paho.MQTTv311)
        if tls:
            self.client.tls_set(ca_certs=str(tls.ca), certfile=str(tls.client_cert), keyfile=str(tls.client_key))
        self.client.reconnect_delay_set(0.05, 0.2)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *a: self._subscribed.clear()
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect_async("127.0.0.1", port, keepalive=5)
        self.client.loop_start()

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        if not reason.is_failure:
            client.subscribe(self.topic, qos=1)

    def _on_message(self, client, userdata, message) -> None:
        try:
            body: Any = json.loads(message.payload)
        except (ValueError, RecursionError):  # not JSON, or nested too deep (hostile commands the tests send)
            body = bytes(message.payload)
        with self._lock:
            self.messages.append((message.topic, body, bool(message.retain)))

    def wait_subscribed(self, timeout: float = 10) -> bool:
        return self._subscribed.wait(timeout)

    def of_kind(self, kind: str) -> list[dict]:
        with self._lock:
            return [body for topic, body, _r in self.messages if topic.endswith("/" + kind)]

    def wait_until(self, predicate: Callable[[Collector], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return predicate(self)

    def publish(self, topic: str, payload: bytes | str, qos: int = 1) -> None:
        self.client.publish(topic, payload, qos=qos).wait_for_publish(5)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def seqs(messages: list[dict], boot_id: str) -> list[int]:
    """The telemetry seqs of one boot, in arrival order (duplicates kept)."""
    return [m["seq"] for m in messages if isinstance(m, dict) and m.get("boot_id") == boot_id]
