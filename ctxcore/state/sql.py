"""SQL backends (SQLAlchemy 2 Core): compaction state, message log and offloads.

SQLite is the default (``sqlite:///path.db``, or ``sqlite://`` in memory); PostgreSQL is
supported (``postgresql+psycopg://user@host/db``). Tables are named ``{table_prefix}...``
and created by ``setup()``, which applies the append-only ``_MIGRATIONS`` list and records
each step in ``{table_prefix}schema_migrations`` (the position is the version). Any of the
three classes' ``setup()`` brings the whole schema up to date.

Concurrency: state saves are ``UPDATE ... WHERE version = :expected`` (the primary key guards
the first insert); appends lock the conversation's counter row, so ids are gap-free (until a ``truncate_after``, which never lowers the counter) and the
counter advances in the same transaction as the rows. On SQLite every write transaction is
``BEGIN IMMEDIATE`` and ``busy_timeout`` is 10 s, so contending writers wait for the lock
instead of failing or deadlocking on a lock upgrade.

The message log is ``ctxcore.state.sql_log.SqlMessageLog``, on the same schema and helpers.
The classes of one database should share an engine: ``SqlMessageLog(engine=state.engine)``.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    and_,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import (
    TimeoutError as PoolTimeoutError,
)
from sqlalchemy.pool import QueuePool

from ctxcore.errors import ConfigError, StoreError, StoreUnavailable
from ctxcore.messages import AnyMessage, messages_from_json, messages_to_json
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite, decode_chunk, encode_chunk
from ctxcore.state.base import (
    HISTORY_LIMIT,
    check_budget,
    encode_state,
    rollback_by_save,
)
from ctxcore.state.filesystem import validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.state.models import CompressionState
from ctxcore.state.sqlite_wal import enable_wal

__all__ = ["SqlOffloadStore", "SqlStateStore", "create_store_engine"]

SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite writer waits for another's lock before giving up (StoreUnavailable)."""

_WRITE = "ctxcore_write"  # execution option marking write transactions (BEGIN IMMEDIATE on SQLite)
_TABLE_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


# --- schema ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Migration:
    """One append-only schema step; ``{p}`` is the table prefix, ``{id}`` the id column type.

    Table names are quoted, as SQLAlchemy quotes them in queries, so a prefix may have capitals.
    """

    name: str
    statements: tuple[str, ...]


# Never edit or reorder a released step: add a new one. The DDL sticks to what SQLite and
# PostgreSQL both accept.
_MIGRATIONS: tuple[_Migration, ...] = (
    _Migration(
        "compaction state: head version, kept versions, budget",
        (
            'CREATE TABLE "{p}state" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "version BIGINT NOT NULL, PRIMARY KEY (tenant_id, conversation_id))",
            'CREATE TABLE "{p}state_history" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "version BIGINT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (tenant_id, conversation_id, version))",
            'CREATE TABLE "{p}budget" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "budget_tokens BIGINT NOT NULL, PRIMARY KEY (tenant_id, conversation_id))",
        ),
    ),
    _Migration(
        "message log and its per-conversation counters",
        (
            'CREATE TABLE "{p}log_counter" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "last_seq BIGINT NOT NULL, PRIMARY KEY (tenant_id, conversation_id))",
            'CREATE TABLE "{p}log" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "seq BIGINT NOT NULL, message_key CHAR(64), data TEXT NOT NULL, "
            "PRIMARY KEY (tenant_id, conversation_id, seq), "
            "UNIQUE (tenant_id, conversation_id, message_key))",
        ),
    ),
    _Migration(
        "offloaded originals",
        (
            'CREATE TABLE "{p}offload" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "handle VARCHAR(64) NOT NULL, data TEXT NOT NULL, expires_at DOUBLE PRECISION, "
            "PRIMARY KEY (tenant_id, conversation_id, handle))",
        ),
    ),
    _Migration(
        "recall archive: chunks by log-id range and the index bytes",
        (
            'CREATE TABLE "{p}archive_chunk" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "chunk_id VARCHAR(64) NOT NULL, data TEXT NOT NULL, PRIMARY KEY (tenant_id, conversation_id, chunk_id))",
            'CREATE TABLE "{p}archive_index" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "version BIGINT NOT NULL, data {blob} NOT NULL, PRIMARY KEY (tenant_id, conversation_id))",
        ),
    ),
    _Migration(
        "stored token counts: per entry, the counted run on the counter row, other encodings",
        (
            'ALTER TABLE "{p}log" ADD COLUMN tokens BIGINT',
            'ALTER TABLE "{p}log" ADD COLUMN total BIGINT',
            'ALTER TABLE "{p}log" ADD COLUMN is_real SMALLINT',
            'ALTER TABLE "{p}log_counter" ADD COLUMN run_encoding VARCHAR(64)',
            'ALTER TABLE "{p}log_counter" ADD COLUMN run_from BIGINT',
            'ALTER TABLE "{p}log_counter" ADD COLUMN run_total BIGINT',
            'CREATE TABLE "{p}log_count" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "encoding VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, tokens BIGINT NOT NULL, "
            "PRIMARY KEY (tenant_id, conversation_id, encoding, seq))",
        ),
    ),
)

# Byte order for ids on PostgreSQL, so listing pages sort as on SQLite and Redis.
_ID_TYPE = {"sqlite": "VARCHAR(128)", "postgresql": 'VARCHAR(128) COLLATE "C"'}
_BLOB_TYPE = {"sqlite": "BLOB", "postgresql": "BYTEA"}


def _id_columns() -> tuple[Column[str], Column[str]]:
    return Column("tenant_id", String(128), primary_key=True), Column(
        "conversation_id", String(128), primary_key=True
    )


@dataclass(frozen=True)
class _Tables:
    """Core ``Table`` objects for one prefix (queries only: the DDL is in ``_MIGRATIONS``)."""

    migrations: Table
    state: Table
    state_history: Table
    budget: Table
    log_counter: Table
    log: Table
    log_count: Table
    offload: Table
    archive_chunk: Table
    archive_index: Table

    @classmethod
    def for_prefix(cls, p: str) -> _Tables:
        md = MetaData()
        return cls(
            migrations=Table(
                f"{p}schema_migrations",
                md,
                Column("version", Integer, primary_key=True),
                Column("name", String(200)),
                Column("applied_at", String(40)),
            ),
            state=Table(f"{p}state", md, *_id_columns(), Column("version", BigInteger)),
            state_history=Table(
                f"{p}state_history",
                md,
                *_id_columns(),
                Column("version", BigInteger, primary_key=True),
                Column("data", Text),
            ),
            budget=Table(f"{p}budget", md, *_id_columns(), Column("budget_tokens", BigInteger)),
            log_counter=Table(
                f"{p}log_counter",
                md,
                *_id_columns(),
                Column("last_seq", BigInteger),
                Column("run_encoding", String(64)),
                Column("run_from", BigInteger),
                Column("run_total", BigInteger),
            ),
            log=Table(
                f"{p}log",
                md,
                *_id_columns(),
                Column("seq", BigInteger, primary_key=True),
                Column("message_key", String(64)),
                Column("data", Text),
                Column("tokens", BigInteger),
                Column("total", BigInteger),
                Column("is_real", Integer),
            ),
            log_count=Table(
                f"{p}log_count",
                md,
                *_id_columns(),
                Column("encoding", String(64), primary_key=True),
                Column("seq", BigInteger, primary_key=True),
                Column("tokens", BigInteger),
            ),
            offload=Table(
                f"{p}offload",
                md,
                *_id_columns(),
                Column("handle", String(64), primary_key=True),
                Column("data", Text),
                Column("expires_at", Float),
            ),
            archive_chunk=Table(
                f"{p}archive_chunk",
                md,
                *_id_columns(),
                Column("chunk_id", String(64), primary_key=True),
                Column("data", Text),
            ),
            archive_index=Table(
                f"{p}archive_index",
                md,
                *_id_columns(),
                Column("version", BigInteger),
                Column("data", LargeBinary),
            ),
        )


# --- engine -----------------------------------------------------------------------------------


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
    # IMMEDIATE takes the write lock up front: a DEFERRED transaction that reads and then
    # writes can fail with SQLITE_BUSY on the lock upgrade without waiting for busy_timeout.
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


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
    if name not in _ID_TYPE:
        raise ConfigError(f"unsupported database dialect {name!r}: use SQLite or PostgreSQL")
    if name == "sqlite" and not event.contains(engine, "begin", _sqlite_on_begin):
        # Connections pooled before this point keep the driver's defaults (5 s busy timeout).
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)


@contextmanager
def _translated(what: str) -> Iterator[None]:
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


class _SqlBackend:
    """Engine, tables and transactions shared by the SQL backends."""

    def __init__(
        self, url: str | URL | None = None, table_prefix: str = "ctxcore_", *, engine: Engine | None = None
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
        self._t = _Tables.for_prefix(table_prefix)

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
        with _translated(what), self._engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        with self._write_lock, _translated(what), self._engine.connect() as conn:
            conn.execution_options(**{_WRITE: True})
            with conn.begin():
                yield conn

    def _where(self, table: Table, key: ConversationKey) -> ColumnElement[bool]:
        return and_(table.c.tenant_id == key.tenant_id, table.c.conversation_id == key.conversation_id)

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
            for version, step in enumerate(_MIGRATIONS[applied:], start=applied + 1):
                for statement in step.statements:
                    conn.exec_driver_sql(
                        statement.format(
                            p=prefix, id=_ID_TYPE[conn.dialect.name], blob=_BLOB_TYPE[conn.dialect.name]
                        )
                    )
                conn.execute(
                    insert(t).values(
                        version=version, name=step.name, applied_at=datetime.now(UTC).isoformat()
                    )
                )


class SqlStateStore(_SqlBackend):
    """Compaction states in SQL: a head row per conversation plus the kept versions.

    ``SqlStateStore("sqlite:///ctx.db")`` or ``SqlStateStore(engine=engine)``; call ``setup()`` once.
    """

    def load(self, key: ConversationKey) -> CompressionState | None:
        """The current state, or None."""
        head, kept = self._t.state, self._t.state_history
        query = (
            select(kept.c.data)
            .select_from(
                head.join(
                    kept,
                    and_(
                        kept.c.tenant_id == head.c.tenant_id,
                        kept.c.conversation_id == head.c.conversation_id,
                        kept.c.version == head.c.version,
                    ),
                )
            )
            .where(self._where(head, key))
        )
        with self._read(f"load {key}") as conn:
            data = conn.execute(query).scalar_one_or_none()
        return CompressionState.model_validate_json(data) if data is not None else None

    def save(
        self,
        key: ConversationKey,
        state: CompressionState,
        expected_version: int,
        archive: ArchiveWrite | None = None,
    ) -> bool:
        """Store ``state`` as version ``expected_version + 1`` iff the current version is
        ``expected_version``; ``archive`` is written in the same transaction."""
        new_version = expected_version + 1
        data = encode_state(state, new_version)
        head, kept = self._t.state, self._t.state_history
        ids = {"tenant_id": key.tenant_id, "conversation_id": key.conversation_id}
        try:
            with self._write(f"save {key}") as conn:
                if expected_version == 0:
                    conn.execute(insert(head).values(**ids, version=new_version))
                else:
                    moved = conn.execute(
                        update(head)
                        .where(self._where(head, key), head.c.version == expected_version)
                        .values(version=new_version)
                    )
                    if moved.rowcount != 1:
                        return False
                conn.execute(insert(kept).values(**ids, version=new_version, data=data))
                conn.execute(
                    delete(kept).where(self._where(kept, key), kept.c.version <= new_version - HISTORY_LIMIT)
                )
                if archive is not None:
                    self._write_archive(conn, key, archive)
        except StoreError as exc:
            # First-insert race: the other writer's head row holds the primary key.
            if isinstance(exc.__cause__, IntegrityError):
                return False
            raise
        return True

    def _write_archive(self, conn: Connection, key: ConversationKey, archive: ArchiveWrite) -> None:
        ids = {"tenant_id": key.tenant_id, "conversation_id": key.conversation_id}
        chunks, index = self._t.archive_chunk, self._t.archive_index
        if archive.chunks:
            conn.execute(
                self._insert(conn, chunks)
                .values([{**ids, "chunk_id": c.chunk_id, "data": encode_chunk(c)} for c in archive.chunks])
                .on_conflict_do_nothing(
                    index_elements=[chunks.c.tenant_id, chunks.c.conversation_id, chunks.c.chunk_id]
                )
            )
        conn.execute(
            self._insert(conn, index)
            .values(**ids, version=archive.version, data=archive.index)
            .on_conflict_do_update(
                index_elements=[index.c.tenant_id, index.c.conversation_id],
                set_={"version": archive.version, "data": archive.index},
            )
        )

    def load_archive(self, key: ConversationKey) -> bytes | None:
        """The stored recall index, or None."""
        index = self._t.archive_index
        with self._read(f"load archive of {key}") as conn:
            data = conn.execute(select(index.c.data).where(self._where(index, key))).scalar_one_or_none()
        return bytes(data) if data is not None else None

    def archive_chunks(self, key: ConversationKey) -> list[ArchiveChunk]:
        """Every archived chunk, in log order."""
        chunks = self._t.archive_chunk
        query = select(chunks.c.data).where(self._where(chunks, key)).order_by(chunks.c.chunk_id)
        with self._read(f"read archive of {key}") as conn:
            rows = conn.execute(query).scalars().all()
        return [decode_chunk(data) for data in rows]

    def history(self, key: ConversationKey, limit: int = HISTORY_LIMIT) -> list[CompressionState]:
        """The kept versions, newest first."""
        if limit < 1:
            return []
        kept = self._t.state_history
        query = select(kept.c.data).where(self._where(kept, key)).order_by(kept.c.version.desc()).limit(limit)
        with self._read(f"history {key}") as conn:
            rows = conn.execute(query).scalars().all()
        return [CompressionState.model_validate_json(data) for data in rows]

    def rollback(self, key: ConversationKey, to_version: int, expected_version: int) -> bool:
        """Save a copy of kept version ``to_version`` as version ``expected_version + 1`` (CAS)."""
        return rollback_by_save(self, key, to_version, expected_version)

    def delete(self, key: ConversationKey) -> None:
        """Remove the state, its history, its budget and its archive in one transaction."""
        with self._write(f"delete {key}") as conn:
            tables = (
                self._t.state,
                self._t.state_history,
                self._t.budget,
                self._t.archive_chunk,
                self._t.archive_index,
            )
            for table in tables:
                conn.execute(delete(table).where(self._where(table, key)))

    def get_budget(self, key: ConversationKey) -> int | None:
        """The budget last recorded for ``key``."""
        budget = self._t.budget
        with self._read(f"get_budget {key}") as conn:
            value = conn.execute(select(budget.c.budget_tokens).where(self._where(budget, key))).scalar()
        return int(value) if value is not None else None

    def set_budget(self, key: ConversationKey, budget_tokens: int) -> None:
        """Record a budget (an upsert beside the state, no version bump)."""
        check_budget(budget_tokens)
        budget = self._t.budget
        with self._write(f"set_budget {key}") as conn:
            conn.execute(
                self._insert(conn, budget)
                .values(
                    tenant_id=key.tenant_id, conversation_id=key.conversation_id, budget_tokens=budget_tokens
                )
                .on_conflict_do_update(
                    index_elements=[budget.c.tenant_id, budget.c.conversation_id],
                    set_={"budget_tokens": budget_tokens},
                )
            )


class SqlOffloadStore(_SqlBackend):
    """Offloaded originals in SQL, one row per (conversation, handle); first write wins.

    With ``ttl_seconds`` an offload expires that long after it was stored; expired rows are
    invisible and are purged by the conversation's next put.
    """

    def __init__(
        self,
        url: str | URL | None = None,
        table_prefix: str = "ctxcore_",
        *,
        engine: Engine | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        super().__init__(url, table_prefix, engine=engine)
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ConfigError(f"SqlOffloadStore ttl_seconds must be positive or None, got {ttl_seconds!r}")
        self.ttl_seconds = ttl_seconds

    def _live(self, now: float) -> ColumnElement[bool]:
        expires_at = self._t.offload.c.expires_at
        return or_(expires_at.is_(None), expires_at > now)

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Store ``messages`` under ``handle`` unless the handle exists."""
        validate_handle(handle)
        data = messages_to_json(messages).decode()
        offload, now = self._t.offload, time.time()
        with self._write(f"offload to {key}") as conn:
            # An expired handle is absent: purge the conversation's expired rows first.
            conn.execute(delete(offload).where(self._where(offload, key), offload.c.expires_at <= now))
            stored = conn.execute(
                self._insert(conn, offload)
                .values(
                    tenant_id=key.tenant_id,
                    conversation_id=key.conversation_id,
                    handle=handle,
                    data=data,
                    expires_at=now + self.ttl_seconds if self.ttl_seconds is not None else None,
                )
                .on_conflict_do_nothing(
                    index_elements=[offload.c.tenant_id, offload.c.conversation_id, offload.c.handle]
                )
                # rowcount of an INSERT is only kept when asked for (0 = the handle existed).
                .execution_options(preserve_rowcount=True)
            )
        return bool(stored.rowcount == 1)

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None (also once expired)."""
        validate_handle(handle)
        offload = self._t.offload
        query = select(offload.c.data).where(
            self._where(offload, key), offload.c.handle == handle, self._live(time.time())
        )
        with self._read(f"read offload of {key}") as conn:
            data = conn.execute(query).scalar_one_or_none()
        return messages_from_json(data) if data is not None else None

    def delete(self, key: ConversationKey) -> None:
        """Remove every offload of the conversation."""
        offload = self._t.offload
        with self._write(f"delete offloads of {key}") as conn:
            conn.execute(delete(offload).where(self._where(offload, key)))
