"""How a simulated device connects (:class:`~edgeinfer.tools.simulate.Simulation`'s part that opens, watches and
reopens its clients' connections): a paho client per device on the simulation's one selector, its account or its
certificate (TLS: the agent's own context, ``link/settings.py``), a lost connection retried on the backoff. A TLS
device's first connection is made on a small pool of threads (its handshake waits on the broker, and paho makes it
blocking); one that fails comes back to the network thread through ``_failed``."""

from __future__ import annotations

import functools
import logging
import selectors
import threading
import time
from typing import Any

from ...errors import ConfigError
from .device import SimDevice

log = logging.getLogger(__name__)
#: session expiry a device asks for (a day: its subscription and queued commands outlive a broker restart)
SESSION_EXPIRY_S = 24 * 3600


@functools.cache
def _client_class() -> type:
    """paho's client, with its proxy looked up once per broker: paho reads the environment's proxies (every variable
    of it, twice) on each connect — the same answer for every device of one process, and ~0.3 ms each."""
    import paho.mqtt.client as paho

    proxies: dict[tuple[str, int], Any] = {}
    lock = threading.Lock()

    class Client(paho.Client):
        def _get_proxy(self) -> Any:  # paho's own lookup, once per (host, port)
            where = (self._host, self._port)
            with lock:
                if where not in proxies:
                    proxies[where] = super()._get_proxy()
                return proxies[where]

    return Client


@functools.cache
def _connect_properties() -> Any:
    """The CONNECT's MQTT 5 properties, one object for every device (paho only reads it)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = SESSION_EXPIRY_S
    return props


class DeviceConnections:
    """The connection half of :class:`~edgeinfer.tools.simulate.Simulation` (a mixin: it uses the simulation's
    settings, selector, timers, backoff and callbacks)."""

    settings: Any
    broker: Any
    _selector: Any
    _stop: Any
    _connector: Any
    _failed: Any
    _backoff: Any
    _rng: Any
    _lock: Any
    identities: Any
    connect_cpu_s: float

    def _new_client(self, device: SimDevice) -> Any:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        client = _client_class()(CallbackAPIVersion.VERSION2, client_id=f"{device.fleet}-{device.device_id}",
                                 protocol=paho.MQTTv5, userdata=device, reconnect_on_failure=False)
        if self.settings.credentials:
            username, password = self.settings.credentials[device.device_id][:2]
            client.username_pw_set(username, password)
        if device.device_id in self.identities:  # its own certificate, as the agent presents it (link/settings.py)
            from ...link.settings import tls_context

            identity = self.identities[device.device_id]
            client.tls_set_context(tls_context(identity.get("ca"), identity.get("cert"), identity.get("key")))
        client.max_inflight_messages_set(50)
        client.max_queued_messages_set(0)
        client.will_set(device.topics.state, device.state(online=False), qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_socket_open = lambda c, d, sock: self._selector.register(sock, selectors.EVENT_READ, d)
        client.on_socket_close = lambda c, d, sock: self._unregister(sock)
        client.on_socket_register_write = lambda c, d, sock: self._watch(sock, d, write=True)
        client.on_socket_unregister_write = lambda c, d, sock: self._watch(sock, d, write=False)
        return client

    def _unregister(self, sock: Any) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _watch(self, sock: Any, device: SimDevice, *, write: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        try:
            self._selector.modify(sock, events, device)
        except (KeyError, ValueError):
            pass

    def _connect(self, device: SimDevice) -> None:
        if self._stop.is_set():
            return
        if device.client is None and self._connector is not None:
            self._connector.submit(self._first_connect, device)
            return
        try:
            if device.client is None:
                device.client = self._new_client(device)
                device.client.connect(self.broker.host, self.broker.port, keepalive=30, clean_start=False,
                                      properties=_connect_properties())
            else:
                device.client.reconnect()
        except ConfigError as exc:  # its certificate, key or CA unreadable: asking again changes nothing
            log.warning("%s: cannot connect: %s", device.device_id, exc)
        except (OSError, ValueError) as exc:
            log.debug("%s: connect failed: %s", device.device_id, exc)
            self._retry(device)

    def _first_connect(self, device: SimDevice) -> None:
        """A TLS device's first connection, on the connector pool or the thread that provisioned it (paho's clients
        take a connect from any thread; its socket joins the selector from here, and the network thread reads it from
        then on). Its CPU time is counted in ``connect_cpu_s``."""
        if self._stop.is_set():
            return
        began = time.thread_time()
        try:
            client = self._new_client(device)
            device.client = client
            client.connect(self.broker.host, self.broker.port, keepalive=30, clean_start=False,
                           properties=_connect_properties())
        except ConfigError as exc:
            log.warning("%s: cannot connect: %s", device.device_id, exc)
        except (OSError, ValueError) as exc:
            log.debug("%s: connect failed: %s", device.device_id, exc)
            self._failed.put(device)
        finally:
            spent = time.thread_time() - began
            with self._lock:
                self.connect_cpu_s += spent

    def _retry(self, device: SimDevice) -> None:
        device.reconnect_attempt += 1
        self._later(self._backoff.delay(device.reconnect_attempt, self._rng), lambda: self._connect(device))

    def _lost(self, device: SimDevice) -> None:
        if device.connected:
            device.connected = False
            device.reconnect_attempt = 0
        sock = device.client.socket() if device.client is not None else None
        if sock is not None:
            self._unregister(sock)
        self._retry(device)
