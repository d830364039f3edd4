"""The form of an event's evidence (edgeinfer/forms/evidence.py): the id every part names an event's files by."""

from __future__ import annotations

import re

from edgeinfer.forms.evidence import (
    CLIP_NAME,
    CLIP_NAMES,
    CONTENT_TYPES,
    EVENT_ID,
    EVENT_ID_PATTERN,
    EVIDENCE_FILES,
    MP4_CLIP_NAME,
    PLAIN_SNAPSHOT_NAME,
    SNAPSHOT_NAME,
    new_event_id,
)


def test_a_new_event_id_has_the_form_and_sorts_by_time():
    first, later = new_event_id(84, now=1_700_000_000.123), new_event_id(7, now=1_700_000_001.5)
    assert first.startswith("20231114T221320123Z-84-") and EVENT_ID.match(first)
    assert re.fullmatch(EVENT_ID_PATTERN, later) and first < later
    assert new_event_id(1) != new_event_id(1)  # its random part


def test_the_form_takes_nothing_else():
    good = new_event_id(3, now=1_700_000_000.5)  # 20231114T221320500Z-3-...: a 1 to replace
    for bad in (good + "\n", good.lower(), good.replace("1", "١", 1), "../" + good, good + "/x", ""):
        assert not EVENT_ID.match(bad), bad
    assert CONTENT_TYPES == {SNAPSHOT_NAME: "image/jpeg", PLAIN_SNAPSHOT_NAME: "image/jpeg",
                             CLIP_NAME: "video/x-motion-jpeg", MP4_CLIP_NAME: "video/mp4"}
    assert set(EVIDENCE_FILES) == set(CONTENT_TYPES) and set(CLIP_NAMES) <= set(EVIDENCE_FILES)


def test_every_file_name_fits_the_fleet_databases_column():
    assert all(len(name) <= 16 for name in EVIDENCE_FILES)  # evidence.file is a String(16)
