"""Switching a SQLite database to WAL when several connections open it at once."""

from __future__ import annotations

import random
import sqlite3
import time
from typing import Any

__all__ = ["enable_wal"]


def enable_wal(cursor: Any, timeout_seconds: float) -> None:
    """Run ``PRAGMA journal_mode = WAL``, retrying while the database is busy.

    Connections converting a new database file at the same moment (several processes
    starting on it) can meet in a lock upgrade that SQLite resolves by answering
    ``SQLITE_BUSY`` at once, without calling the busy handler, so ``busy_timeout`` does not
    help: the caller must retry. Retries stop after ``timeout_seconds``, then the error is
    raised as it came.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))
