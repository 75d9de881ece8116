"""The SQL stores' schema: the append-only migrations (DDL) and the Core tables queries use."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, Column, Float, Integer, LargeBinary, MetaData, String, Table, Text

from ctxcore.errors import InvalidKeyError
from ctxcore.state.base import parse_log_id
from ctxcore.state.models import CompressionState

# Every other name is private to the SQL backends (engine, state, offload, journal,
# log, window).
__all__ = ["BLOB_TYPE", "ID_TYPE", "MIGRATIONS", "Tables", "window_head"]


def window_head(state: CompressionState) -> tuple[int | None, list[int]]:
    """What a saved state's head row holds for the window's one-statement read: the cursor's
    seq (0: none) and the pinned seqs; (None, []) when an id is not a log id (such a state
    is read the old way)."""
    try:
        cursor = parse_log_id(state.covered_until) if state.covered_until else 0
        return cursor, sorted({parse_log_id(i) for i in state.pinned})
    except InvalidKeyError:
        return None, []


@dataclass(frozen=True)
class _Migration:
    """One append-only schema step; ``{p}`` is the table prefix, ``{id}`` the id column type.

    Table names are quoted, as SQLAlchemy quotes them in queries, so a prefix may have capitals.
    """

    name: str
    statements: tuple[str, ...]


# Never edit or reorder a released step: add a new one. The DDL sticks to what SQLite and
# PostgreSQL both accept.
MIGRATIONS: tuple[_Migration, ...] = (
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
    _Migration(
        "retention: when each conversation was last appended to (counter) or windowed (budget)",
        (
            # Epoch seconds, stamped by every append (counter) and window (budget).
            'ALTER TABLE "{p}log_counter" ADD COLUMN last_active_at DOUBLE PRECISION',
            'ALTER TABLE "{p}budget" ADD COLUMN last_active_at DOUBLE PRECISION',
            'CREATE INDEX "{p}log_counter_active" ON "{p}log_counter" (last_active_at)',
            'CREATE INDEX "{p}budget_active" ON "{p}budget" (last_active_at)',
        ),
    ),
    _Migration(
        "window reads in one statement: the state's cursor and pinned entries beside its head row",
        (
            # NULL: saved before this step (windows read such a state the old way until it is saved again).
            'ALTER TABLE "{p}state" ADD COLUMN covered_seq BIGINT',
            'CREATE TABLE "{p}state_pinned" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "seq BIGINT NOT NULL, PRIMARY KEY (tenant_id, conversation_id, seq))",
        ),
    ),
    _Migration(
        "stage journal: the newest stage runs of each conversation",
        (
            'CREATE TABLE "{p}journal" (tenant_id {id} NOT NULL, conversation_id {id} NOT NULL, '
            "seq BIGINT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (tenant_id, conversation_id, seq))",
        ),
    ),
)

# Byte order for ids on PostgreSQL, so listing pages sort as on SQLite and Redis.
ID_TYPE = {"sqlite": "VARCHAR(128)", "postgresql": 'VARCHAR(128) COLLATE "C"'}
BLOB_TYPE = {"sqlite": "BLOB", "postgresql": "BYTEA"}


def _id_columns() -> tuple[Column[str], Column[str]]:
    return Column("tenant_id", String(128), primary_key=True), Column(
        "conversation_id", String(128), primary_key=True
    )


@dataclass(frozen=True)
class Tables:
    """Core ``Table`` objects for one prefix (queries only: the DDL is in ``MIGRATIONS``)."""

    migrations: Table
    state: Table
    state_pinned: Table
    state_history: Table
    budget: Table
    log_counter: Table
    log: Table
    log_count: Table
    offload: Table
    archive_chunk: Table
    archive_index: Table
    journal: Table

    def conversation_tables(self) -> tuple[Table, ...]:
        """Every table with rows of a conversation (what deleting one removes)."""
        return (
            self.state,
            self.state_pinned,
            self.state_history,
            self.budget,
            self.log_counter,
            self.log,
            self.log_count,
            self.offload,
            self.archive_chunk,
            self.archive_index,
            self.journal,
        )

    @classmethod
    def for_prefix(cls, p: str) -> Tables:
        md = MetaData()
        return cls(
            migrations=Table(
                f"{p}schema_migrations",
                md,
                Column("version", Integer, primary_key=True),
                Column("name", String(200)),
                Column("applied_at", String(40)),
            ),
            state=Table(
                f"{p}state",
                md,
                *_id_columns(),
                Column("version", BigInteger),
                Column("covered_seq", BigInteger),
            ),
            state_pinned=Table(
                f"{p}state_pinned", md, *_id_columns(), Column("seq", BigInteger, primary_key=True)
            ),
            state_history=Table(
                f"{p}state_history",
                md,
                *_id_columns(),
                Column("version", BigInteger, primary_key=True),
                Column("data", Text),
            ),
            budget=Table(
                f"{p}budget",
                md,
                *_id_columns(),
                Column("budget_tokens", BigInteger),
                Column("last_active_at", Float),
            ),
            log_counter=Table(
                f"{p}log_counter",
                md,
                *_id_columns(),
                Column("last_seq", BigInteger),
                Column("run_encoding", String(64)),
                Column("run_from", BigInteger),
                Column("run_total", BigInteger),
                Column("last_active_at", Float),
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
            journal=Table(
                f"{p}journal",
                md,
                *_id_columns(),
                Column("seq", BigInteger, primary_key=True),
                Column("data", Text),
            ),
        )
