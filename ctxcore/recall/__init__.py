"""Compression recall: what compaction folded, archived beside the state and searchable.

See ``chunks`` (message-aligned chunks and passages), ``index`` (the SQLite FTS5 index every
path runs) and ``archive`` (archiving, markers, the recall search). Names are imported on
first use, so the settings can check FTS5 without loading the pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctxcore.lazy import lazy_getattr

if TYPE_CHECKING:
    from ctxcore.recall.archive import (
        MAX_QUERY_TOKENS,
        RECALL_HITS,
        ChunkingConfig,
        RecallAnswer,
        archive_messages,
        fully_archived,
        recall,
        recall_marker,
    )
    from ctxcore.recall.chunks import chunk_messages
    from ctxcore.recall.index import IndexedText, RecallIndex, fts5_available, query_words, require_fts5

__all__ = [
    "MAX_QUERY_TOKENS",
    "RECALL_HITS",
    "ChunkingConfig",
    "IndexedText",
    "RecallAnswer",
    "RecallIndex",
    "archive_messages",
    "chunk_messages",
    "fts5_available",
    "fully_archived",
    "query_words",
    "recall",
    "recall_marker",
    "require_fts5",
]

_LAZY = {
    **dict.fromkeys(
        (
            "MAX_QUERY_TOKENS",
            "RECALL_HITS",
            "ChunkingConfig",
            "RecallAnswer",
            "archive_messages",
            "fully_archived",
            "recall",
            "recall_marker",
        ),
        "ctxcore.recall.archive",
    ),
    "chunk_messages": "ctxcore.recall.chunks",
    **dict.fromkeys(
        ("IndexedText", "RecallIndex", "fts5_available", "query_words", "require_fts5"),
        "ctxcore.recall.index",
    ),
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
