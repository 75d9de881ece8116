"""The tenant's routes: ``GET /v1/conversations`` (paged ids), ``DELETE
/v1/conversations/{id}`` and ``GET /v1/usage``."""

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from ctxcore.client.models import ConversationList, UsageResponse
from ctxcore.errors import InvalidKeyError
from ctxcore.state import validate_id
from workers.api_common.errors import ApiError
from workers.api_common.state import ApiState
from workers.delete import delete_conversation as delete_everything
from workers.http.dependencies import ConversationId
from workers.http.errors import error_responses
from workers.spend import summariser_cap

__all__ = ["conversations_router"]


def conversations_router(api: ApiState, current_tenant: Callable[..., str]) -> APIRouter:
    """The tenant's routes over ``api``; ``current_tenant`` is the authenticating dependency."""
    router = APIRouter()
    Tenant = Annotated[str, Depends(current_tenant)]

    @router.get(
        "/v1/conversations",
        response_model=ConversationList,
        responses=error_responses(401, 422, 429, 503),
        tags=["conversations"],
    )
    def list_conversations(
        tenant: Tenant,
        after: Annotated[
            str | None, Query(max_length=128, description="Return ids after this one (the previous next)")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> ConversationList:
        """The tenant's conversation ids in id order, one page at a time."""
        if after is not None:
            try:
                validate_id(after, "after")
            except InvalidKeyError as exc:
                raise ApiError(422, "invalid_request", str(exc)) from None
        page = api.runtime.log.list_conversations(tenant, after, limit)
        return ConversationList(conversations=page, next=page[-1] if len(page) == limit else None)

    @router.delete(
        "/v1/conversations/{conversation_id}",
        status_code=204,
        response_class=Response,
        responses=error_responses(401, 404, 409, 422, 429, 503),
        tags=["conversations"],
    )
    # The name is the OpenAPI operation id's stem: kept as it was published.
    def delete_conversation(conversation_id: ConversationId, tenant: Tenant) -> Response:
        """Delete the conversation: queued work, offloads, state, then the log."""
        delete_everything(api.runtime, api.require(tenant, conversation_id))
        return Response(status_code=204)

    @router.get(
        "/v1/usage", response_model=UsageResponse, responses=error_responses(401, 429, 503), tags=["tenant"]
    )
    def usage(tenant: Tenant) -> UsageResponse:
        """Summariser calls and tokens spent on the tenant's conversations."""
        day, used = api.runtime.spend.used(tenant)
        return UsageResponse(
            tenant=tenant,
            **api.runtime.usage.of(tenant),
            day=day,
            summariser_tokens_today=used,
            summariser_tokens_per_day=summariser_cap(api.runtime.settings, tenant),
        )

    return router
