"""The broker ``fleet serve`` runs when no ``--broker`` is given: a real Mosquitto, supervised.

:class:`ManagedMosquitto` writes Mosquitto's config into ``<data_dir>/mosquitto/`` (regenerated on
every start), starts ``mosquitto -c`` there, checks that its persistence really lands on disk, and
restarts it (same port, same persistence file) if it dies. MQTT 5 and 3.1.1 both work.

Why these settings:

- ``user <whoever runs edgeinfer>``: started as root, Mosquitto switches to the ``mosquitto`` user
  by default, which then cannot write the persistence file into a root-owned data dir — and says
  so only in its log. Running as the caller keeps the files writable; the probe write and the
  save-and-check at start prove it.
- ``max_queued_messages``: Mosquitto's default queue of 1000 messages per client silently drops QoS 1
  messages for a subscriber that falls behind — exactly the fleet manager's session when ingest
  pushes back. The limit is raised so back-pressure waits in the broker instead of losing data.
- persistence with ``autosave_interval``: sessions and queued messages survive a broker crash up to
  the last save; :meth:`ManagedMosquitto.save` (SIGUSR1) writes one now (the manager calls it once
  its subscriptions exist, so its session survives even an early crash).
- no anonymous clients: ``auth`` (see :mod:`.broker_auth`) gives ``password_file`` and ``acl_file``
  and turns on ``use_username_as_clientid`` (a device cannot take another's client id and kick it off;
  a session is named after the username, so a device's username should be its agent's client id,
  :func:`.broker_auth.device_username`, for the session to keep its name); without ``auth``,
  :meth:`ManagedMosquitto.start` refuses unless ``allow_anonymous=True`` says so explicitly.
  :meth:`ManagedMosquitto.reload` (SIGHUP) makes Mosquitto re-read those files (and the TLS
  certificate) after an enroll or revoke; a restart after a crash reads the same, current, files.
- ``tls``: the one listener serves TLS 1.2 or newer (``mqtts://``) with a certificate from the
  fleet's CA; there is no plain port next to it, so passwords never cross the network in clear.
- ``certificates`` (:class:`CertificateListener`, with ``tls``): a second listener where a device is
  its client certificate — ``require_certificate``, ``use_identity_as_username`` (the CN is the user
  name and, by ``use_username_as_clientid``, the client id), the pattern ACL of
  :func:`.broker_auth.certificate_acl_text` and a ``crlfile``. ``per_listener_settings`` keeps each
  listener's accounts and ACL its own: the password accounts' ACL does not apply to certificates, nor
  the patterns to password accounts. Mosquitto 2.0.11 re-reads the CRL on SIGHUP (:meth:`reload`) and
  then refuses a revoked certificate's handshake, but checks no connection already open: the fleet
  manager closes a revoked device's session itself (``fleet/device_certs.py``, ``kick``).
- with ``tls``, no TLS 1.3 session tickets: Mosquitto runs with ``OPENSSL_CONF`` naming
  ``<data_dir>/mosquitto/openssl.cnf`` (:data:`OPENSSL_CONFIG`; the same file for any fleet size) with
  ``NumTickets = 0``. OpenSSL 3.0 builds each of the two tickets it sends after a handshake by encoding
  the session, decoding it again and re-encoding it — with the client's certificate in it, whose public key
  3.0's decoder re-reads each time: a fifth of the broker's CPU per connecting device, measured. A ticket
  only serves a client that resumes its session, which neither paho nor the agent does: every connection
  is a full handshake, its certificate checked against the CRL. That file replaces the system's OpenSSL
  configuration for Mosquitto, so it also says the system's usual floor (TLS 1.2, security level 2).
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..util.backoff import Backoff
from .broker_auth import AuthFiles, TLSFiles

#: the managed broker's certificate listener, when there is one
CERTIFICATE_PORT_OFFSET = 1

log = logging.getLogger(__name__)

#: a run that lasted this long resets the restart backoff
STABLE_RUN_S = 30.0

#: Mosquitto's OpenSSL configuration with TLS (``OPENSSL_CONF``): no session tickets (see the module's docstring)
OPENSSL_CONFIG = """\
# Written by edgeinfer (fleet serve) at every start: Mosquitto's OpenSSL settings (its OPENSSL_CONF).
openssl_conf = edgeinfer_openssl

[edgeinfer_openssl]
ssl_conf = edgeinfer_ssl

[edgeinfer_ssl]
system_default = edgeinfer_tls

[edgeinfer_tls]
MinProtocol = TLSv1.2
CipherString = DEFAULT:@SECLEVEL=2
NumTickets = 0
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


#: where Debian puts it (/usr/sbin is not on every user's PATH)
FALLBACK_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def find_mosquitto() -> str:
    found = shutil.which("mosquitto") or next((p for p in FALLBACK_PATHS if os.access(p, os.X_OK)), None)
    if found is None:
        raise ConfigError("the fleet manager runs Mosquitto as its broker, and it is not installed: "
                          "apt-get install mosquitto — or pass --broker mqtt://HOST:PORT for a broker you run")
    return found


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class CertificateListener:
    """The listener where devices connect by client certificate: its port, pattern ACL and CRL."""

    port: int
    acl_file: Path
    crl_file: Path


class ManagedMosquitto:
    """One Mosquitto process for the fleet manager: config, persistence, supervision."""

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", port: int = 1883, executable: str | None = None,
                 max_queued_messages: int = 1_000_000, extra_config: Sequence[str] = (),
                 auth: AuthFiles | None = None, tls: TLSFiles | None = None, allow_anonymous: bool = False,
                 certificates: CertificateListener | None = None) -> None:
        if certificates is not None and tls is None:
            raise ConfigError("a certificate listener needs TLS (tls=TLSFiles)")
        self.folder = Path(data_dir) / "mosquitto"
        self.auth = auth
        self.tls = tls
        self.certificates = certificates
        self.allow_anonymous = allow_anonymous
        self.host = host
        self.port = port or free_port(host)
        self.executable = executable
        self.max_queued_messages = max_queued_messages
        self.extra_config = tuple(extra_config)
        self.config_file = self.folder / "mosquitto.conf"
        self.persistence_file = self.folder / "mosquitto.db"
        self.log_file = self.folder / "mosquitto.log"
        self.openssl_config_file = self.folder / "openssl.cnf"
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    @property
    def certificate_url(self) -> str | None:
        """Where devices connect by client certificate (None: no such listener)."""
        return f"mqtts://{self.host}:{self.certificates.port}" if self.certificates else None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def config_text(self) -> str:
        lines = [
            "# Written by edgeinfer (fleet serve) at every start: edit the fleet manager's options, not this file.",
            f"user {getpass.getuser()}",
            *(["per_listener_settings true"] if self.certificates else []),
            f"listener {self.port} {self.host}",
            "protocol mqtt",
            *self._tls_lines(),
            *self._auth_lines(),
            *self._certificate_lines(),
            "persistence true",
            f"persistence_location {self.folder}/",
            f"persistence_file {self.persistence_file.name}",
            "autosave_interval 60",
            "persistent_client_expiration 14d",
            f"max_queued_messages {self.max_queued_messages}",
            "set_tcp_nodelay true",
            f"log_dest file {self.log_file}",
            "log_type error", "log_type warning", "log_type notice", "log_type information",
            "connection_messages true",
            *self.extra_config,
        ]
        return "\n".join(lines) + "\n"

    def _tls_lines(self) -> list[str]:
        if self.tls is None:
            return []
        return [f"cafile {self.tls.cafile}", f"certfile {self.tls.certfile}", f"keyfile {self.tls.keyfile}",
                "tls_version tlsv1.2"]  # the minimum (Mosquitto 2): 1.3 is served too

    def _certificate_lines(self) -> list[str]:
        if self.certificates is None:
            return []
        c = self.certificates
        return [f"listener {c.port} {self.host}", "protocol mqtt", *self._tls_lines(), "require_certificate true",
                "use_identity_as_username true", "use_username_as_clientid true", f"crlfile {c.crl_file}",
                "allow_anonymous false", f"acl_file {c.acl_file}"]

    def _auth_lines(self) -> list[str]:
        lines = [f"allow_anonymous {'true' if self.allow_anonymous else 'false'}"]
        if self.auth is not None:
            lines += [f"password_file {self.auth.password_file}", f"acl_file {self.auth.acl_file}"]
            if not self.allow_anonymous:  # it would disconnect every anonymous client anyway
                lines.append("use_username_as_clientid true")
        return lines

    def _check_files(self) -> None:
        if self.auth is None and not self.allow_anonymous:
            raise ConfigError("the managed Mosquitto needs accounts (auth=AuthFiles) — or allow_anonymous=True "
                              "for an open broker")
        paths = [*(vars(self.auth).values() if self.auth else ()), *(vars(self.tls).values() if self.tls else ()),
                 *((self.certificates.acl_file, self.certificates.crl_file) if self.certificates else ())]
        for path in paths:
            if not os.access(path, os.R_OK):
                raise ConfigError(f"Mosquitto (running as {getpass.getuser()}) cannot read {path}")

    # ------------------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 10.0) -> ManagedMosquitto:
        """Start Mosquitto and its supervisor; returns once the port accepts connections and a save landed."""
        self._check_files()
        executable = self.executable or find_mosquitto()
        self._prepare_folder()
        self.config_file.write_text(self.config_text())
        if self.tls is not None:
            self.openssl_config_file.write_text(OPENSSL_CONFIG)
        self._launch(executable, timeout)
        try:
            self.save(timeout)
        except ConfigError:
            self.close()
            raise
        self._supervisor = threading.Thread(target=self._supervise, args=(executable,),
                                            name="edgeinfer-mosquitto-supervisor", daemon=True)
        self._supervisor.start()
        log.info("Mosquitto on %s (pid %s), persistence in %s", self.url, self.pid, self.folder)
        return self

    def _prepare_folder(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"Mosquitto's folder {self.folder} is not writable by {getpass.getuser()}: "
                              f"{exc.strerror or exc}") from None

    def _launch(self, executable: str, timeout: float) -> None:
        for port in (self.port, *((self.certificates.port,) if self.certificates else ())):
            if _port_open(self.host, port):
                raise ConfigError(f"Mosquitto could not start on {self.host}:{port}: something else listens there "
                                  "(Address already in use) — choose another --broker-port, or pass --broker for it")
        with open(self.log_file, "ab") as out:
            logged = out.tell()  # what this run logs starts here (the log is kept across restarts)
            env = {**os.environ, "OPENSSL_CONF": str(self.openssl_config_file)} if self.tls is not None else None
            proc = subprocess.Popen([executable, "-c", str(self.config_file)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        with self._lock:
            self._proc = proc
        deadline = time.monotonic() + timeout
        # Mosquitto opens its listeners before it installs its signal handlers, and says "running" after: a
        # SIGUSR1 (save) or SIGHUP (reload) in between would end it (their default action), which a loaded
        # machine made happen — so the broker is started once it has said so, not once its port answers
        last_port = self.certificates.port if self.certificates else self.port
        while not (_port_open(self.host, last_port) and self._logged_running(logged)):
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                raise ConfigError(f"Mosquitto could not start on {self.host}:{self.port} (exit code {proc.returncode})"
                                  f": {self._log_tail()}")
            time.sleep(0.02)

    def _logged_running(self, offset: int) -> bool:
        """Whether Mosquitto's log, from ``offset`` on, has its "mosquitto version X running" line."""
        try:
            with open(self.log_file, "rb") as log_file:
                log_file.seek(offset)
                return re.search(rb"mosquitto version \S+ running", log_file.read()) is not None
        except OSError:
            return False

    def save(self, timeout: float = 5.0) -> None:
        """Make Mosquitto write its persistence file now (SIGUSR1) and wait until it has."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ConfigError("Mosquitto is not running")
        before = self.persistence_file.stat().st_mtime_ns if self.persistence_file.exists() else None
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.persistence_file.exists() and self.persistence_file.stat().st_mtime_ns != before:
                return
            time.sleep(0.02)
        raise ConfigError(f"Mosquitto is not writing its persistence file {self.persistence_file}: "
                          f"{self._log_tail()}")

    def reload(self, timeout: float = 5.0) -> None:
        """Make Mosquitto re-read its password, ACL, certificate and CRL files (SIGHUP) and wait until it has.

        Mosquitto logs "Reloading config." as it starts reloading, within one turn of its main loop;
        the save asked for after that line runs in a later turn, so once it lands the reload is done.
        """
        self._check_files()
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ConfigError(f"Mosquitto is not running: {self._log_tail()}")
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while "Reloading config." not in self._log_since(offset):
            if proc.poll() is not None:
                raise ConfigError(f"Mosquitto died reloading its config: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise ConfigError(f"Mosquitto did not reload its config within {timeout} s: {self._log_tail()}")
            time.sleep(0.02)
        self.save(max(deadline - time.monotonic(), 1.0))
        errors = [line for line in self._log_since(offset).splitlines() if ": Error: " in line]
        if errors:
            raise ConfigError(f"Mosquitto reloaded with errors: {' | '.join(errors[-3:])}")

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _supervise(self, executable: str) -> None:
        backoff = Backoff(initial_s=0.2, max_s=10.0)
        failures = 0
        started = time.monotonic()
        while not self._stop.is_set():
            proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            if self._stop.is_set():
                return
            failures = 0 if time.monotonic() - started > STABLE_RUN_S else failures + 1
            delay = backoff.delay(failures) if failures else 0.0
            log.warning("Mosquitto (pid %s) exited with %s; restarting it in %.1f s: %s", proc.pid, code, delay,
                        self._log_tail(1))
            if self._stop.wait(delay):
                return
            try:
                self._launch(executable, timeout=10.0)
            except ConfigError as exc:
                log.error("%s", exc)
                continue
            self.restarts += 1
            started = time.monotonic()

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def close(self, timeout: float = 10.0) -> None:
        """Stop supervising, then stop Mosquitto (SIGTERM: it saves its persistence on the way out)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._supervisor is not None:
            self._supervisor.join(timeout)

    def __enter__(self) -> ManagedMosquitto:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
