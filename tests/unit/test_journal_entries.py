"""Journal entries built by the workers (``workers.journal``): redacted, bounded messages; a
store that refuses the write is logged, not raised."""

from __future__ import annotations

import logging
import time

import pytest

from ctxcore.errors import StoreUnavailable
from ctxcore.state import ConversationKey
from ctxcore.state.journal import JournalEntry, MemoryStageJournal
from workers.journal import MAX_ERROR_CHARS, error_entry, write_entry

SECRET = "sk-proj-0123456789abcdefghijklmnopqrstuv"


def test_error_messages_are_redacted_and_bounded() -> None:
    entry = error_entry(
        "l0_to_l1", "failed", time.perf_counter(), kind="authentication", message=f"bad key {SECRET}"
    )
    assert entry.error_message is not None and SECRET not in entry.error_message
    assert "[REDACTED]" in entry.error_message and entry.duration_ms >= 0
    long = error_entry("l0_to_l1", "error", None, kind="internal", message="x" * 5000)
    assert long.error_message is not None and len(long.error_message) == MAX_ERROR_CHARS + 3
    assert JournalEntry.from_json(long.to_json()) == long


class Refusing(MemoryStageJournal):
    def append(self, key: ConversationKey, entry: JournalEntry) -> None:
        raise StoreUnavailable("Redis unavailable during journal of t/c: connection refused")


def test_a_refused_write_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    key = ConversationKey("t", "c")
    with caplog.at_level(logging.WARNING, logger="workers.journal"):
        write_entry(Refusing(), key, error_entry("hard_truncate", "compressed", None))
    assert "not written" in caplog.text and "connection refused" in caplog.text
