"""First boot with a claim, and renewal: the device trades its claim, later its certificate, for a certificate.

**First boot** (:func:`provision`, before the daemon starts; docs/provisioning.md). An agent.yaml with
``claim:`` and ``manager_url:`` and no identity yet makes its key and request (``agent/identity.py``) and
sends ``POST <manager_url>/api/v1/provision`` with the claim, the request and the hardware's name:

- 200 ``approved``: the certificate, CA, broker, manager URL, update key and groups are written atomically
  to ``<data_dir>/identity/`` and the agent starts with them in place of agent.yaml's identity keys;
- 202 ``pending``: asked again with the same request after ``Retry-After`` (an operator approves it;
  a restarted agent resumes the same way: the key and the request are on disk);
- 400, 401, 403, 409: :class:`~edgeinfer.errors.ProvisioningRefused` — the claim or the request is
  refused for good, said once, not asked again (a device must not hammer the manager);
- 429, 5xx, no answer: asked again on the backoff (``util/backoff.py``, equal jitter: a fleet flashed from
  one image must not ask in lockstep), ``Retry-After`` honoured.

**Renewal** (:class:`CertificateRenewer`, a thread of the daemon): at two thirds of the certificate's life
the agent sends a request for the same key to ``POST /api/v1/provision/renew``, authenticated by the
certificate it has (still valid: a third of its life is left to retry in); the new certificate replaces the
old file atomically and the MQTT link presents it from its next connection on — the connection open now is
not dropped, so there is no gap. The key is kept: it never left the device; a key that did is revoked.

**The clock.** A device whose clock is far off (no RTC, no NTP yet) would see its certificate as not yet or
no longer valid, or refuse the manager's. Every answer's ``Date`` is compared with the device's clock: more
than :data:`CLOCK_SKEW_S` apart is logged (first boot) or reported as an ``error`` event (renewal), naming
both times — never a silent failure.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ProvisioningRefused
from ..link.vocabulary import EventKind
from ..util.backoff import EQUAL_JITTER, Backoff
from .identity import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    certificate_life,
    certificate_request,
    identity_dir,
    renewal_time,
    write_identity,
)

log = logging.getLogger(__name__)

PROVISION_PATH = "/api/v1/provision"
RENEW_PATH = "/api/v1/provision/renew"
#: answers a retry does not change
REFUSED = (400, 401, 403, 409)
#: a device clock this far from the manager's is reported
CLOCK_SKEW_S = 300.0
#: how long a device waits between two requests while it may not go on (pending, limited, unreachable)
RETRY = Backoff(initial_s=2.0, max_s=300.0, jitter=EQUAL_JITTER)
MIN_WAIT_S = 1.0
#: the longest ``Retry-After`` a device obeys
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True)
class Answer:
    """One answer of the manager: its status, JSON body, ``Retry-After`` and ``Date`` (seconds since the epoch)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    retry_after_s: float | None = None
    date: float | None = None

    def detail(self) -> str:
        return str(self.body.get("error") or self.body.get("detail") or self.body.get("status") or "")[:300]

    def skew_s(self, now: float | None = None) -> float | None:
        """The manager's clock minus the device's (None without a Date header)."""
        return None if self.date is None else self.date - (time.time() if now is None else now)


def _answer(status: int, headers: Any, payload: bytes) -> Answer:
    try:
        body = json.loads(payload or b"{}")
    except ValueError:
        body = {}
    retry = headers.get("Retry-After") if headers is not None else None
    date = headers.get("Date") if headers is not None else None
    parsed = email.utils.parsedate_to_datetime(date) if date else None
    return Answer(status, body if isinstance(body, dict) else {},
                  float(retry) if retry and str(retry).strip().isdigit() else None,
                  parsed.timestamp() if parsed is not None else None)


class ManagerHTTP:
    """The device's requests to the fleet manager's provisioning routes (urllib; ``cafile`` verifies an https
    manager, ``cert``/``key`` present the device's certificate)."""

    def __init__(self, manager_url: str, *, cafile: str | None = None, cert: str | None = None,
                 key: str | None = None, timeout_s: float = 30.0) -> None:
        import urllib.request

        self.manager_url = manager_url.rstrip("/")
        self.timeout_s = timeout_s
        self._opener = None  # None: urllib's own (an http:// manager)
        if manager_url.startswith("https://"):
            import ssl

            context = ssl.create_default_context(cafile=cafile)
            if cert and key:
                context.load_cert_chain(cert, key)
            # the opener urlopen(context=...) would build for every request (its ten handlers, the proxies read
            # from the environment), built once: each request still opens its own connection and handshake
            self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    def post(self, path: str, body: dict[str, Any]) -> Answer:
        """POST ``body`` as JSON; the answer, whatever its status. OSError when no answer came."""
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.manager_url}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            opened = (self._opener.open(request, timeout=self.timeout_s) if self._opener is not None
                      else urllib.request.urlopen(request, timeout=self.timeout_s))
            with opened as reply:
                return _answer(reply.status, reply.headers, reply.read())
        except urllib.error.HTTPError as exc:
            return _answer(exc.code, exc.headers, exc.read())
        except http.client.HTTPException as exc:
            raise OSError(f"{path}: {exc}") from None


def _wait_s(answer: Answer | None, attempt: int, backoff: Backoff) -> float:
    """How long to wait before the next request: the manager's ``Retry-After`` (a pending device's
    ``retry_after_s``) within [MIN_WAIT_S, MAX_RETRY_AFTER_S], else the backoff's delay."""
    asked = answer.retry_after_s if answer is not None else None
    if asked is None and answer is not None and isinstance(answer.body.get("retry_after_s"), (int, float)):
        asked = float(answer.body["retry_after_s"])
    return backoff.delay(attempt) if asked is None else min(max(asked, MIN_WAIT_S), MAX_RETRY_AFTER_S)


def clock_problem(answer: Answer, now: float | None = None) -> str | None:
    """Words for a device clock more than CLOCK_SKEW_S from the manager's, else None."""
    skew = answer.skew_s(now)
    if skew is None or abs(skew) <= CLOCK_SKEW_S:
        return None
    here = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.timezone.utc).isoformat(timespec="seconds")
    there = dt.datetime.fromtimestamp(answer.date or 0, dt.timezone.utc).isoformat(timespec="seconds")
    return (f"the device's clock says {here}, the fleet manager's {there} ({skew:+.0f} s): certificates are judged "
            "by the clock — set it (NTP, an RTC)")


def provision(manager_url: str, claim: str, folder: Path, hardware: dict[str, Any], *, cafile: str | None = None,
              stop: threading.Event | None = None, backoff: Backoff = RETRY,
              http: ManagerHTTP | None = None) -> dict[str, Any] | None:
    """Trade ``claim`` for a certificate (see the module docstring); the identity's agent.yaml keys, or None when
    ``stop`` was set while waiting. ProvisioningRefused for a refusal that a retry does not change."""
    http = http or ManagerHTTP(manager_url, cafile=cafile)
    body = {"claim": claim, "csr": certificate_request(folder), "hardware": hardware}
    stop = stop or threading.Event()
    failures, said_pending = 0, False
    while True:
        answer: Answer | None = None
        try:
            answer = http.post(PROVISION_PATH, body)
        except OSError as exc:
            log.warning("provisioning: no answer from %s (%s); asking again", manager_url, exc)
            failures += 1
        if answer is not None:
            problem = clock_problem(answer)
            if problem:
                log.error("provisioning: %s", problem)
            if answer.status == 200 and answer.body.get("status") == "approved":
                keys = write_identity(folder, answer.body)
                log.info("provisioned as %s (broker %s)", keys["device_id"], keys["broker"])
                return keys
            if answer.status in REFUSED:
                raise ProvisioningRefused(answer.status, f"{manager_url}{PROVISION_PATH} refused this device: "
                                                         f"{answer.detail() or 'no reason given'}")
            if answer.status == 202:
                failures = 0
                if not said_pending:
                    log.warning("provisioning: %s is pending approval as %s; asking again until it is approved",
                                hardware.get("serial"), answer.body.get("device_id"))
                    said_pending = True
            else:  # 429, 5xx, anything else: the manager may say yes later
                log.warning("provisioning: HTTP %s from %s: %s", answer.status, manager_url, answer.detail())
                failures += 1
        if stop.wait(_wait_s(answer, max(failures - 1, 0), backoff)):
            return None


def renew(folder: Path, manager_url: str, *, http: ManagerHTTP | None = None) -> tuple[dict[str, Any], Answer]:
    """Ask for a new certificate for the device's key, authenticated by the current one; the identity's keys and
    the answer. ProvisioningRefused when refused for good, OSError when it may work later."""
    http = http or ManagerHTTP(manager_url, cafile=str(folder / CA_FILE), cert=str(folder / CERT_FILE),
                               key=str(folder / KEY_FILE))
    answer = http.post(RENEW_PATH, {"csr": certificate_request(folder)})
    if answer.status == 200 and answer.body.get("certificate"):
        return write_identity(folder, answer.body), answer
    if answer.status in REFUSED:
        raise ProvisioningRefused(answer.status, f"renewal refused: {answer.detail() or 'no reason given'}")
    raise OSError(f"renewal: HTTP {answer.status}: {answer.detail()}")


class CertificateRenewer:
    """Renews the device's certificate at two thirds of its life, on its own thread; ``report(message)`` says
    what goes wrong (the daemon: an ``error`` event), ``renewed()`` is called after a renewal (the daemon: the
    MQTT link presents the new certificate from its next connection)."""

    def __init__(self, folder: Path, manager_url: str, *, report: Callable[[str], None],
                 renewed: Callable[[], None] = lambda: None, backoff: Backoff = RETRY,
                 clock: Callable[[], float] = time.time) -> None:
        self.folder = folder
        self.manager_url = manager_url
        self.report = report
        self.renewed = renewed
        self.backoff = backoff
        self.clock = clock
        self.renewals = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CertificateRenewer:
        self._thread = threading.Thread(target=self._run, name="edgeinfer-cert-renewal", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def due_in_s(self) -> float:
        """Seconds until the certificate is due for renewal (<= 0: now); reports a clock outside its life."""
        not_before, not_after = certificate_life(self.folder / CERT_FILE)
        now = self.clock()
        if not not_before.timestamp() <= now <= not_after.timestamp():
            here = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds")
            self.report(f"the device's clock says {here}, outside its certificate's life ({not_before.isoformat()} "
                        f"to {not_after.isoformat()}): the broker and the manager judge by their own clocks — set "
                        "the device's clock (NTP, an RTC)")
        return renewal_time(not_before, not_after).timestamp() - now

    def renew_now(self) -> bool:
        """One renewal; whether it worked (what went wrong is reported)."""
        try:
            keys, answer = renew(self.folder, self.manager_url)
        except ProvisioningRefused as exc:
            self.report(f"certificate renewal refused: {exc}")
            return False
        except OSError as exc:
            self.report(f"certificate renewal failed, trying again: {exc}")
            return False
        problem = clock_problem(answer, self.clock())
        if problem:
            self.report(problem)
        self.renewals += 1
        log.info("certificate of %s renewed (valid to %s)", keys.get("device_id"), answer.body.get("not_after"))
        self.renewed()
        return True

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                wait = self.due_in_s()
            except (OSError, ValueError) as exc:
                self.report(f"cannot read the device certificate: {exc}")
                return
            if wait > 0:
                if self._stop.wait(min(wait, 3600.0)):  # looked at again hourly: a clock set meanwhile counts
                    return
                continue
            if self.renew_now():
                failures = 0
                continue
            failures += 1
            if self._stop.wait(self.backoff.delay(failures - 1)):
                return


def link_tls(config: Any) -> Any:
    """The MQTT link's TLS context (None for a plain broker): the daemon keeps it, so that a renewed certificate
    is loaded into it."""
    from ..link.settings import parse_broker_url, tls_context

    mqtt = config.mqtt
    return tls_context(mqtt.ca, mqtt.cert, mqtt.key) if parse_broker_url(mqtt.url).tls else None


def start_renewer(config: Any, tls: Any, emit: Callable[..., Any]) -> CertificateRenewer | None:
    """The renewer of a provisioned device (its certificate in ``<data_dir>/identity/``), started: what goes wrong
    is an ``error`` event, a renewal loads the new certificate into the link's ``tls`` context (its next
    connection presents it; the open one is kept). None for any other device."""
    folder = identity_dir(config.data_dir)
    cert, key = config.mqtt.cert, config.mqtt.key
    if not (config.claim and config.manager_url and cert and tls is not None) or Path(cert) != folder / CERT_FILE:
        return None
    def report(message: str) -> None:
        emit(EventKind.ERROR, "error", message)

    return CertificateRenewer(folder, config.manager_url, report=report,
                              renewed=lambda: tls.load_cert_chain(cert, key)).start()
