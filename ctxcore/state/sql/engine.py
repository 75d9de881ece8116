"""The SQL stores' engine set-up (SQLite pooling, transactions and busy handling; PostgreSQL
pooling), the error translation and ``SqlBackend``, the base the SQL stores share.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import QueuePool

from ctxcore.errors import ConfigError, StoreError, StoreUnavailable
from ctxcore.state.keys import ConversationKey
from ctxcore.state.retention import ACTIVITY_RESOLUTION_SECONDS
from ctxcore.state.sql.schema import BLOB_TYPE, ID_TYPE, MIGRATIONS, Tables
from ctxcore.state.sql.sqlite_wal import enable_wal

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "SqlBackend", "create_store_engine", "translated_errors"]

SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite writer waits for another's lock before giving up (StoreUnavailable)."""

_WRITE = "ctxcore_write"  # execution option marking write transactions (BEGIN IMMEDIATE on SQLite)
_TABLE_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take BEGIN away from the sqlite3 driver (it would start write transactions lazily,
    # as DEFERRED); `_sqlite_on_begin` emits it instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        # WAL: readers do not block the writer nor the writer the readers (a no-op in memory).
        enable_wal(cursor, SQLITE_BUSY_TIMEOUT_MS / 1000)
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    options = conn.get_execution_options()
    if options.get("isolation_level") == "AUTOCOMMIT":
        return  # one statement, read outside a transaction (``ctxcore.state.sql.window``)
    # IMMEDIATE takes the write lock up front: a DEFERRED transaction that reads and then
    # writes can fail with SQLITE_BUSY on the lock upgrade without waiting for busy_timeout.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(_WRITE) else "BEGIN")


def create_store_engine(url: str | URL) -> Engine:
    """The engine the SQL stores build for ``url``: SQLite pooling and transaction settings,
    a PostgreSQL pool sized for threaded servers. Pass it as ``engine=`` to share it."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        in_memory = parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory"
        if in_memory:
            # One in-memory database is one connection: a pool of exactly one hands it to
            # one thread at a time (the default pool would give each thread its own database).
            return create_engine(
                parsed,
                poolclass=QueuePool,
                pool_size=1,
                max_overflow=0,
                connect_args={"check_same_thread": False},
            )
        return create_engine(parsed, connect_args={"check_same_thread": False})
    if backend == "postgresql":
        connect_args = {} if "connect_timeout" in parsed.query else {"connect_timeout": 10}
        # Keep enough connections for a threaded server: a connection above pool_size is
        # closed on return, and opening one costs a PostgreSQL backend process.
        return create_engine(
            parsed, pool_size=20, max_overflow=10, pool_pre_ping=True, connect_args=connect_args
        )
    raise ConfigError(f"unsupported database {parsed.drivername!r}: use sqlite:/// or postgresql+psycopg://")


def _prepare(engine: Engine) -> None:
    """Check the dialect and, on SQLite, install the transaction listeners (once per engine)."""
    name = engine.dialect.name
    if name not in ID_TYPE:
        raise ConfigError(f"unsupported database dialect {name!r}: use SQLite or PostgreSQL")
    if name == "sqlite" and not event.contains(engine, "begin", _sqlite_on_begin):
        # Connections pooled before this point keep the driver's defaults (5 s busy timeout).
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)


@contextmanager
def translated_errors(what: str) -> Iterator[None]:
    """Map SQLAlchemy errors to ``StoreUnavailable`` / ``StoreError``, cause chained."""
    try:
        yield
    except IntegrityError as exc:
        raise StoreError(f"constraint violated during {what}: {exc}") from exc
    except (OperationalError, InterfaceError, PoolTimeoutError) as exc:
        if "no such table" in str(exc):  # SQLite's way of saying the schema is missing
            raise StoreError(f"database error during {what}: {exc} (did you call setup()?)") from exc
        raise StoreUnavailable(f"database unavailable during {what}: {exc}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(f"database connection lost during {what}: {exc}") from exc
        raise StoreError(f"database error during {what}: {exc} (did you call setup()?)") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"database error during {what}: {exc}") from exc


class SqlBackend:
    """Engine, tables and transactions shared by the SQL backends."""

    def __init__(
        self,
        url: str | URL | None = None,
        table_prefix: str = "ctxcore_",
        *,
        engine: Engine | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (url is None) == (engine is None):
            raise ConfigError(f"{type(self).__name__}: pass exactly one of url and engine")
        if _TABLE_PREFIX.fullmatch(table_prefix) is None:
            raise ConfigError(
                f"invalid table_prefix {table_prefix!r}: use up to 40 of letters, digits and '_', not starting with a digit"
            )
        self._owns_engine = engine is None
        self._engine = engine if engine is not None else create_store_engine(url)  # type: ignore[arg-type]
        _prepare(self._engine)
        # SQLite's busy handler polls with sleeps of up to 100 ms; this object's threads queue
        # on a lock instead. Other processes and engines still wait through busy_timeout.
        self._write_lock: AbstractContextManager[Any] = (
            threading.Lock() if self._engine.dialect.name == "sqlite" else nullcontext()
        )
        self.table_prefix = table_prefix
        self._t = Tables.for_prefix(table_prefix)
        # Epoch seconds for ``last_active_at`` (a test passes a fake clock).
        self._clock = clock

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (pass it as ``engine=`` to the other SQL backends)."""
        return self._engine

    def close(self) -> None:
        """Close pooled connections if this object created the engine."""
        if self._owns_engine:
            self._engine.dispose()

    @contextmanager
    def _read(self, what: str) -> Iterator[Connection]:
        with translated_errors(what), self._engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        with self._write_lock, translated_errors(what), self._engine.connect() as conn:
            conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn

    def _where(self, table: Table, key: ConversationKey) -> ColumnElement[bool]:
        return and_(table.c.tenant_id == key.tenant_id, table.c.conversation_id == key.conversation_id)

    def _delete_all(self, what: str, key: ConversationKey, *tables: Table) -> None:
        """Remove ``key``'s rows from ``tables`` in one write transaction."""
        with self._write(what) as conn:
            for table in tables:
                conn.execute(delete(table).where(self._where(table, key)))

    @staticmethod
    def _stamp(column: Column[Any], now: float) -> ColumnElement[Any]:
        """``last_active_at`` after activity at ``now``: moved only when it is missing or
        ``ACTIVITY_RESOLUTION_SECONDS`` behind, so busy rows keep their indexed value."""
        stale = or_(column.is_(None), column < now - ACTIVITY_RESOLUTION_SECONDS)
        return case((stale, now), else_=column)

    def _insert(self, conn: Connection, table: Table) -> Any:
        """A dialect INSERT, which has ``on_conflict_do_nothing`` / ``on_conflict_do_update``."""
        return (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(table)

    def setup(self) -> None:
        """Create or upgrade the tables (idempotent; safe to run from several processes)."""
        prefix, t = self.table_prefix, self._t.migrations
        with self._write("setup") as conn:
            if conn.dialect.name == "postgresql":
                # Serialise concurrent setups; the lock ends with the transaction.
                lock_id = int.from_bytes(hashlib.sha256(prefix.encode()).digest()[:8], "big", signed=True)
                conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id})
            conn.exec_driver_sql(
                f'CREATE TABLE IF NOT EXISTS "{prefix}schema_migrations" (version INTEGER PRIMARY KEY, '
                "name VARCHAR(200) NOT NULL, applied_at VARCHAR(40) NOT NULL)"
            )
            applied = conn.execute(select(func.max(t.c.version))).scalar_one_or_none() or 0
            for version, step in enumerate(MIGRATIONS[applied:], start=applied + 1):
                for statement in step.statements:
                    conn.exec_driver_sql(
                        statement.format(
                            p=prefix, id=ID_TYPE[conn.dialect.name], blob=BLOB_TYPE[conn.dialect.name]
                        )
                    )
                conn.execute(
                    insert(t).values(
                        version=version, name=step.name, applied_at=datetime.now(UTC).isoformat()
                    )
                )
