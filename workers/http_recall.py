"""``POST /v1/conversations/{id}/recall``: search what compaction folded in a conversation.

Mounted by ``workers.http.create_app``. The tenant comes from the bearer token, so another
tenant's conversation is a 404 like an unknown one. Recall off: 409 ``recall_disabled``
naming the setting; an empty query or ``max_tokens`` below 1: 422; a store outage: 503.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations at
# definition time, and the tenant dependency is a value passed in by ``create_app``.
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ctxcore.errors import RecallDisabled
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS

__all__ = ["RecallHit", "RecallRequest", "RecallResponse", "install_recall_route"]


class RecallRequest(BaseModel):
    """What to look for."""

    model_config = {"extra": "forbid"}
    query: str = Field(min_length=1, description="Words to look for (cut to its first 512 tokens)")
    max_tokens: int = Field(default=DEFAULT_RECALL_TOKENS, gt=0, description="The most tokens to return")


class RecallHit(BaseModel):
    """One archived chunk: its log-id range, bm25 score (higher is better) and text."""

    first_id: str
    last_id: str
    part: int = Field(description="0, or the piece of one long message split across chunks")
    range: str
    score: float
    tokens: int
    text: str


class RecallResponse(BaseModel):
    """At most two chunks within ``max_tokens``; ``note`` says why there are none."""

    hits: list[RecallHit]
    note: str = ""
    query_truncated: bool = False
    archived_chunks: int = 0


def _disabled(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RecallDisabled)
    return JSONResponse(
        {"error": "recall_disabled", "detail": str(exc), "setting": exc.setting}, status_code=409
    )


def install_recall_route(
    app: FastAPI, api: Any, tenant: Any, prefix: str, responses: dict[int | str, Any]
) -> None:
    """Add the route to ``app`` (``api`` is the app's ``_Api``, ``tenant`` its auth dependency)."""
    app.add_exception_handler(RecallDisabled, _disabled)

    @app.post(f"{prefix}/recall", response_model=RecallResponse, responses=responses, tags=["conversations"])
    # The dependency is a runtime Annotated value, which mypy cannot take as a type.
    def recall_route(conversation_id: str, body: RecallRequest, tenant_id: tenant) -> RecallResponse:  # type: ignore[valid-type]
        """Search the originals that this conversation's summary blocks replaced.

        Blocks whose range is archived end with ``[[COMPRESSION_RECALL: id=<first>-<last>]]``;
        the window's tools carry ``recall_compressed_context`` while recall is on, and an
        agent answers its calls with this route.
        """
        key = api.require(tenant_id, conversation_id)
        answer = api.service.recall(key, body.query, body.max_tokens)
        return RecallResponse(
            hits=[
                RecallHit(
                    first_id=h.first_id,
                    last_id=h.last_id,
                    part=h.part,
                    range=h.range_id,
                    score=round(h.score, 4),
                    tokens=h.tokens,
                    text=h.text,
                )
                for h in answer.hits
            ],
            note=answer.note,
            query_truncated=answer.query_truncated,
            archived_chunks=answer.archived_chunks,
        )
