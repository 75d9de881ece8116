"""Archiving what a compaction folds, marking fully archived blocks, and answering recalls.

``archive_messages`` turns the messages a stage (or an embedded compressor) folds into new
chunks and passages added to the conversation's ``RecallIndex``; each log id is archived
once, so a merge or a replay after a rollback archives nothing twice. The result is an
``ArchiveWrite`` the caller saves atomically with the new state (or not at all).
``recall`` is the one search behind the tool, the route and ``ModelContext.recall``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ctxcore.errors import InvalidKeyError
from ctxcore.messages import AnyMessage
from ctxcore.recall.chunks import chunk_messages, head_within
from ctxcore.recall.index import IndexedText, RecallIndex, query_words
from ctxcore.recall.marking import recall_marker
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite
from ctxcore.state.base import parse_log_id
from ctxcore.tokens import TokenCounter

__all__ = [
    "MAX_QUERY_TOKENS",
    "RECALL_HITS",
    "ArchiveWrite",
    "ChunkingConfig",
    "RecallAnswer",
    "archive_messages",
    "fully_archived",
    "recall",
    "recall_marker",
]

MAX_QUERY_TOKENS = 512
RECALL_HITS = 2


@dataclass(frozen=True)
class ChunkingConfig:
    """Chunk and passage sizes (``recall`` settings, or ``compression_recall_config``)."""

    chunk_size_tokens: int = 3000
    chunk_overlap_tokens: int = 300
    passage_tokens: int = 256


def _consecutive(a: str, b: str) -> bool:
    try:
        return parse_log_id(b) == parse_log_id(a) + 1
    except InvalidKeyError:  # ids of a foreign shape: trust the caller's order
        return True


def _runs(messages: Sequence[AnyMessage]) -> list[list[AnyMessage]]:
    """Contiguous runs of log ids (a pinned anchor between two runs is not theirs)."""
    runs: list[list[AnyMessage]] = []
    for message in messages:
        if runs and _consecutive(str(runs[-1][-1].context_message_id), str(message.context_message_id)):
            runs[-1].append(message)
        else:
            runs.append([message])
    return runs


def archive_messages(
    index: RecallIndex | None,
    messages: Sequence[AnyMessage],
    counter: TokenCounter,
    config: ChunkingConfig,
) -> tuple[RecallIndex, ArchiveWrite | None]:
    """Add the not yet archived ``messages`` (log messages a compaction folds) to ``index``.

    Returns the index and what to store; ``None`` when every message was archived before.
    """
    index = index if index is not None else RecallIndex.empty()
    ordered = sorted(
        (m for m in messages if m.context_message_id is not None), key=lambda m: str(m.context_message_id)
    )
    done = index.archived(str(m.context_message_id) for m in ordered)
    new = [m for m in ordered if m.context_message_id not in done]
    if not new:
        return index, None
    chunks: list[ArchiveChunk] = []
    passages: list[ArchiveChunk] = []
    for run in _runs(new):
        chunks.extend(chunk_messages(run, counter, config.chunk_size_tokens, config.chunk_overlap_tokens))
        passages.extend(chunk_messages(run, counter, config.passage_tokens, 0))
    index.add((str(m.context_message_id) for m in new), chunks, passages)
    return index, ArchiveWrite(tuple(chunks), index.to_bytes(), index.version)


def fully_archived(
    index: RecallIndex, first_id: str, last_id: str, skip: frozenset[str] = frozenset()
) -> bool:
    """True when every log id from ``first_id`` to ``last_id`` (but ``skip``) is archived."""
    try:
        first, last = parse_log_id(first_id), parse_log_id(last_id)
    except InvalidKeyError:
        return False
    wanted = [f"{n:012d}" for n in range(first, last + 1)]
    wanted = [i for i in wanted if i not in skip]
    return bool(wanted) and len(index.archived(wanted)) == len(wanted)


@dataclass(frozen=True)
class RecallAnswer:
    """A recall's result: at most two chunks within the token limit, or a note saying why none."""

    query: str
    hits: tuple[IndexedText, ...] = ()
    note: str = ""
    query_truncated: bool = False
    archived_chunks: int = 0
    stats: dict[str, float] = field(default_factory=dict)


def _cut_query(query: str, counter: TokenCounter) -> tuple[str, bool]:
    if counter.count_text(query) <= MAX_QUERY_TOKENS:
        return query, False
    # Characters kept, estimated then shrunk until the query fits.
    keep = len(query) * MAX_QUERY_TOKENS // max(counter.count_text(query), 1)
    while keep > 0 and counter.count_text(query[:keep]) > MAX_QUERY_TOKENS:
        keep = keep * 9 // 10
    return query[:keep], True


def recall(index: RecallIndex | None, query: str, max_tokens: int, counter: TokenCounter) -> RecallAnswer:
    """Search the archive for ``query``: the best chunks (at most ``RECALL_HITS``) whose tokens
    together stay within ``max_tokens`` (the best one cut to fit when it alone is larger). A
    miss says so and suggests broader words."""
    text, truncated = _cut_query(query, counter)
    archived = 0 if index is None else index.chunk_count()
    if index is None or archived == 0:
        return RecallAnswer(
            text,
            note="nothing was compacted in this conversation yet: no archive to search",
            query_truncated=truncated,
        )
    found = index.search(query_words(text), limit=8)
    if not found:
        note = "no archived text matches these words: try broader or different words (names, files, errors)"
        return RecallAnswer(text, note=note, query_truncated=truncated, archived_chunks=archived)
    hits: list[IndexedText] = []
    used = 0
    for hit in found:
        if len(hits) >= RECALL_HITS:
            break
        if used + hit.tokens <= max_tokens:
            hits.append(hit)
            used += hit.tokens
        elif not hits:
            # The best chunk alone is over the limit: its head, cut at a line break.
            head, tokens = head_within(hit.text, hit.tokens, max_tokens, counter)
            if head:
                hits.append(replace(hit, text=head, tokens=tokens))
                used += tokens
    return RecallAnswer(text, tuple(hits), "", truncated, archived)
