"""Configuration held by the fleet (docs/fleet.md, *Configuration*): layers kept in revisions (who, when, why, the
diff from the one before), saved against the revision they were read at (a stale one is refused), rolled back to
any revision (a new revision equal to it), applied to the devices they reach as a configuration deployment
(:mod:`.config_rollout`), and each device's effective document with where each key comes from.

How layers merge and what a layer may hold is :mod:`.config_layers`; what a document may hold is the device's own
check (``link/config_document.py``). Secrets are stored as given and never shown back: every document, diff and
audit entry an answer carries is masked, and a document sent back masked keeps the stored secret.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, RevisionConflict
from ..link.config_document import FLEET_KEYS, encode_document
from .api.schemas import RolloutOptions
from .config_layers import LayerKey, Scope, diff, layer_problems, layers_of, redacted, restore_secrets
from .config_rollout import NOT_IN_STEP, ConfigRollouts, ConfigStatus
from .config_text import TextFormat, dump_text, parse_text
from .db import FleetDB

#: revisions of one layer listed at most
MAX_HISTORY = 1000


@dataclass(frozen=True)
class Author:
    """Who saves a revision: a token's name and role (the audit log's actor)."""

    name: str
    role: str | None = None


def layer_view(key: LayerKey, row: dict | None, *, previous: dict | None = None, with_diff: bool = False) -> dict:
    """A revision of a layer as answers show it (its document masked); revision 0 and ``{}`` for a layer never
    saved. ``with_diff``: what changed from ``previous`` (the revision before it)."""
    view: dict[str, Any] = {"scope": key.scope.value, "name": key.name, "layer": key.label, "revision": 0,
                            "document": {}, "sha256": None, "message": None, "author": None, "role": None,
                            "created_at": None, "restored_from": None, "applied_at": None, "applied_by": None}
    if row is not None:
        view.update({name: row[name] for name in ("revision", "sha256", "message", "author", "role", "created_at",
                                                  "restored_from", "applied_at", "applied_by")})
        view["document"] = redacted(row["document"])
    if with_diff:
        view["diff"] = diff((previous or {}).get("document") or {}, (row or {}).get("document") or {})
    return view


def layer_sha256(document: dict) -> str:
    return hashlib.sha256(encode_document(document)).hexdigest()


def judged(document: Any, stored: dict) -> tuple[Any, list[str]]:
    """A layer's edit as a save judges it: (the document with the stored secrets its masked texts stand for put
    back, []) or (None, every problem naming its key in ``agent --check``'s words)."""
    problems = layer_problems(document)
    if problems:
        return None, problems
    try:
        return restore_secrets(document, stored), []
    except ValueError as exc:
        return None, [str(exc)]


def _problem(text: str) -> dict[str, str]:
    key, _, words = text.partition(": ")
    return {"key": key, "words": words}


class ConfigService:
    """The fleet's configuration layers: read, save, history, roll back, apply; devices' effective documents."""

    def __init__(self, db: FleetDB, rollouts: ConfigRollouts) -> None:
        self.db = db
        self.rollouts = rollouts

    # ---------------------------------------------------------------------------------------------- reads
    def layers(self) -> list[dict]:
        """Every layer saved, its newest revision (documents masked)."""
        return [layer_view(LayerKey(Scope(row["scope"]), row["name"]), row) for row in self.db.configs.layers()]

    def layer(self, key: LayerKey) -> dict:
        """The layer's newest revision (revision 0 and ``{}``: never saved)."""
        return layer_view(key, self.db.configs.current(key.scope.value, key.name))

    def revision(self, key: LayerKey, revision: int) -> dict:
        """One revision with its diff from the one before; LookupError when there is none."""
        row = self.db.configs.revision(key.scope.value, key.name, revision)
        if row is None:
            raise LookupError(f"{key.label} has no revision {revision}")
        previous = self.db.configs.revision(key.scope.value, key.name, revision - 1) if revision > 1 else None
        return layer_view(key, row, previous=previous, with_diff=True)

    def history(self, key: LayerKey, limit: int = 100) -> list[dict]:
        """The layer's revisions, newest first, each with its diff from the one before."""
        rows = self.db.configs.history(key.scope.value, key.name, min(limit, MAX_HISTORY))
        return [layer_view(key, row, previous=rows[i + 1] if i + 1 < len(rows) else None, with_diff=True)
                for i, row in enumerate(rows[:limit])]

    def devices_of(self, key: LayerKey) -> list[dict]:
        """The devices a layer reaches: a fleet's, a group's (as each device lists its groups), or the one device."""
        if key.scope == Scope.FLEET:
            return self.db.list_devices(fleet=key.name)
        if key.scope == Scope.GROUP:
            return self.db.list_devices(group=key.name)
        found = self.db.get_device(key.name)
        return [found] if found is not None else []

    def device(self, device_id: str) -> dict:
        """A device's configuration: its status (desired vs applied vs refused), its effective document masked and
        the layer each key comes from; LookupError for a device never seen."""
        row = self.db.get_device(device_id)
        if row is None:
            raise LookupError(f"no device {device_id}")
        status = self.rollouts.statuses([row])[0]
        effective = self.rollouts.desired([row])[device_id].effective
        keys = layers_of(row["fleet"], row["groups"] or [], device_id)
        drafts = [key.label for key in keys  # saved, not applied yet: not in the desired document
                  if (current := self.db.configs.current(key.scope.value, key.name)) and current["applied_at"] is None]
        return {**status, "fleet": row["fleet"], "groups": row["groups"] or [],
                "layers": [key.label for key in keys],
                "document": redacted(effective.document), "origins": effective.origins, "drafts": drafts,
                "bootstrap": [key for key in FLEET_KEYS if key not in effective.document]}

    def devices(self, *, fleet: str | None = None, group: str | None = None) -> dict:
        """Every device's status (of a fleet, of a group), the count per status and how many are out of step."""
        statuses = self.rollouts.statuses(self.db.list_devices(fleet=fleet, group=group))
        counts = {status.value: 0 for status in ConfigStatus}
        for status in statuses:
            counts[status["status"]] += 1
        return {"counts": counts, "out_of_step": sum(counts[s.value] for s in NOT_IN_STEP), "devices": statuses}

    # ---------------------------------------------------------------------------------------------- changes
    def save(self, key: LayerKey, document: Any, *, base: int, message: str, author: Author, apply: bool = True,
             rollout: RolloutOptions | None = None, restored_from: int | None = None) -> dict:
        """Store ``document`` as the layer's next revision if ``base`` is its newest, and (``apply``) deploy what
        it changes to the devices it reaches. RevisionConflict when another save came first (judged first, and
        again as it is stored); ConfigError naming the key for a document a device would refuse, or a masked
        secret that masks nothing stored (the API answers both 409). What was saved (masked), the diff, the
        deployment (or None) and the devices left out with why."""
        current = self.db.configs.current(key.scope.value, key.name)
        if (current or {}).get("revision", 0) != base:
            raise self._stale(key, base)
        if restored_from is None:
            document, problems = judged(document, (current or {}).get("document") or {})
        else:
            problems = layer_problems(document)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ConfigError(f"{problems[0]}{more}")
        revision = self.db.configs.save(key.scope.value, key.name, base=base, document=document,
                                        sha256=layer_sha256(document), message=message, author=author.name,
                                        role=author.role, applied=apply, restored_from=restored_from)
        if revision is None:
            raise self._stale(key, base)
        saved = self.db.configs.revision(key.scope.value, key.name, revision)
        answer = {"layer": layer_view(key, saved, previous=current, with_diff=True), "deployment": None,
                  "skipped": []}
        if apply:
            answer.update(self._deploy(key, revision, rollout))
        return answer

    def _stale(self, key: LayerKey, base: int) -> RevisionConflict:
        newest = self.db.configs.current(key.scope.value, key.name)
        at = (newest or {}).get("revision", 0)
        return RevisionConflict(f"{key.label} is at revision {at}, not {base}: someone saved it since it was read "
                                "— read it again and make the change on that revision")

    def check(self, key: LayerKey, document: Any = None, *, text: str | None = None, fmt: TextFormat = "yaml",
              to_revision: int | None = None) -> dict:
        """An edit of the layer judged as :meth:`save` judges it, nothing stored: ``document``, or ``text`` (YAML or
        JSON, read here: :mod:`.config_text`), or revision ``to_revision`` (a roll back's preview; LookupError when
        there is none). Its problems (``{key, words}``), its diff from the newest revision (masked), the document
        (as given; a stored revision masked) and it as text in ``fmt``."""
        current = self.db.configs.current(key.scope.value, key.name)
        stored = (current or {}).get("document") or {}
        problems: list[str] = []
        if to_revision is not None:
            old = self.db.configs.revision(key.scope.value, key.name, to_revision)
            if old is None:
                raise LookupError(f"{key.label} has no revision {to_revision}")
            restored, problems = old["document"], layer_problems(old["document"])
            document = redacted(restored)
        else:
            if text is not None:
                document, unread = parse_text(text, fmt)
                problems = [f"{where}: {words}" for where, words in unread]
            restored, found = judged(document, stored) if not problems else (None, [])
            problems += found
        shown = document if isinstance(document, dict) else None
        changed = restored if restored is not None else shown
        return {"layer": key.label, "revision": (current or {}).get("revision", 0),
                "problems": [_problem(problem) for problem in problems],
                "diff": diff(stored, changed) if changed is not None else [],
                "document": shown, "text": dump_text(shown, fmt) if shown is not None else None}

    def roll_back(self, key: LayerKey, to: int, *, base: int, message: str, author: Author, apply: bool = True,
                  rollout: RolloutOptions | None = None) -> dict:
        """A new revision of the layer equal to revision ``to`` (as :meth:`save`); LookupError when there is none."""
        old = self.db.configs.revision(key.scope.value, key.name, to)
        if old is None:
            raise LookupError(f"{key.label} has no revision {to}")
        return self.save(key, old["document"], base=base, message=message or f"roll back to revision {to}",
                         author=author, apply=apply, rollout=rollout, restored_from=to)

    def apply(self, key: LayerKey, *, author: Author, rollout: RolloutOptions | None = None) -> dict:
        """Release the layer's newest revision to its devices (a save that did not apply it) and deploy to every
        device it reaches that does not run its desired document; LookupError for a layer never saved."""
        current = self.db.configs.current(key.scope.value, key.name)
        if current is None:
            raise LookupError(f"{key.label} was never saved")
        self.db.configs.mark_applied(key.scope.value, key.name, current["revision"], author.name)
        return {"layer": self.layer(key), **self._deploy(key, current["revision"], rollout)}

    def _deploy(self, key: LayerKey, revision: int, rollout: RolloutOptions | None) -> dict:
        devices = self.devices_of(key)
        deployment, skipped = self.rollouts.deploy(devices, rollout or RolloutOptions(),
                                                   reason=f"{key.label} r{revision}")
        return {"deployment": deployment, "skipped": skipped}
