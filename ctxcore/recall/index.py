"""``RecallIndex``: what a conversation's compactions folded, searchable, in one SQLite file.

One in-memory SQLite database per conversation holds the archived log ids, the chunks and
the auto-recall passages, each text table with an FTS5 index (``porter unicode61``) ranked
by ``bm25()``, ties going to the newer range. Every path (workers, the fast path, the
embedded engine, the recall route) runs this one implementation; the stores keep only the
chunks and the bytes of ``Connection.serialize()``.

Why not bm25s: it would bring numpy and scipy into the core for an index of a few thousand
chunks per conversation, which SQLite's FTS5 (in the standard library) ranks in well under
a millisecond.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ctxcore.errors import ConfigError
from ctxcore.state.archive import ArchiveChunk

__all__ = ["IndexedText", "RecallIndex", "fts5_available", "query_words", "require_fts5"]

_SCHEMA = (
    "CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE archived(log_id TEXT PRIMARY KEY)",
    "CREATE TABLE chunks(rowid INTEGER PRIMARY KEY, chunk_id TEXT UNIQUE, first_id TEXT, last_id TEXT, "
    "part INTEGER, tokens INTEGER, text TEXT)",
    "CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='rowid', "
    "tokenize='porter unicode61')",
    "CREATE TABLE passages(rowid INTEGER PRIMARY KEY, first_id TEXT, last_id TEXT, part INTEGER, "
    "tokens INTEGER, text TEXT)",
    "CREATE VIRTUAL TABLE passages_fts USING fts5(text, content='passages', content_rowid='rowid', "
    "tokenize='porter unicode61')",
)
_WORD = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_WORDS = 64


def fts5_available() -> bool:
    """True when this Python's SQLite has FTS5 (recall needs it)."""
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError:
        return False
    return True


def require_fts5(setting: str) -> None:
    """``ConfigError`` naming ``setting`` when recall is on but FTS5 is missing."""
    if not fts5_available():
        raise ConfigError(
            f"{setting} is on, but this Python's SQLite ({sqlite3.sqlite_version}) has no FTS5: "
            "use a Python built with FTS5 (CPython's official builds have it) or turn recall off"
        )


def query_words(text: str) -> list[str]:
    """The distinct words of a query, lowercased, in order (at most ``MAX_QUERY_WORDS``).

    Each is quoted in the MATCH expression, so ``"``, ``*``, ``NEAR`` or ``OR`` in a query
    are plain words, never FTS5 syntax.
    """
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.casefold()):
        seen.setdefault(word, None)
        if len(seen) >= MAX_QUERY_WORDS:
            break
    return list(seen)


@dataclass(frozen=True)
class IndexedText:
    """A chunk or passage found by a search, with its bm25 score (higher is better)."""

    first_id: str
    last_id: str
    part: int
    tokens: int
    text: str
    score: float

    @property
    def range_id(self) -> str:
        """``<first>-<last>`` (``:<part>`` for a piece of a split message)."""
        base = f"{self.first_id}-{self.last_id}"
        return f"{base}:{self.part}" if self.part else base


class RecallIndex:
    """One conversation's archive index (see the module docstring).

    Thread-safe: one lock serialises the queries on its connection (each takes well
    under a millisecond), so a cached index can serve every request thread.
    """

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()

    @classmethod
    def empty(cls) -> RecallIndex:
        """A new index with nothing archived."""
        db = sqlite3.connect(":memory:", check_same_thread=False)
        # Small pages: an index of a few chunks serialises to tens of kB, not hundreds.
        db.execute("PRAGMA page_size = 1024")
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('version', '0')")
        db.commit()
        return cls(db)

    @classmethod
    def from_bytes(cls, data: bytes) -> RecallIndex:
        """The index stored as ``data`` (``to_bytes``)."""
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.deserialize(data)
        return cls(db)

    def to_bytes(self) -> bytes:
        """The whole index as bytes (committed first: an uncommitted copy holds no rows)."""
        with self._lock:
            self._db.commit()
            return self._db.serialize()

    @property
    def version(self) -> int:
        """How many archive writes this index has seen."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()
        return int(row[0]) if row else 0

    def archived(self, log_ids: Iterable[str]) -> set[str]:
        """Which of ``log_ids`` are archived already."""
        ids = list(log_ids)
        found: set[str] = set()
        with self._lock:
            return self._archived(ids, found)

    def _archived(self, ids: list[str], found: set[str]) -> set[str]:
        for start in range(0, len(ids), 500):
            batch = ids[start : start + 500]
            marks = ",".join("?" * len(batch))
            found.update(
                r[0]
                for r in self._db.execute(f"SELECT log_id FROM archived WHERE log_id IN ({marks})", batch)
            )
        return found

    def add(
        self, log_ids: Iterable[str], chunks: Sequence[ArchiveChunk], passages: Sequence[ArchiveChunk]
    ) -> None:
        """Record ``log_ids`` as archived with their chunks and passages; bumps the version."""
        with self._lock:
            self._add(log_ids, chunks, passages)

    def _add(
        self, log_ids: Iterable[str], chunks: Sequence[ArchiveChunk], passages: Sequence[ArchiveChunk]
    ) -> None:
        db = self._db
        db.executemany("INSERT OR IGNORE INTO archived VALUES (?)", [(i,) for i in log_ids])
        for chunk in chunks:
            cursor = db.execute(
                "INSERT OR IGNORE INTO chunks(chunk_id, first_id, last_id, part, tokens, text) VALUES (?,?,?,?,?,?)",
                (chunk.chunk_id, chunk.first_id, chunk.last_id, chunk.part, chunk.tokens, chunk.text),
            )
            if cursor.rowcount:
                db.execute(
                    "INSERT INTO chunks_fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, chunk.text)
                )
        for passage in passages:
            cursor = db.execute(
                "INSERT INTO passages(first_id, last_id, part, tokens, text) VALUES (?,?,?,?,?)",
                (passage.first_id, passage.last_id, passage.part, passage.tokens, passage.text),
            )
            db.execute(
                "INSERT INTO passages_fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, passage.text)
            )
        db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE name = 'version'")
        db.commit()

    def chunk_count(self) -> int:
        """How many chunks are archived."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM chunks").fetchone()[0])

    def search(self, words: Sequence[str], limit: int = 2) -> list[IndexedText]:
        """The best chunks for ``words`` (bm25; ties to the more recently archived chunk)."""
        if not words:
            return []
        with self._lock:
            # Rank on the narrow columns first, then read only the winners' text: sorting rows
            # that carry 3,000-token texts is what made a query cost milliseconds.
            ranked = self._db.execute(
                "SELECT rowid, bm25(chunks_fts) AS s FROM chunks_fts "
                "WHERE chunks_fts MATCH ? ORDER BY s, rowid DESC LIMIT ?",
                (_match(words), limit),
            ).fetchall()
            return self._texts("chunks", ranked)

    def passages(
        self, words: Sequence[str], within: Sequence[IndexedText], limit: int = 32
    ) -> list[IndexedText]:
        """The best passages for ``words`` overlapping the log-id ranges of ``within``.

        Overlapping, not inside: passages and chunks are cut independently (different sizes,
        chunks overlap), so the passage holding a chunk's best message may reach past it.
        """
        if not words or not within:
            return []
        ranges = " OR ".join("(p.first_id <= ? AND p.last_id >= ?)" for _ in within)
        bounds = [value for chunk in within for value in (chunk.last_id, chunk.first_id)]
        with self._lock:
            ranked = self._db.execute(
                "SELECT p.rowid, bm25(passages_fts) AS s "
                "FROM passages_fts JOIN passages p ON p.rowid = passages_fts.rowid "
                f"WHERE passages_fts MATCH ? AND ({ranges}) ORDER BY s, p.last_id DESC, p.part LIMIT ?",
                (_match(words), *bounds, limit),
            ).fetchall()
            return self._texts("passages", ranked)

    def _texts(self, table: str, ranked: Sequence[tuple[int, float]]) -> list[IndexedText]:
        # Under ``_lock``; ``table`` is one of the two literal names above, never input.
        rows = [
            (
                self._db.execute(
                    f"SELECT first_id, last_id, part, tokens, text FROM {table} WHERE rowid = ?", (rowid,)
                ).fetchone(),
                score,
            )
            for rowid, score in ranked
        ]
        return [IndexedText(r[0], r[1], r[2], r[3], r[4], -float(score)) for r, score in rows]


def _match(words: Sequence[str]) -> str:
    # Double quotes inside a phrase are doubled in FTS5; \w+ words never hold any.
    return " OR ".join(f'"{w}"' for w in words)
