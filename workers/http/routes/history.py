"""A conversation's history routes: ``GET .../journal`` (the stage journal) and
``POST .../rollback`` (a kept state version made current again, as ``ctxcore rollback``)."""

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from ctxcore.client.models import JournalEntryOut, JournalResponse, RollbackRequest, RollbackResponse
from ctxcore.state.journal import JOURNAL_LIMIT
from workers.api_common.state import ApiState
from workers.http.dependencies import ConversationId
from workers.http.errors import error_responses
from workers.rollback import rollback_conversation

__all__ = ["history_router"]


def history_router(api: ApiState, current_tenant: Callable[..., str]) -> APIRouter:
    """The history routes over ``api``; ``current_tenant`` is the authenticating dependency."""
    router = APIRouter(tags=["conversations"])
    conv = "/v1/conversations/{conversation_id}"
    Tenant = Annotated[str, Depends(current_tenant)]
    runtime = api.runtime

    @router.get(
        f"{conv}/journal", response_model=JournalResponse, responses=error_responses(401, 404, 422, 429, 503)
    )
    def get_journal(
        conversation_id: ConversationId,
        tenant: Tenant,
        limit: Annotated[
            int, Query(ge=1, le=JOURNAL_LIMIT, description="Entries to return, newest first")
        ] = JOURNAL_LIMIT,
    ) -> JournalResponse:
        """What each compaction stage run did (outcome, tokens before and after, summariser
        calls and tokens, duration, error, version saved) and each rollback, newest first;
        the newest 200 are kept."""
        key = api.require(tenant, conversation_id)
        return JournalResponse(
            entries=[JournalEntryOut(**e.as_dict()) for e in runtime.journal.entries(key, limit)]
        )

    @router.post(
        f"{conv}/rollback",
        response_model=RollbackResponse,
        responses=error_responses(401, 404, 409, 422, 429, 503),
    )
    def rollback(conversation_id: ConversationId, body: RollbackRequest, tenant: Tenant) -> RollbackResponse:
        """Make a kept state version current again, as a new version (``ctxcore rollback``);
        written to the journal. 409 ``version_not_kept`` (with the kept versions) for a
        version no longer kept, ``conversation_busy`` while a stage holds the conversation:
        nothing is changed. 404 when the conversation has no saved state."""
        key = api.require(tenant, conversation_id)
        done = rollback_conversation(runtime, key, body.version)
        return RollbackResponse(restored=done.restored, version=done.version)

    return router
