"""The words both ends of the link use (link/vocabulary.py): each is the word on the wire, whatever Python
formats it with; the events schema (and so docs/protocol.md) lists the event kinds from them."""

from __future__ import annotations

import json
import re

from edgeinfer.link.protocol import COMMAND_NAME_PATTERN, SCHEMAS, encode, make_command
from edgeinfer.link.vocabulary import (
    FAILED_STATES,
    FINISHED_STATES,
    PROGRESS_STATES,
    SCHEMA_EVENT_KINDS,
    WAITING_STATES,
    Command,
    EventKind,
    TargetState,
)


def test_a_word_is_its_value_in_every_form_a_payload_or_a_message_takes():
    for word in (Command.RESTART_PIPELINE, EventKind.CMD_REJECTED, TargetState.ROLLED_BACK):
        assert str(word) == f"{word}" == "%s" % word == word.value  # noqa: UP031 - the logging module's form
        assert json.dumps({"w": word}) == json.dumps({"w": word.value})
    command = make_command("c-1", Command.DEPLOY.value, {"state": TargetState.ACTIVE.value})
    assert encode(command) == b'{"v":1,"type":"cmd","id":"c-1","cmd":"deploy","args":{"state":"active"}}'
    assert TargetState("active") is TargetState.ACTIVE and TargetState.ACTIVE == "active"


def test_commands_and_event_kinds_are_names_the_schemas_take():
    for word in (*Command, *EventKind):
        assert re.fullmatch(COMMAND_NAME_PATTERN, word.value), word


def test_the_events_schema_lists_the_event_kinds_in_order():
    described = SCHEMAS["events"]["properties"]["event"]["description"]
    listed = described.removeprefix("one of ").removesuffix(" (readers must accept new ones)").split(", ")
    assert listed == [kind.value for kind in SCHEMA_EVENT_KINDS]
    assert set(EventKind) - set(SCHEMA_EVENT_KINDS) == {EventKind.UPDATE}  # a deploy's progress (docs/fleet.md)


def test_a_target_is_in_progress_or_finished_once():
    assert sorted(PROGRESS_STATES + FAILED_STATES) == sorted(TargetState)
    assert not set(PROGRESS_STATES) & set(FAILED_STATES)
    assert (TargetState.ACTIVE, *FAILED_STATES) == FINISHED_STATES
    assert set(WAITING_STATES) < set(PROGRESS_STATES) and TargetState.PENDING not in WAITING_STATES
