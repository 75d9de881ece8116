"""Archive chunks and auto-recall passages: what a compaction folded, cut into searchable text.

Both are message-aligned: a chunk (or passage) is a run of whole serialised messages of at
most ``size`` tokens, consecutive chunks overlapping by up to ``overlap`` tokens of whole
messages. A message longer than ``size`` is split at line breaks into parts of its own (a
line longer than ``size`` at the character that fits). Chunks are keyed by the log-id range
they hold (``first_id``..``last_id``, plus ``part`` for the pieces of one long message), so
merges and rollbacks, which change blocks, never invalidate them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ctxcore.errors import InvalidMessageError
from ctxcore.messages import AnyMessage
from ctxcore.render import serialize_message
from ctxcore.state.archive import ArchiveChunk
from ctxcore.tokens import TokenCounter

__all__ = ["chunk_messages", "head_within", "split_text"]


def _tokens(counter: TokenCounter, text: str) -> int:
    return max(counter.count_text(text), 1)


def split_text(text: str, size: int, counter: TokenCounter) -> list[str]:
    """``text`` in pieces of at most ``size`` tokens, cut at line breaks where possible."""
    pieces: list[str] = []
    current: list[str] = []
    used = 0
    for line in text.split("\n"):
        cost = _tokens(counter, line) + 1
        if cost > size:
            if current:
                pieces.append("\n".join(current))
                current, used = [], 0
            # One very long line: cut it by characters, estimated then checked.
            step = max(len(line) * size // cost, 1)
            for start in range(0, len(line), step):
                pieces.append(line[start : start + step])
            continue
        if current and used + cost > size:
            pieces.append("\n".join(current))
            current, used = [], 0
        current.append(line)
        used += cost
    if current:
        pieces.append("\n".join(current))
    return [p for p in pieces if p.strip()]


def head_within(text: str, tokens: int, size: int, counter: TokenCounter) -> tuple[str, int]:
    """The head of ``text`` (``tokens`` long) within ``size`` tokens, cut at a line break when
    one falls in the last fifth, with its token count. Estimated from the text's own
    characters per token, then checked: a handful of counts, where ``split_text`` would count
    every line."""
    if tokens <= size:
        return text, tokens
    keep = len(text) * size // max(tokens, 1)
    while keep > 0:
        head = text[:keep]
        cut = head.rfind("\n")
        if cut > keep * 4 // 5:
            head = head[:cut]
        used = counter.count_text(head)
        if used <= size:
            return head, used
        keep = keep * 9 // 10
    return "", 0


@dataclass(frozen=True)
class _Unit:
    log_id: str
    text: str
    tokens: int


def _units(messages: Sequence[AnyMessage], counter: TokenCounter) -> Iterator[_Unit]:
    for message in messages:
        log_id = message.context_message_id
        if log_id is None:
            raise InvalidMessageError(
                -1, "context_message_id", "archived messages need their log id: archive messages as logged"
            )
        text = serialize_message(message)
        yield _Unit(log_id, text, _tokens(counter, text))


def chunk_messages(
    messages: Sequence[AnyMessage], counter: TokenCounter, size: int, overlap: int
) -> list[ArchiveChunk]:
    """Message-aligned chunks of ``messages`` (a contiguous run of the log) of at most ``size``
    tokens, each starting with up to ``overlap`` tokens of the previous chunk's last messages."""
    chunks: list[ArchiveChunk] = []
    window: list[_Unit] = []
    used = 0

    def emit() -> None:
        chunks.append(
            ArchiveChunk(window[0].log_id, window[-1].log_id, "\n".join(u.text for u in window), used)
        )

    for unit in _units(messages, counter):
        if unit.tokens > size:
            if window:
                emit()
                window, used = [], 0
            for part, piece in enumerate(split_text(unit.text, size, counter), 1):
                chunks.append(ArchiveChunk(unit.log_id, unit.log_id, piece, _tokens(counter, piece), part))
            continue
        if window and used + unit.tokens > size:
            emit()
            # The next chunk starts with the previous one's newest messages, up to the overlap.
            kept: list[_Unit] = []
            kept_tokens = 0
            for previous in reversed(window):
                if (
                    kept_tokens + previous.tokens > overlap
                    or kept_tokens + previous.tokens + unit.tokens > size
                ):
                    break
                kept.insert(0, previous)
                kept_tokens += previous.tokens
            window, used = kept, kept_tokens
        window.append(unit)
        used += unit.tokens
    if window and not (chunks and chunks[-1].last_id == window[-1].log_id and not chunks[-1].part):
        emit()
    return chunks
