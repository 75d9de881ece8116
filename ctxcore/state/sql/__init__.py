"""SQL backends (SQLAlchemy 2 Core): compaction state, message log and offloads.

SQLite is the default (``sqlite:///path.db``, or ``sqlite://`` in memory); PostgreSQL is
supported (``postgresql+psycopg://user@host/db``). Tables are named ``{table_prefix}...``
and created by ``setup()``, which applies the append-only ``MIGRATIONS`` list and records
each step in ``{table_prefix}schema_migrations`` (the position is the version). Any of the
three classes' ``setup()`` brings the whole schema up to date.

Concurrency: state saves are ``UPDATE ... WHERE version = :expected`` (the primary key guards
the first insert); appends lock the conversation's counter row, so ids are gap-free (until a ``truncate_after``, which never lowers the counter) and the
counter advances in the same transaction as the rows. On SQLite every write transaction is
``BEGIN IMMEDIATE`` and ``busy_timeout`` is 10 s, so contending writers wait for the lock
instead of failing or deadlocking on a lock upgrade.

The message log is ``ctxcore.state.sql.log.SqlMessageLog``, on the same schema and helpers.
The classes of one database should share an engine: ``SqlMessageLog(engine=state.engine)``.

Layout: the migrations and tables in ``schema``, the engine set-up and the shared
``SqlBackend`` in ``engine``, a module per store (``state``, ``offload``,
``log``), the counted tail in ``tail``, the window read in ``window``, retention in ``retention``,
the stage journal in ``journal``, SQLite's WAL set-up in ``sqlite_wal``; this module re-exports the public names.
"""

from __future__ import annotations

from ctxcore.state.sql.engine import SQLITE_BUSY_TIMEOUT_MS, create_store_engine
from ctxcore.state.sql.log import SqlMessageLog
from ctxcore.state.sql.offload import SqlOffloadStore
from ctxcore.state.sql.state import SqlStateStore

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "SqlMessageLog",
    "SqlOffloadStore",
    "SqlStateStore",
    "create_store_engine",
]
