"""``POST /v1/conversations/{id}/recall``: search what compaction folded in a conversation.

The tenant comes from the bearer token, so another tenant's conversation is a 404 like an
unknown one. Recall off: 409 ``recall_disabled`` naming the setting; an empty query or
``max_tokens`` below 1: 422; a store outage: 503.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations at
# definition time, and the tenant dependency is a value passed in by ``create_app``.
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends

from ctxcore.client.models import RecallHit, RecallRequest, RecallResponse
from workers.api_common.state import ApiState
from workers.http.dependencies import ConversationId
from workers.http.errors import error_responses

__all__ = ["recall_router"]


def recall_router(api: ApiState, current_tenant: Callable[..., str]) -> APIRouter:
    """The recall route over ``api``; ``current_tenant`` is the authenticating dependency."""
    router = APIRouter(tags=["conversations"])
    Tenant = Annotated[str, Depends(current_tenant)]

    @router.post(
        "/v1/conversations/{conversation_id}/recall",
        response_model=RecallResponse,
        responses=error_responses(401, 404, 409, 422, 429, 503),
    )
    def recall_route(conversation_id: ConversationId, body: RecallRequest, tenant: Tenant) -> RecallResponse:
        """Search the originals that this conversation's summary blocks replaced.

        Blocks whose range is archived end with ``[[COMPRESSION_RECALL: id=<first>-<last>]]``;
        the window's tools carry ``recall_compressed_context`` while recall is on, and an
        agent answers its calls with this route.
        """
        key = api.require(tenant, conversation_id)
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

    return router
