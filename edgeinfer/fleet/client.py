"""A small HTTP client for the fleet manager's API (what the CLI uses).

It sends ``Authorization: Bearer <token>``: the token given, else read from ``--token-file`` /
``$EDGEINFER_FLEET_TOKEN_FILE``, else ``$EDGEINFER_FLEET_TOKEN``. For an https manager whose
certificate comes from the fleet's own CA, pass that CA (``--ca`` / ``$EDGEINFER_FLEET_CA``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import AuthError, DownloadError, EdgeInferError, FleetRequestError
from .rollout import DeploymentStatus

if TYPE_CHECKING:
    from .api.schemas import DeploymentSpec

DEFAULT_FLEET_URL = "http://127.0.0.1:8700"
FLEET_URL_ENV = "EDGEINFER_FLEET_URL"
FLEET_CA_ENV = "EDGEINFER_FLEET_CA"
TOKEN_ENV = "EDGEINFER_FLEET_TOKEN"
TOKEN_FILE_ENV = "EDGEINFER_FLEET_TOKEN_FILE"


class FleetClient:
    """Talks to ``edgeinfer fleet serve`` over HTTP(S)."""

    def __init__(self, url: str | None = None, timeout: float = 30.0, *, token: str | None = None,
                 token_file: str | os.PathLike | None = None, ca: str | os.PathLike | None = None) -> None:
        self.url = (url or os.environ.get(FLEET_URL_ENV) or DEFAULT_FLEET_URL).rstrip("/")
        self.timeout = timeout
        self.token = read_token(token, token_file)
        ca = ca or os.environ.get(FLEET_CA_ENV)
        self._context = ssl.create_default_context(cafile=str(ca)) if ca else None

    def _request(self, method: str, path: str, body: Any = None,
                 headers: dict[str, str] | None = None, *, raw: bool = False, into: BinaryIO | None = None) -> Any:
        """The answer's JSON (``raw``: its bytes; ``into``: streamed into that file, answering (size, sha256));
        None for a GET answered 404."""
        headers = dict(headers or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                if into is not None:
                    return _copy(response, into)
                data = response.read()
                return data if raw else json.loads(data or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                message = exc.reason
            if exc.code == 404 and method == "GET":
                return None
            hint = ""
            if exc.code == 401 and not self.token:
                hint = " — give a token: --token-file FILE or $EDGEINFER_FLEET_TOKEN"
            raise FleetRequestError(exc.code, f"fleet manager refused {method} {path} ({exc.code}): {message}"
                                    + hint) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EdgeInferError(f"cannot reach the fleet manager at {self.url} ({reason}) — is "
                                 "`edgeinfer fleet serve` running? (--fleet-url / $EDGEINFER_FLEET_URL)") from None

    def _post(self, path: str, body: dict | None = None, method: str = "POST") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        return self._request(method, path, data, {"Content-Type": "application/json"} if data else None)

    def whoami(self) -> dict:
        return self._request("GET", "/api/whoami")

    def devices(self) -> list[dict]:
        return self._request("GET", "/api/devices")

    def deployments(self) -> list[dict]:
        return self._request("GET", "/api/deployments")

    def deployment(self, deployment_id: str) -> dict | None:
        return self._request("GET", f"/api/deployments/{_quote(deployment_id)}")

    def upload(self, path: str | os.PathLike) -> dict:
        """PUT a model file, streamed from disk (never read whole into memory); returns {"sha256", "size"}.

        The token's role is checked first: a server refusing an upload closes the connection while the
        body is still being sent, and the client would only see the reset, not why.
        """
        size = Path(path).stat().st_size
        who = self.whoami()
        if who["role"] == "viewer":
            raise FleetRequestError(403, f"the token {who['name']!r} is a viewer; uploading a model needs operator")
        with open(path, "rb") as body:
            return self._request("PUT", "/api/artifacts", body, {"Content-Length": str(size),
                                                                  "Content-Type": "application/octet-stream"})

    def create_deployment(self, spec: DeploymentSpec) -> dict:
        """Start a rollout (operator); the deployment with its targets."""
        return self._post("/api/deployments", spec.model_dump(mode="json", exclude_none=True))

    def abort(self, deployment_id: str) -> dict:
        return self._post(f"/api/deployments/{_quote(deployment_id)}/abort")

    def rollback(self, device_id: str, pipeline: str | None = None) -> dict:
        return self._post(f"/api/devices/{_quote(device_id)}/rollback", {"pipeline": pipeline} if pipeline else {})

    def restart(self, device_id: str, pipeline: str) -> dict:
        return self._post(f"/api/devices/{_quote(device_id)}/restart", {"pipeline": pipeline})

    def sample(self, device_id: str, pipeline: str, frames: int, stream: str = "") -> dict:
        """Ask a device to keep the next ``frames`` frames of a pipeline as samples."""
        body = {"pipeline": pipeline, "frames": frames, **({"stream": stream} if stream else {})}
        return self._post(f"/api/devices/{_quote(device_id)}/sample", body)

    def command(self, command_id: str) -> dict | None:
        """A command's record: where it stands (sent, applied, refused, expired), the device's words, a sample command's
        outcome, the verdict in words (``text``); None when the manager knows no such command."""
        return self._request("GET", f"/api/commands/{_quote(command_id)}")

    def device_commands(self, device_id: str, **filters: Any) -> list[dict]:
        """A device's command records, newest first: filters cmd, pipeline, limit."""
        return self._request("GET", f"/api/devices/{_quote(device_id)}/commands?{_query(filters)}")

    def request_logs(self, device_id: str, follow: bool = False) -> dict:
        """Ask a device for its recent log lines (operator); where the request stands (``sent``, ``online``)."""
        return self._post(f"/api/devices/{_quote(device_id)}/logs/request", {"follow": follow})

    def logs(self, device_id: str, **query: Any) -> dict | None:
        """A device's stored lines and where its logs stand: since, after, level, limit, follow (None: no device)."""
        return self._request("GET", f"/api/devices/{_quote(device_id)}/logs?{_query(query)}")

    def request_doctor(self, device_id: str) -> dict:
        """Ask a device to run its doctor (operator); where the request stands."""
        return self._post(f"/api/devices/{_quote(device_id)}/doctor")

    def doctor(self, device_id: str) -> dict | None:
        """A device's last doctor request and report (None: no device)."""
        return self._request("GET", f"/api/devices/{_quote(device_id)}/doctor")

    # the configuration held by the fleet (docs/fleet.md, Configuration): a layer is (scope, name)
    def config_layer(self, scope: str, name: str) -> dict:
        """A layer at its newest revision (revision 0: never saved), its document masked."""
        return self._request("GET", f"/api/config/layers/{_quote(scope)}/{_quote(name)}")

    def save_config(self, scope: str, name: str, document: dict, *, revision: int, message: str = "",
                    apply: bool = True, rollout: dict | None = None) -> dict:
        """Save the layer's next revision on ``revision`` (409 when it is not the newest) and roll it out."""
        body = {"document": document, "revision": revision, "message": message, "apply": apply, "rollout": rollout}
        return self._post(f"/api/config/layers/{_quote(scope)}/{_quote(name)}", body, method="PUT")

    def config_history(self, scope: str, name: str, limit: int = 100) -> list[dict]:
        return self._request("GET", f"/api/config/layers/{_quote(scope)}/{_quote(name)}/history?limit={int(limit)}")

    def rollback_config(self, scope: str, name: str, to_revision: int, *, revision: int, message: str = "",
                        apply: bool = True, rollout: dict | None = None) -> dict:
        body = {"to_revision": to_revision, "revision": revision, "message": message, "apply": apply,
                "rollout": rollout}
        return self._post(f"/api/config/layers/{_quote(scope)}/{_quote(name)}/rollback", body)

    def apply_config(self, scope: str, name: str, rollout: dict | None = None) -> dict:
        return self._post(f"/api/config/layers/{_quote(scope)}/{_quote(name)}/apply", {"rollout": rollout})

    def config_devices(self, **filters: Any) -> dict:
        """Every device's configuration status (filters: fleet, group) and the counts."""
        return self._request("GET", f"/api/config/devices?{_query(filters)}")

    def device_config(self, device_id: str) -> dict | None:
        """A device's effective configuration (masked), each key's layer, desired vs applied vs refused."""
        return self._request("GET", f"/api/config/devices/{_quote(device_id)}")

    def tokens(self) -> list[dict]:
        return self._request("GET", "/api/tokens")

    def create_token(self, name: str, role: str, expires_s: float | None = None) -> dict:
        return self._post("/api/tokens", {"name": name, "role": role, "expires_s": expires_s})

    def revoke_token(self, token_id: str) -> dict:
        return self._post(f"/api/tokens/{_quote(token_id)}", method="DELETE")

    def enroll(self, device_id: str, fleet: str | None = None, *, certificate: bool = False) -> dict:
        body = {**({"fleet": fleet} if fleet else {}), **({"certificate": True} if certificate else {})}
        return self._post(f"/api/devices/{_quote(device_id)}/enroll", body)

    def enroll_many(self, device_ids: list[str], fleet: str | None = None, *, certificate: bool = False) -> list[dict]:
        return self._post("/api/enrollments", {"devices": list(device_ids), **({"fleet": fleet} if fleet else {}),
                                               **({"certificate": True} if certificate else {})})

    def revoke_device(self, device_id: str) -> dict:
        return self._post(f"/api/devices/{_quote(device_id)}/revoke")

    def enrollments(self) -> list[dict]:
        return self._request("GET", "/api/enrollments")

    def audit(self, limit: int = 100) -> list[dict]:
        return self._request("GET", f"/api/audit?limit={int(limit)}")

    def create_claim(self, spec: dict) -> dict:
        """A new claim (``ClaimSpec``'s keys): its row, its token (shown only now) and the image's agent.yaml keys."""
        return self._post("/api/claims", spec)

    def claims(self) -> list[dict]:
        return self._request("GET", "/api/claims")

    def revoke_claim(self, claim_id: str) -> dict:
        return self._post(f"/api/claims/{_quote(claim_id)}", method="DELETE")

    def provisioning(self, state: str | None = None) -> list[dict]:
        """Devices' provisioning requests (``state``: pending, approved, rejected; None: all)."""
        return self._request("GET", f"/api/provisioning?{_query({'state': state})}")

    def approve_device(self, device_id: str) -> dict:
        return self._post(f"/api/provisioning/{_quote(device_id)}/approve")

    def reject_device(self, device_id: str) -> dict:
        return self._post(f"/api/provisioning/{_quote(device_id)}/reject")

    def samples(self, **filters: Any) -> list[dict]:
        """Samples: filters device, pipeline, stream, model_version, rule, label, reviewed, limit."""
        return self._request("GET", f"/api/samples?{_query(filters)}")

    def export_samples(self, fmt: str, **filters: Any) -> bytes:
        """The samples as a ``fmt`` dataset (coco, yolo, label-studio): the zip's bytes."""
        return self._request("GET", f"/api/samples/export?{_query({'format': fmt, **filters})}", raw=True)

    def save_export(self, fmt: str, dest: str | os.PathLike, **filters: Any) -> int:
        """The samples as a ``fmt`` dataset, its zip streamed into the file ``dest`` (an export of many frames is
        never held in memory); its size."""
        with open(dest, "wb") as out:
            size, _ = self._request("GET", f"/api/samples/export?{_query({'format': fmt, **filters})}", into=out)
        return size

    def has_artifact(self, sha256: str) -> bool:
        """Whether the manager's artifact store holds ``sha256`` (``HEAD /artifacts/<sha256>``)."""
        try:
            self._request("HEAD", f"/artifacts/{_quote(sha256)}", raw=True)
        except FleetRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def download_artifact(self, sha256: str, dest: str | os.PathLike) -> Path:
        """A stored model artifact into the file ``dest``, streamed; DownloadError when the manager has none of that
        sha256, or the bytes that came are not it (a file is never used unverified)."""
        with open(dest, "wb") as out:
            got = self._request("GET", f"/artifacts/{_quote(sha256)}", into=out)
        if got is None:
            raise DownloadError(f"the fleet manager at {self.url} has no artifact {sha256}")
        if got[1] != sha256:
            Path(dest).unlink(missing_ok=True)
            raise DownloadError(f"artifact {sha256} from {self.url} arrived as {got[1]} ({got[0]} bytes): not used")
        return Path(dest)

    def import_labels(self, fmt: str, body: bytes) -> dict:
        """Corrected labels back: a COCO annotations.json's bytes, or a zip of YOLO labels/ and data.yaml."""
        kind = "application/json" if fmt == "coco" else "application/zip"
        return self._request("POST", f"/api/samples/import?format={_quote(fmt)}", body, {"Content-Type": kind})


def _copy(response: Any, out: BinaryIO) -> tuple[int, str]:
    """Copy an answer into ``out`` in chunks; (size, sha256) of what came."""
    digest, size = hashlib.sha256(), 0
    while chunk := response.read(1 << 20):
        out.write(chunk)
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _query(values: dict[str, Any]) -> str:
    """A query string of the values given (None: left out; a bool as true/false)."""
    return urllib.parse.urlencode({key: str(value).lower() if isinstance(value, bool) else value
                                   for key, value in values.items() if value is not None})


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def read_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str | None:
    """The token to send: given, else from a file (given, or ``$EDGEINFER_FLEET_TOKEN_FILE``), else
    ``$EDGEINFER_FLEET_TOKEN``; None when there is none."""
    if token:
        return token.strip()
    token_file = token_file or os.environ.get(TOKEN_FILE_ENV)
    if token_file:
        try:
            return Path(token_file).read_text().strip() or None
        except OSError as exc:
            raise AuthError(401, f"cannot read the token file {token_file}: {exc.strerror or exc}") from None
    return (os.environ.get(TOKEN_ENV) or "").strip() or None


def parse_duration(text: str) -> float:
    """``90d``, ``12h``, ``30m``, ``45s`` or plain seconds → seconds; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match:
        raise ValueError(f"not a duration: {text!r} (e.g. 30d, 12h, 15m)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}[match.group(2)]
    seconds = float(match.group(1)) * scale
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def wait_for_command(fetch: Callable[[str], dict | None], command_id: str, *, timeout_s: float,
                     poll_s: float = 0.5) -> dict:
    """Poll ``fetch(command_id)`` until the command's record has settled (its verdict, and for a capture every
    frame's outcome) or ``timeout_s`` has passed; the last record."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = fetch(command_id)
        if current is None:
            raise EdgeInferError(f"the fleet manager knows no command {command_id}")
        if current.get("settled") or time.monotonic() >= deadline:
            return current
        time.sleep(poll_s)


def wait_for_deployment(fetch: Callable[[str], dict | None], deployment_id: str, *, timeout_s: float,
                        on_progress: Callable[[dict], None] | None = None, poll_s: float = 0.5) -> dict:
    """Poll ``fetch(deployment_id)`` until the deployment leaves 'running' (or time runs out)."""
    deadline = time.monotonic() + timeout_s
    last: str | None = None
    while True:
        current = fetch(deployment_id)
        if current is None:
            raise EdgeInferError(f"deployment {deployment_id} disappeared")
        snapshot = json.dumps(current.get("counts"), sort_keys=True)
        if on_progress and snapshot != last:
            on_progress(current)
            last = snapshot
        if current["status"] != DeploymentStatus.RUNNING or time.monotonic() > deadline:
            return current
        time.sleep(poll_s)
