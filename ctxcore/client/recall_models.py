"""The bodies of ``POST .../recall`` (re-exported by ``ctxcore.client.models``)."""

from __future__ import annotations

from pydantic import Field

from ctxcore.client.bodies import RequestBody, ResponseBody

__all__ = ["RecallHit", "RecallRequest", "RecallResponse"]


class RecallRequest(RequestBody):
    """What to look for in the conversation's archive."""

    query: str = Field(min_length=1, description="Words to look for (cut to its first 512 tokens)")
    # 2000 is ``ctxcore.processors.recall_tool.DEFAULT_RECALL_TOKENS``; this module stays
    # importable without the engine.
    max_tokens: int = Field(default=2000, gt=0, description="The most tokens to return")


class RecallHit(ResponseBody):
    """One archived chunk: its log-id range, bm25 score (higher is better) and text."""

    first_id: str
    last_id: str
    part: int = Field(description="0, or the piece of one long message split across chunks")
    range: str
    score: float
    tokens: int
    text: str


class RecallResponse(ResponseBody):
    """At most two chunks within ``max_tokens``; ``note`` says why there are none."""

    hits: list[RecallHit]
    note: str = ""
    query_truncated: bool = False
    archived_chunks: int = 0
