"""A small HTTP client for the fleet manager's API (what the CLI uses)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import EdgeInferError

DEFAULT_FLEET_URL = "http://127.0.0.1:8700"
FLEET_URL_ENV = "EDGEINFER_FLEET_URL"


class FleetClient:
    """Talks to ``edgeinfer fleet serve`` over HTTP."""

    def __init__(self, url: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get(FLEET_URL_ENV) or DEFAULT_FLEET_URL).rstrip("/")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None,
                 headers: dict[str, str] | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                message = exc.reason
            if exc.code == 404 and method == "GET":
                return None
            raise EdgeInferError(f"fleet manager refused {method} {path}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EdgeInferError(f"cannot reach the fleet manager at {self.url} ({reason}) — is "
                                 "`edgeinfer fleet serve` running? (--fleet-url / $EDGEINFER_FLEET_URL)") from None

    def devices(self) -> list[dict]:
        return self._request("GET", "/api/devices")

    def deployments(self) -> list[dict]:
        return self._request("GET", "/api/deployments")

    def deployment(self, deployment_id: str) -> dict | None:
        return self._request("GET", f"/api/deployments/{deployment_id}")

    def upload(self, path: str | os.PathLike) -> dict:
        """PUT a model file, streamed from disk (never read whole into memory); returns {"sha256", "size"}."""
        size = Path(path).stat().st_size
        with open(path, "rb") as body:
            return self._request("PUT", "/api/artifacts", body, {"Content-Length": str(size),
                                                                  "Content-Type": "application/octet-stream"})

    def create_deployment(self, spec: dict) -> dict:
        body = json.dumps(spec).encode()
        return self._request("POST", "/api/deployments", body, {"Content-Type": "application/json"})
