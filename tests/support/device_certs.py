"""A device's certificate as a plain MQTT client on the managed Mosquitto's certificate listener (what the broker
decides for a certificate: let in, refused, cut off), and an HTTPS request with it (tests/fleet/test_device_certs.py,
test_provisioning_e2e.py)."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt

from .processes import wait_until as wait


def files_of(issued: dict, folder: Path) -> tuple[str, str, str]:
    """The issued certificate, key and CA written as the device keeps them: (cert, key, ca) paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, field in (("device.crt", "certificate"), ("device.key", "private_key"), ("ca.crt", "ca_certificate")):
        (folder / name).write_text(issued[field])
        paths.append(str(folder / name))
    return paths[0], paths[1], paths[2]


class CertDevice:
    """A paho client on the certificate listener with one certificate; records when the broker closes it."""

    def __init__(self, fleet, cert: str, key: str, ca: str) -> None:
        broker = fleet.access.certificate_broker
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="whatever", protocol=mqtt.MQTTv5)
        self.client.tls_set(ca_certs=ca, certfile=cert, keyfile=key)
        self.refused: str | None = None
        self.disconnected_at: float | None = None
        self.client.on_disconnect = lambda *_a, **_k: setattr(self, "disconnected_at", time.monotonic())
        self.client.reconnect_delay_set(60, 60)  # no reconnect within a test's waits: the broker's verdict shows
        try:
            self.client.connect(broker["host"], broker["port"])
            self.client.loop_start()
        except (OSError, ssl.SSLError) as exc:
            self.refused = str(exc)

    def connected(self, timeout: float = 5.0) -> bool:
        return self.refused is None and wait(self.client.is_connected, timeout)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def https(fleet, path: str, cert: str, key: str, *, method: str = "GET", body: bytes | None = None,
          headers: dict | None = None) -> int:
    """The status of a request to ``fleet``'s manager presenting the certificate ``cert`` (key ``key``)."""
    context = ssl.create_default_context(cafile=str(fleet.access.ca.ca_file))
    context.load_cert_chain(cert, key)
    request = urllib.request.Request(f"{fleet.http.url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
