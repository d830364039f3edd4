"""Zero-touch provisioning, the manager's side: claims (created, listed, revoked by the CLI as an admin runs it),
devices' requests with a claim and a CSR against a real fleet manager with its fleet CA (``--tls``), its managed
Mosquitto and a real PostgreSQL, over real HTTPS — every bad input refused with its status and words, names given
by the manager, manual approval surviving a restart, and a flood from one address answered 429 while an
authenticated client goes on being served."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from support.ports import free_port
from support.processes import edgeinfer_cmd
from support.provisioning import HARDWARE, csr_of, new_key, provision

from edgeinfer.errors import ConfigError, ProvisioningRefused
from edgeinfer.fleet.api.rate_limit import Buckets, RateLimit
from edgeinfer.fleet.claims import CLAIM_TOKEN_RE, _Asked, public_key_sha256
from edgeinfer.fleet.client import FleetClient, FleetRequestError
from edgeinfer.fleet.device_certs import read_csr
from edgeinfer.fleet.manager import FleetManager, FleetSettings
from edgeinfer.updates.signing import PRIVATE_KEY_FILE


def settings(data_dir: Path, db_url: str, **more) -> FleetSettings:
    return FleetSettings(broker=None, broker_port=free_port(), http="127.0.0.1:0", data_dir=data_dir, db_url=db_url,
                         tls=True, **{"unauthenticated_rate": 0.0, **more})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres):
    with FleetManager(settings(tmp_path_factory.mktemp("fleet"), postgres.create_database())) as manager:
        yield manager


@pytest.fixture(scope="module")
def admin(fleet):
    return FleetClient(fleet.http.url, token=fleet.admin_token, ca=fleet.access.ca.ca_file)


def cli(fleet, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGEINFER_FLEET_URL": fleet.http.url, "EDGEINFER_FLEET_TOKEN": fleet.admin_token,
           "EDGEINFER_FLEET_CA": str(fleet.access.ca.ca_file)}
    return subprocess.run(edgeinfer_cmd("fleet", "claim", *args), capture_output=True, text=True, env=env,
                          timeout=60)


def create(fleet, *args: str) -> dict:
    done = cli(fleet, "create", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_auto_claim_gives_a_device_its_own_certificate_named_by_the_manager(fleet, admin, tmp_path):
    done = cli(fleet, "create", "--group", "lobby", "--group", "door", "--out", str(tmp_path / "image"))
    assert done.returncode == 0, done.stderr
    lines = yaml_of(done.stdout)
    assert set(lines) == {"claim", "manager_url", "ca", "update_public_key"}
    assert lines["manager_url"] == fleet.http.url and lines["update_public_key"] == fleet.key.public_key_b64()
    assert (tmp_path / "image" / lines["ca"]).read_bytes() == fleet.access.ca.ca_file.read_bytes()
    assert yaml_of((tmp_path / "image" / "agent.yaml").read_text()) == lines
    assert (tmp_path / "image" / "agent.yaml").stat().st_mode & 0o777 == 0o600

    key = new_key()
    status, body, _ = provision(fleet, lines["claim"], "10000000a1b2c3d4", key)
    assert status == 200, body
    assert body["status"] == "approved" and body["device_id"] == "cam-10000000a1b2c3d4"
    assert body["groups"] == ["lobby", "door"] and body["update_key"] == fleet.key.public_key_b64()
    # the managed broker's certificate listener: where the certificate is the device's identity (device_certs.py)
    assert body["broker"] == fleet.access.certificate_broker
    assert body["broker"]["port"] != int(fleet.broker_url.rsplit(":", 1)[1]) and body["broker"]["tls"]
    assert body["manager_url"] == fleet.http.url and body["ca"] == fleet.access.ca.ca_file.read_text()
    cert = x509.load_pem_x509_certificate(body["certificate"].encode())
    ca = x509.load_pem_x509_certificate(body["ca"].encode())
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cam-10000000a1b2c3d4"
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
    assert cert.public_key() == key.public_key()  # the device's own key: its private key never left it
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 29.9 < life.total_seconds() / 86_400 < 30.1
    assert body["not_after"] == cert.not_valid_after_utc.isoformat().replace("+00:00", "Z")
    # the same request again (a restarted agent) answers the same certificate
    again = provision(fleet, lines["claim"], "10000000a1b2c3d4", key)
    assert again[0] == 200 and again[1]["certificate"] == body["certificate"]
    listed = [c for c in admin.claims() if c["groups"] == ["lobby", "door"]]
    assert len(listed) == 1 and listed[0]["used"] == 1 and listed[0]["state"] == "active"
    assert "token" not in listed[0] and "token_hash" not in listed[0]
    actions = [(e["action"], e["target"]) for e in admin.audit(50)]
    assert ("claim.create", listed[0]["claim_id"]) in actions
    assert ("provision.request", "cam-10000000a1b2c3d4") in actions


def yaml_of(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def test_claims_that_do_not_admit_a_device_are_refused_with_their_reason(fleet, admin, tmp_path):
    assert provision(fleet, "eic_0123456789ab_" + "A" * 43, "s-unknown")[:1] == (401,)
    assert provision(fleet, "not a claim", "s-unknown")[0] == 401
    # exhausted: two devices, then no third; a rejected request frees no place until it is rejected
    limited = create(fleet, "--group", "g", "--max-devices", "2")["token"]
    assert provision(fleet, limited, "s-one")[0] == 200 and provision(fleet, limited, "s-two")[0] == 200
    status, body, _ = provision(fleet, limited, "s-three")
    assert status == 403 and "exhausted" in body["error"]
    # the serials' list
    (tmp_path / "serials.txt").write_text("# the lobby's cameras\nAA:01\n\nAA:02  # spare\n")
    listed = create(fleet, "--group", "g", "--serials", str(tmp_path / "serials.txt"))
    status, body, _ = provision(fleet, listed["token"], "AA:03")
    assert status == 403 and "not on the claim's list" in body["error"]
    status, body, _ = provision(fleet, listed["token"], "AA:01")
    assert status == 200 and body["device_id"] == "cam-AA-01"  # a ':' is no id's character
    assert listed["serials"] == 2
    # expired
    expiring = create(fleet, "--group", "g", "--expires", "1s")["token"]
    time.sleep(1.2)
    status, body, _ = provision(fleet, expiring, "s-late")
    assert status == 403 and "expired" in body["error"]
    # revoked: new devices refused, the device it let in still answered its certificate
    revocable = create(fleet, "--group", "g")
    key = new_key()
    first = provision(fleet, revocable["token"], "s-before", key)
    assert first[0] == 200
    done = cli(fleet, "revoke", revocable["claim_id"])
    assert done.returncode == 0 and "keep working" in done.stdout, done.stderr
    status, body, _ = provision(fleet, revocable["token"], "s-after")
    assert status == 403 and "revoked" in body["error"]
    assert provision(fleet, revocable["token"], "s-before", key)[1]["certificate"] == first[1]["certificate"]
    states = {c["claim_id"]: c["state"] for c in json.loads(cli(fleet, "list", "--json").stdout)}
    assert states[revocable["claim_id"]] == "revoked" and states[listed["claim_id"]] == "active"
    assert ("claim.revoke", revocable["claim_id"]) in [(e["action"], e["target"]) for e in admin.audit(50)]


def test_one_request_per_serial_and_the_manager_names_devices_uniquely(fleet, admin):
    token = create(fleet, "--group", "g", "--name-template", "door-{serial}")["token"]
    key = new_key()
    assert provision(fleet, token, "dup-1", key)[0] == 200
    status, body, _ = provision(fleet, token, "dup-1", new_key())  # a second device with this serial
    assert status == 409 and "another key" in body["error"]
    # a name already taken (another serial giving it, a device enrolled with a password) gets a suffix
    assert provision(fleet, token, "x:1")[1]["device_id"] == "door-x-1"
    assert provision(fleet, token, "x-1")[1]["device_id"] == "door-x-1-2"
    admin.enroll("door-pw-1")
    assert provision(fleet, token, "pw-1")[1]["device_id"] == "door-pw-1-2"


def asked(token: str, serial: str, key=None) -> _Asked:
    """A device's request as ClaimService.provision hands it to its batch."""
    pem = csr_of(key or new_key())
    csr = read_csr(pem)
    return _Asked(token, CLAIM_TOKEN_RE.fullmatch(token).group(1), pem, csr, public_key_sha256(csr),
                  {"serial": serial, **HARDWARE}, "127.0.0.1")


def test_one_batch_decides_its_devices_in_the_order_they_asked_as_one_at_a_time_would(fleet, admin):
    """Requests that arrive together are decided in one transaction (fleet/claims.py, _RequestBatches): the claim
    admits its places in order and no more, two serials that give one name get two names, a second key for a serial
    and the same request again are answered from the first request, an unknown claim is refused — as when each came
    alone. The batch is handed over whole here (over HTTP, what arrives together is timing)."""
    limited = create(fleet, "--group", "g", "--max-devices", "3", "--name-template", "batch-{serial}")
    key = new_key()
    batch = [asked(limited["token"], "q:1", key), asked(limited["token"], "q-1"),
             asked(limited["token"], "q:1", new_key()),  # another device says it is q:1
             asked(limited["token"], "q:1", key),  # the first asks again (a restarted agent)
             asked(limited["token"], "q-2"), asked(limited["token"], "q-3"),
             asked("eic_0123456789ab_" + "A" * 43, "q-4")]
    fleet.claims._batches._decide(batch)
    made = [a.outcome[0]["device_id"] if isinstance(a.outcome, tuple) else a.outcome.status for a in batch]
    assert made == ["batch-q-1", "batch-q-1-2", "batch-q-1", "batch-q-1", "batch-q-2", 403, 401], made
    assert "exhausted" in str(batch[5].outcome)
    with pytest.raises(ProvisioningRefused, match="another key"):
        fleet.claims._answer_existing(*batch[2].outcome, batch[2].key_sha256)
    again = fleet.claims._answer_existing(*batch[3].outcome, batch[3].key_sha256)
    assert again.status == 200 and again.body["certificate"] == batch[0].outcome[0]["certificate"]
    assert [c["used"] for c in admin.claims() if c["claim_id"] == limited["claim_id"]] == [3]
    requests = {r["device_id"]: r for r in admin.provisioning(None)}
    assert requests["batch-q-1"]["serial"] == "q:1" and requests["batch-q-1-2"]["serial"] == "q-1"
    assert "batch-q-3" not in requests and not [r for r in requests.values() if r["serial"] == "q-4"]
    audited = [(e["action"], e["target"]) for e in admin.audit(100)]
    assert all((action, name) in audited for action in ("provision.request", "provision.approve")
               for name in ("batch-q-1", "batch-q-1-2", "batch-q-2"))
    # devices asking at once over HTTPS: one 200 each, within the claim's bound
    burst = create(fleet, "--group", "g", "--max-devices", "6")["token"]
    with ThreadPoolExecutor(10) as pool:
        statuses = sorted(pool.map(lambda i: provision(fleet, burst, f"burst-{i}")[0], range(10)))
    assert statuses == [200] * 6 + [403] * 4, statuses


def twin_of(first: FleetManager, data_dir: Path, db_url: str) -> FleetManager:
    """A second manager on the first one's database, as docs/provisioning.md says to run several: the fleet CA and
    the signing key copied into its own data dir."""
    for name in ("tls/ca.key", "tls/ca.crt", PRIVATE_KEY_FILE):
        (data_dir / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(first.settings.data_dir / name, data_dir / name)
    return FleetManager(settings(data_dir, db_url))


def owns(asked_: _Asked) -> bool:
    """Whether a decided request holds its serial with its own key (not another key's earlier request)."""
    return isinstance(asked_.outcome, tuple) and asked_.outcome[0]["public_key_sha256"] == asked_.key_sha256


def spy_on_attempts(monkeypatch, managers) -> dict[str, int]:
    """Counts the batches the managers decide and the transactions that took (more: a batch decided again)."""
    counts = {"batches": 0, "decided": 0}
    for manager in managers:
        batches = manager.claims._batches
        decide, decide_once = batches._decide, batches._decide_once

        def counted_decide(batch, decide=decide):
            counts["batches"] += 1
            return decide(batch)

        def counted_once(batch, decide_once=decide_once):
            counts["decided"] += 1
            return decide_once(batch)

        monkeypatch.setattr(batches, "_decide", counted_decide)
        monkeypatch.setattr(batches, "_decide_once", counted_once)
    return counts


def test_two_managers_on_one_database_admit_a_claim_s_devices_once_each_and_within_its_bound(tmp_path, postgres,
                                                                                              monkeypatch):
    """Several managers share claims through the database (docs/provisioning.md, *Several managers*): requests that
    arrive at both at once are admitted within the claim's count, one serial once, one name once — batches of the two
    managers that race for a name or a serial, written in parallel transactions, lose to the database's unique keys
    and are decided again (fleet/claims.py, _RequestBatches.ATTEMPTS), never answered twice or 500."""
    db_url = postgres.create_database()
    with FleetManager(settings(tmp_path / "a", db_url)) as first, twin_of(first, tmp_path / "b", db_url) as second:
        managers = (first, second)
        assert second.access.ca.ca_file.read_bytes() == first.access.ca.ca_file.read_bytes()
        # two claims that name devices alike, decided by the two managers at the same instant, five times: "r:1" and
        # "r-1" ask for one name, so do "r:3" and "r-3", and "r-2" is asked for at both with two keys
        tokens = [create(first, "--group", "g", "--name-template", "race-{serial}")["token"] for _ in managers]
        attempts = spy_on_attempts(monkeypatch, managers)
        together = threading.Barrier(2)

        def decide(manager: FleetManager, batch: list[_Asked]) -> None:
            together.wait()
            manager.claims._batches._decide(batch)

        for round_ in range(5):
            batches = [[asked(tokens[0], f"r{round_}:1"), asked(tokens[0], f"r{round_}-2"),
                        asked(tokens[0], f"r{round_}:3")],
                       [asked(tokens[1], f"r{round_}-1"), asked(tokens[1], f"r{round_}-2"),
                        asked(tokens[1], f"r{round_}-3")]]
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(decide, managers, batches))
            own = sorted(a.outcome[0]["device_id"] for batch in batches for a in batch if owns(a))
            names = [f"race-r{round_}-{n}" for n in (1, 2, 3)]
            assert own == sorted([*names, f"{names[0]}-2", f"{names[2]}-2"]), [a.outcome for b in batches for a in b]
            # the second "r-2" is answered with the first one's request (then 409: another key), or refused 409
            second_r2 = [a.outcome for batch in batches for a in batch[1:2] if not owns(a)]
            assert len(second_r2) == 1 and (isinstance(second_r2[0], tuple) or second_r2[0].status == 409)
        assert attempts["batches"] == 10 and attempts["decided"] > 10, attempts  # at least one race was lost
        at_second = FleetClient(second.http.url, token=first.admin_token, ca=second.access.ca.ca_file)
        rows = at_second.provisioning(None)
        assert len(rows) == 25 and len({r["serial"] for r in rows}) == 25
        # one claim of 8, 24 devices at both managers over HTTPS (two keys ask for each of 4 serials)
        bound = at_second.create_claim({"groups": ["g"], "max_devices": 8, "name_template": "twin-{serial}"})
        serials = [f"t:{i}" for i in range(10)] + [f"t-{i}" for i in range(10)] + [f"t:{i}" for i in range(4)]
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda i: provision(managers[i % 2], bound["token"], serials[i]),
                                    range(len(serials))))
        statuses = sorted(status for status, _body, _headers in answers)
        assert statuses.count(200) == 8 and set(statuses) <= {200, 403, 409}, statuses
        admitted = [body for status, body, _headers in answers if status == 200]
        assert len({body["device_id"] for body in admitted}) == 8
        for manager in managers:
            admin = FleetClient(manager.http.url, token=first.admin_token, ca=manager.access.ca.ca_file)
            assert [c["used"] for c in admin.claims() if c["claim_id"] == bound["claim_id"]] == [8]
            listed = [r for r in admin.provisioning(None) if r["claim_id"] == bound["claim_id"]]
            assert sorted(r["device_id"] for r in listed) == sorted(b["device_id"] for b in admitted)
            assert len({r["serial"] for r in listed}) == 8


def test_bad_certificate_requests_are_refused_naming_the_fault(fleet):
    token = create(fleet, "--group", "g")["token"]
    named = csr_of(new_key(), x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cam-i-chose-myself")]))
    status, body, _ = provision(fleet, token, "csr-1", csr=named)
    assert status == 400 and "subject must be empty" in body["error"] and "manager names devices" in body["error"]
    status, body, _ = provision(fleet, token, "csr-2", csr="-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n"
                                                            "-----END CERTIFICATE REQUEST-----\n")
    assert status == 400 and body["error"].startswith("csr: not a PEM certificate request")
    weak = csr_of(rsa.generate_private_key(public_exponent=65537, key_size=1024))
    assert provision(fleet, token, "csr-3", csr=weak)[0] == 400
    status, body, _ = provision(fleet, token, "csr-4", csr="A" * 9000)  # over the CSR's bound
    assert status == 400 and body["error"].startswith("csr")
    status, body, _ = provision(fleet, token, "csr-5", body=b'{"claim": "' + b"A" * 20_000 + b'"}')
    assert status == 413
    status, body, _ = provision(fleet, token, "bad serial!")
    assert status == 400 and "hardware.serial" in body["error"]
    assert provision(fleet, token, "csr-6", body=b"{not json")[0] == 400
    # none of them was stored: the serials are free
    assert provision(fleet, token, "csr-1")[0] == 200


def test_a_manual_claim_keeps_a_device_pending_across_a_restart_until_an_operator_approves(tmp_path, postgres):
    db_url = postgres.create_database()
    with FleetManager(settings(tmp_path / "fleet", db_url)) as first:
        token = create(first, "--group", "lobby", "--approve", "manual")["token"]
        key, rejected_key = new_key(), new_key()
        status, body, headers = provision(first, token, "pend-1", key)
        assert (status, body["status"], body["device_id"]) == (202, "pending", "cam-pend-1")
        assert int(headers["Retry-After"]) == body["retry_after_s"] > 0
        assert provision(first, token, "pend-2", rejected_key)[0] == 202
    with FleetManager(settings(tmp_path / "fleet", db_url)) as manager:  # restarted while the devices wait
        assert provision(manager, token, "pend-1", key)[0] == 202  # the poll, after the restart
        pending = json.loads(cli(manager, "pending", "--json").stdout)
        assert [(p["device_id"], p["hardware"]["mac"]) for p in pending] == \
            [("cam-pend-1", HARDWARE["mac"]), ("cam-pend-2", HARDWARE["mac"])]
        done = cli(manager, "approve", "cam-pend-1")
        assert done.returncode == 0, done.stderr
        status, body, _ = provision(manager, token, "pend-1", key)
        assert status == 200 and body["device_id"] == "cam-pend-1"
        assert x509.load_pem_x509_certificate(body["certificate"].encode()).public_key() == key.public_key()
        assert cli(manager, "reject", "cam-pend-2").returncode == 0
        status, body, _ = provision(manager, token, "pend-2", rejected_key)
        assert status == 403 and "rejected by an operator" in body["error"]
        done = cli(manager, "approve", "cam-pend-2")
        assert done.returncode == 1 and "rejected" in done.stderr
        assert cli(manager, "pending", "--json").stdout.strip() == "[]"
        audit = FleetClient(manager.http.url, token=manager.admin_token, ca=manager.access.ca.ca_file).audit(20)
        assert {("provision.approve", "cam-pend-1"), ("provision.reject", "cam-pend-2")} <= \
            {(e["action"], e["target"]) for e in audit}


def test_a_flood_from_one_address_gets_429_while_authenticated_clients_are_served(tmp_path, postgres):
    """A burst of 5, refilled one an hour (so no refill happens while the test runs, however slow the machine): bad
    tokens and provisioning requests from this address are refused 429 once 5 were answered, the admin's requests
    from the same address never are."""
    with FleetManager(settings(tmp_path / "fleet", postgres.create_database(), unauthenticated_rate=1 / 3600,
                               unauthenticated_burst=5)) as manager:
        admin = FleetClient(manager.http.url, token=manager.admin_token, ca=manager.access.ca.ca_file)
        token = admin.create_claim({"groups": ["g"]})["token"]
        bad = FleetClient(manager.http.url, token="eit_" + "0" * 12 + "_" + "A" * 43, ca=manager.access.ca.ca_file)
        statuses = []
        for i in range(20):
            with pytest.raises(FleetRequestError) as refused:
                bad.whoami()
            statuses.append(refused.value.status)
            statuses.append(provision(manager, token, f"flood-{i}")[0])
            assert admin.whoami()["role"] == "admin"  # served all along
            assert isinstance(admin.devices(), list)
        assert statuses[:5] == [401, 200, 401, 200, 401] and set(statuses[5:]) == {429}, statuses
        status, body, headers = provision(manager, token, "flood-late")
        assert status == 429 and 3000 < int(headers["Retry-After"]) <= 3600 and "retry after" in body["error"]
        assert manager.db.claims.request_for("flood-late") is None  # refused before any work
        assert admin.whoami()["role"] == "admin"


def test_a_bucket_refills_at_its_rate_and_forgets_the_least_recent_address():
    now = [0.0]
    buckets = Buckets(RateLimit(rate_per_s=2.0, burst=3), clock=lambda: now[0])
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5) and buckets.wait_s("a") == pytest.approx(0.5)
    assert buckets.take("b") == 0.0  # another address has its own
    now[0] += 0.5
    assert buckets.take("a") == 0.0 and buckets.take("a") > 0
    now[0] += 100
    assert [buckets.take("a") for _ in range(4)][-1] > 0  # never more than the burst
    buckets.vouch("Bearer x")
    assert buckets.vouched("Bearer x") and not buckets.vouched("Bearer y") and not buckets.vouched(None)
    now[0] += 601
    assert not buckets.vouched("Bearer x")  # a credential is vouched for vouched_s


def test_the_manager_refuses_to_start_without_its_ca_key_naming_the_file(tmp_path):
    data_dir = tmp_path / "fleet"
    with FleetManager(settings(data_dir, f"sqlite:///{tmp_path / 'f.sqlite3'}")):
        pass
    key_file = data_dir / "tls" / "ca.key"
    ca_before = (data_dir / "tls" / "ca.crt").read_bytes()
    key_file.rename(tmp_path / "ca.key.saved")
    with pytest.raises(ConfigError, match=f"{key_file} is missing"):
        FleetManager(settings(data_dir, f"sqlite:///{tmp_path / 'f.sqlite3'}")).start()
    assert (data_dir / "tls" / "ca.crt").read_bytes() == ca_before  # no new CA in its place
    key_file.mkdir()  # a key that cannot be read
    with pytest.raises(ConfigError, match=f"cannot read the fleet CA's private key {key_file}"):
        FleetManager(settings(data_dir, f"sqlite:///{tmp_path / 'f.sqlite3'}")).start()
    key_file.rmdir()
    key_file.write_text("not a key")
    done = subprocess.run(edgeinfer_cmd("fleet", "serve", "--tls", "--data-dir", str(data_dir), "--http",
                                        "127.0.0.1:0", "--broker-port", str(free_port())),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and str(key_file) in done.stderr and "Traceback" not in done.stderr
