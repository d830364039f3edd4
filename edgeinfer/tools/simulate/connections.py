"""How a simulated device connects (:class:`~edgeinfer.tools.simulate.Simulation`'s part that opens, watches and
reopens its clients' connections): a paho client per device on the simulation's one selector, its account or its
certificate (TLS: the agent's own context, ``link/settings.py``), a lost connection retried on the backoff. A TLS
device's first connection is made on a small pool of threads (its handshake waits on the broker, and paho makes it
blocking); one that fails comes back to the network thread through ``_failed``."""

from __future__ import annotations

import logging
import selectors
from typing import Any

from ...errors import ConfigError
from .device import SimDevice

log = logging.getLogger(__name__)


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

    def _new_client(self, device: SimDevice) -> Any:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"{device.fleet}-{device.device_id}",
                             protocol=paho.MQTTv5, userdata=device, reconnect_on_failure=False)
        if self.settings.credentials:
            username, password = self.settings.credentials[device.device_id][:2]
            client.username_pw_set(username, password)
        if self.settings.identities:  # the device's own certificate, as the agent presents it (link/settings.py)
            from ...link.settings import tls_context

            identity = self.settings.identities[device.device_id]
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
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        if device.client is None and self._connector is not None:
            self._connector.submit(self._first_connect, device)
            return
        try:
            if device.client is None:
                device.client = self._new_client(device)
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = 24 * 3600
                device.client.connect(self.broker.host, self.broker.port, keepalive=30, clean_start=False,
                                      properties=props)
            else:
                device.client.reconnect()
        except ConfigError as exc:  # its certificate, key or CA unreadable: asking again changes nothing
            log.warning("%s: cannot connect: %s", device.device_id, exc)
        except (OSError, ValueError) as exc:
            log.debug("%s: connect failed: %s", device.device_id, exc)
            self._retry(device)

    def _first_connect(self, device: SimDevice) -> None:
        """A TLS device's first connection, on the connector pool (paho's clients take a connect from any thread; its
        socket joins the selector from here, and the network thread reads it from then on)."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        if self._stop.is_set():
            return
        try:
            client = self._new_client(device)
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 24 * 3600
            device.client = client
            client.connect(self.broker.host, self.broker.port, keepalive=30, clean_start=False, properties=props)
        except ConfigError as exc:
            log.warning("%s: cannot connect: %s", device.device_id, exc)
        except (OSError, ValueError) as exc:
            log.debug("%s: connect failed: %s", device.device_id, exc)
            self._failed.put(device)

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
