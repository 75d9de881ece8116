"""A conversation's compaction routes: ``POST .../compact``, ``GET .../state`` and
``GET .../offloads/{handle}`` under ``/v1/conversations/{id}``."""

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from ctxcore.client.models import CompactResponse, OffloadResponse, StateResponse
from ctxcore.errors import InvalidKeyError
from ctxcore.messages import to_openai
from ctxcore.state import CompressionState
from ctxcore.state.filesystem import validate_handle
from workers.api_common.errors import not_found
from workers.api_common.state import ApiState
from workers.holds import status_of
from workers.http.compaction_status import detail_out, snapshot_out
from workers.http.dependencies import ConversationId
from workers.http.errors import error_responses
from workers.spend import summariser_cap

__all__ = ["state_router"]


def state_router(api: ApiState, current_tenant: Callable[..., str]) -> APIRouter:
    """The compaction routes over ``api``; ``current_tenant`` is the authenticating dependency."""
    router = APIRouter(tags=["conversations"])
    conv = "/v1/conversations/{conversation_id}"
    Tenant = Annotated[str, Depends(current_tenant)]
    runtime = api.runtime

    @router.post(
        f"{conv}/compact",
        response_model=CompactResponse,
        status_code=202,
        responses=error_responses(401, 404, 422, 429, 503),
    )
    def compact(conversation_id: ConversationId, tenant: Tenant) -> CompactResponse:
        """Ask for a background compaction (coalesced with any already queued or running)."""
        key = api.require(tenant, conversation_id)
        return CompactResponse(status=api.queue.request(key))

    @router.get(
        f"{conv}/state",
        response_model=StateResponse,
        response_model_exclude_unset=True,
        responses=error_responses(401, 404, 422, 429, 503),
    )
    def get_state(
        conversation_id: ConversationId,
        tenant: Tenant,
        history: Annotated[bool, Query(description="Also return the kept versions (newest first)")] = False,
    ) -> StateResponse:
        """The compaction state: summary blocks with provenance, cursor and pinned anchors."""
        key = api.key(tenant, conversation_id)
        state = runtime.state_store.load(key)
        if state is None and runtime.log.last_id(key) is None:
            raise not_found()
        current = snapshot_out(state or CompressionState())
        record = runtime.failures.get(key)
        result = StateResponse(
            **current.model_dump(),
            budget=runtime.state_store.get_budget(key),
            compaction=status_of(
                record,
                backoff_seconds=runtime.settings.worker.no_progress_backoff_seconds,
                cap_tokens=summariser_cap(runtime.settings, key.tenant_id),
            ),
            compaction_detail=detail_out(record.detail),
        )
        if history:
            result.history = [snapshot_out(s) for s in runtime.state_store.history(key)]
        return result

    @router.get(
        f"{conv}/offloads/{{handle}}",
        response_model=OffloadResponse,
        responses=error_responses(401, 404, 422, 429, 503),
    )
    def get_offload(
        conversation_id: ConversationId,
        handle: Annotated[str, Path(description="Offload handle: 8-64 lowercase hex characters")],
        tenant: Tenant,
    ) -> OffloadResponse:
        """The original messages a processor offloaded behind ``handle``."""
        key = api.key(tenant, conversation_id)
        try:
            validate_handle(handle)
        except InvalidKeyError:
            raise not_found("offload") from None
        messages = runtime.offloads.get(key, handle)
        if messages is None:
            raise not_found("offload")
        return OffloadResponse(handle=handle, messages=to_openai(messages, include_extra=True))

    return router
