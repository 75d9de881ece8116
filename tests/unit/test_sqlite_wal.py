"""``enable_wal`` retries SQLite's immediate ``SQLITE_BUSY`` on a journal-mode switch.

Several connections converting a new file to WAL at once can meet in a lock upgrade that
SQLite answers with ``SQLITE_BUSY`` without calling the busy handler (six stores set up
concurrently on a new file failed about one round in fifty with "database is locked").
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ctxcore.state.sql.sqlite_wal import enable_wal


def _error(code: int, text: str) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = code
    return exc


class Cursor:
    def __init__(self, errors: list[sqlite3.OperationalError]) -> None:
        self.errors = errors
        self.calls = 0

    def execute(self, sql: str) -> None:
        assert sql == "PRAGMA journal_mode = WAL"
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


def test_busy_is_retried_until_the_switch_succeeds() -> None:
    cursor = Cursor([_error(sqlite3.SQLITE_BUSY, "database is locked")] * 3)
    enable_wal(cursor, timeout_seconds=5)
    assert cursor.calls == 4


def test_other_errors_and_busy_past_the_timeout_are_raised() -> None:
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        enable_wal(Cursor([_error(sqlite3.SQLITE_IOERR, "disk I/O error")]), timeout_seconds=5)
    busy = Cursor([_error(sqlite3.SQLITE_BUSY, "database is locked")] * 1000)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        enable_wal(busy, timeout_seconds=0.05)
    assert 1 <= busy.calls < 1000


def test_a_real_new_database_file_ends_in_wal(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    try:
        enable_wal(conn.cursor(), timeout_seconds=1)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()
