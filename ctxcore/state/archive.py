"""What the stores keep of a conversation's recall archive: chunks and the index bytes.

The archive is written by the same atomic save as the state it belongs to
(``StateStore.save(..., archive=...)``): a lost race writes neither. Chunks are keyed by
their log-id range (``chunk_id``), so a chunk written twice is one chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["ArchiveChunk", "ArchiveWrite", "decode_chunk", "encode_chunk"]


@dataclass(frozen=True)
class ArchiveChunk:
    """Serialised messages of one log-id range (``part`` > 0: a piece of one long message)."""

    first_id: str
    last_id: str
    text: str
    tokens: int
    part: int = 0

    @property
    def chunk_id(self) -> str:
        """``<first>-<last>``, with ``:<part>`` for a piece of a split message."""
        base = f"{self.first_id}-{self.last_id}"
        return f"{base}:{self.part}" if self.part else base


@dataclass(frozen=True)
class ArchiveWrite:
    """What to store beside a state, atomically with it: the new chunks and the whole index."""

    chunks: tuple[ArchiveChunk, ...]
    index: bytes
    version: int


def encode_chunk(chunk: ArchiveChunk) -> str:
    """The chunk as stored (JSON)."""
    return json.dumps(
        {
            "first_id": chunk.first_id,
            "last_id": chunk.last_id,
            "part": chunk.part,
            "tokens": chunk.tokens,
            "text": chunk.text,
        },
        ensure_ascii=False,
    )


def decode_chunk(data: str | bytes) -> ArchiveChunk:
    """Inverse of ``encode_chunk``."""
    raw = json.loads(data)
    return ArchiveChunk(
        str(raw["first_id"]), str(raw["last_id"]), str(raw["text"]), int(raw["tokens"]), int(raw["part"])
    )
