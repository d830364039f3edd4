"""What every router of the fleet API shares: the services it calls, and who is calling.

Authentication and roles are dependencies, declared on each route by its parameters' types: ``Viewer``,
``Operator`` and ``Admin`` resolve to the :class:`Caller` (401 without a usable token, 403 when its role
is too low); :func:`artifact_reader` also opens artifacts to an enrolled device's MQTT credential (HTTP
Basic) and to a download grant; :func:`evidence_uploader` lets a device upload under its own id only.
Each credential is a security scheme of the OpenAPI document — the bearer token of each role apart, so the
document says which role a route needs. Dependencies run before the parameters are validated: a caller
without a credential learns nothing of what a valid request would be.
"""

# no `from __future__ import annotations`: the role dependencies are made in a function, and FastAPI reads their
# annotations at run time, where only real annotations can see the closure's `role`
import base64
import binascii
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyQuery, HTTPBasic, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection

from ...errors import AuthError
from ..access import FleetAccess
from ..artifacts import ArtifactStore
from ..auth import Principal, Role
from ..changes import ChangeFeed
from ..claims import ClaimService
from ..commands import CommandService
from ..configs import ConfigService
from ..deployments import DeploymentService
from ..devices import DeviceService
from ..diagnosis import DiagnosisService
from ..evidence import EvidenceStore
from ..http import PEER_CERTIFICATE
from ..live_view import LiveView
from ..metrics import FleetMetrics
from ..samples import SampleStore
from .rate_limit import RateLimit, vouch

#: the largest model upload, unless the server is told otherwise
MAX_UPLOAD_BYTES = 2 << 30


@dataclass(frozen=True)
class FleetServices:
    """What the API serves from: the manager's services (``build_app`` puts them in ``app.state``)."""

    access: FleetAccess
    artifacts: ArtifactStore
    commands: CommandService
    deployments: DeploymentService
    devices: DeviceService
    evidence: EvidenceStore
    changes: ChangeFeed
    live_view: LiveView
    metrics: FleetMetrics
    samples: SampleStore
    diagnosis: DiagnosisService
    configs: ConfigService
    claims: ClaimService
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    #: the rate limit on what is not authenticated (rate_limit.py); None: none
    rate_limit: RateLimit | None = None


async def services(request: HTTPConnection) -> FleetServices:
    # async: FastAPI runs a plain def dependency in the thread pool, a hop (and back) for a lookup in a dict
    return request.app.state.services


Services = Annotated[FleetServices, Depends(services)]


@dataclass(frozen=True)
class Caller:
    """Who made a request (a token's principal) and from where; what they change goes to the audit log."""

    principal: Principal
    remote: str | None
    access: FleetAccess

    def entry(self, action: str, target: str | None, **detail: Any) -> dict[str, Any]:
        return {"actor": self.principal.name, "role": self.principal.role.value, "action": action, "target": target,
                "remote": self.remote, "detail": detail}

    def audit(self, action: str, target: str | None, **detail: Any) -> None:
        """Write one audit entry: this caller did ``action`` to ``target``."""
        self.access.record_audit(self.entry(action, target, **detail))


class _Declared(HTTPBasic):
    """HTTP Basic as the OpenAPI document shows it; the check (and its answers) is this module's own."""

    async def __call__(self, request: HTTPConnection) -> None:  # type: ignore[override]
        return None


#: a bearer token of each role (``Authorization: Bearer eit_...``); a higher role passes a lower one's check
BEARER = {role: HTTPBearer(scheme_name=f"{role.value}_token", auto_error=False,
                           description=f"an API token with the {role.value} role or a higher one "
                                       "(edgeinfer fleet token create)") for role in Role}
#: an enrolled device's MQTT user name and password (edgeinfer fleet enroll)
DEVICE_LOGIN = _Declared(scheme_name="device_credential", auto_error=False,
                         description="an enrolled device's MQTT user name and password")
#: a short-lived signed download grant, from a deploy command (``?grant=``)
GRANT = APIKeyQuery(name="grant", scheme_name="download_grant", auto_error=False,
                    description="a signed download grant for one artifact, from a deploy command")
BEARER_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="edgeinfer"'}


def caller(request: HTTPConnection, fleet: FleetServices, role: Role) -> Caller:
    """The caller's principal if its token is usable and its role at least ``role``; HTTPException otherwise."""
    try:
        principal = fleet.access.tokens.authenticate(request.headers.get("authorization"))
    except AuthError as exc:
        raise HTTPException(exc.status, str(exc), headers=BEARER_CHALLENGE) from None
    vouch(request)  # a valid token, whatever its role: its requests skip the unauthenticated rate limit
    if not principal.may(role):
        raise HTTPException(403, f"the token {principal.name!r} is a {principal.role.value}; this needs {role.value}")
    return Caller(principal, request.client.host if request.client else None, fleet.access)


def _needs(role: Role) -> Any:
    def dependency(request: Request, fleet: Services, _token: Annotated[Any, Security(BEARER[role])]) -> Caller:
        return caller(request, fleet, role)  # a plain def: the token's database lookup runs in the thread pool

    return Depends(dependency)


Viewer = Annotated[Caller, _needs(Role.VIEWER)]
Operator = Annotated[Caller, _needs(Role.OPERATOR)]
Admin = Annotated[Caller, _needs(Role.ADMIN)]


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user name, password) of an ``Authorization: Basic ...`` header; None when it is not one."""
    if header[:6].lower() != "basic ":
        return None
    try:
        username, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (username, password) if sep and username else None


def certificate_device(request: HTTPConnection, fleet: FleetServices) -> str | None:
    """The device id of the client certificate the TLS handshake verified (``fleet/http.py``), if the client gave
    one; HTTPException 401 when it gave one the fleet does not accept (revoked, expired, not a device's)."""
    der = request.scope.get("state", {}).get(PEER_CERTIFICATE)
    if not der:
        return None
    certificates = fleet.access.certificates
    identity = certificates.identity(der) if certificates is not None else None
    if identity is None:
        raise HTTPException(401, "the device certificate is not valid (revoked, expired, or not a device's)")
    return identity


def artifact_reader(request: Request, fleet: Services, _token: Annotated[Any, Security(BEARER[Role.VIEWER])],
                    _device: Annotated[Any, Security(DEVICE_LOGIN)], _grant: Annotated[Any, Security(GRANT)]) -> None:
    """A download grant for this artifact, an enrolled device's MQTT credential (Basic), or a viewer token: any one
    of them opens it, as the document's security says (an empty ``grant=`` is no grant; a grant that does not hold
    beside an ``Authorization`` header leaves that header to be judged). A configuration document (it may hold
    secrets: a camera's password) opens to its grant and to the credential of a device it was given to only: 403 for
    any other device and for every token."""
    sha256 = str(request.path_params.get("sha256", ""))
    grant = request.query_params.get("grant")
    header = request.headers.get("authorization") or ""
    if grant:
        if fleet.access.tokens.grant_allows(grant, sha256):
            vouch(request)
            return
        if not header:
            raise HTTPException(401, "the download grant is not valid for this artifact (expired, or forged)")
    identity = certificate_device(request, fleet) if not header else None
    if header[:6].lower() == "basic " or identity is not None:
        login = basic_credentials(header)
        if identity is None:
            identity = fleet.access.tokens.device_identity(*login) if login is not None else None
        if identity is None:
            raise HTTPException(401, "the device credential is not valid (revoked, or never enrolled)",
                                headers={"WWW-Authenticate": 'Basic realm="edgeinfer artifacts"'})
        vouch(request)
        if fleet.configs.rollouts.holds(sha256) and not fleet.configs.rollouts.holds(sha256, identity):
            raise HTTPException(403, f"this configuration document is not {identity}'s")
        return
    caller(request, fleet, Role.VIEWER)
    if fleet.configs.rollouts.holds(sha256):
        raise HTTPException(403, "a configuration document may hold secrets: only the device it is for downloads it "
                                 "(read it masked with GET /api/config/devices/{device_id})")


def evidence_uploader(request: Request, fleet: Services, _token: Annotated[Any, Security(BEARER[Role.OPERATOR])],
                      _device: Annotated[Any, Security(DEVICE_LOGIN)]) -> Caller | None:
    """None for a device uploading under its own id (Basic), the :class:`Caller` of an operator's token;
    HTTPException 401 / 403 otherwise."""
    header = request.headers.get("authorization") or ""
    identity = certificate_device(request, fleet) if not header else None
    if header[:6].lower() != "basic " and identity is None:
        return caller(request, fleet, Role.OPERATOR)
    if identity is None:
        login = basic_credentials(header)
        identity = fleet.access.tokens.device_identity(*login) if login is not None else None
    if identity is None:
        raise HTTPException(401, "the device credential is not valid (revoked, or never enrolled)",
                            headers={"WWW-Authenticate": 'Basic realm="edgeinfer evidence"'})
    vouch(request)
    device_id = str(request.path_params.get("device_id", ""))
    if identity != device_id:
        raise HTTPException(403, f"this is the credential of device {identity!r}: it uploads evidence under "
                                 f"/api/devices/{identity}/ only")
    return None


ArtifactReader = Annotated[None, Depends(artifact_reader)]
EvidenceUploader = Annotated[Caller | None, Depends(evidence_uploader)]
