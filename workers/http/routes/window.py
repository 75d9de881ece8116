"""``POST /v1/conversations/{id}/window``: the window to send to the model."""

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from ctxcore.client.models import ElidedRange, WindowFormat, WindowRequest, WindowResponse, WindowStats
from ctxcore.contract import check_messages_contract, check_tools
from ctxcore.errors import InvalidMessageError, NotFoundError
from ctxcore.messages import from_openai, to_openai
from workers.api_common.errors import invalid_message_error, not_found
from workers.api_common.state import ApiState
from workers.http.compaction_status import detail_out
from workers.http.dependencies import ConversationId
from workers.http.errors import error_responses
from workers.telemetry.spans import describe_window, window_span

__all__ = ["window_router"]


def window_router(api: ApiState, current_tenant: Callable[..., str]) -> APIRouter:
    """The window route over ``api``; ``current_tenant`` is the authenticating dependency."""
    router = APIRouter(tags=["conversations"])
    Tenant = Annotated[str, Depends(current_tenant)]

    @router.post(
        "/v1/conversations/{conversation_id}/window",
        response_model=WindowResponse,
        responses=error_responses(401, 404, 409, 413, 422, 429, 503),
    )
    def get_window(
        conversation_id: ConversationId,
        body: WindowRequest,
        tenant: Tenant,
        format: Annotated[
            WindowFormat,
            Query(
                description="openai: messages with OpenAI keys only (ready to send); ctxcore: with log ids"
            ),
        ] = "ctxcore",
        preview: Annotated[
            bool,
            Query(
                description="Only look: the budget is not recorded and no compaction is asked for, "
                "whatever the budget (an inspector's view)"
            ),
        ] = False,
    ) -> Response:
        """The window to send to the model: system messages first, within ``budget_tokens``,
        and ``tools``, exactly the tools the budget counted.

        Never calls a model; asks for background compaction when the conversation is over
        its trigger. 422 ``budget_exceeded`` when system + tools + anchors alone do not fit;
        409 ``invalid_window`` (with the violations) when the saved state cannot be served
        without breaking the chat protocol: roll the conversation back. ``?preview=true``
        returns the window at any budget and records nothing.
        """
        key = api.key(tenant, conversation_id)
        try:
            system = from_openai(body.system_messages)
            check_messages_contract(system, stored=False)
        except InvalidMessageError as exc:
            raise invalid_message_error(exc, "system_messages") from None
        try:
            check_tools(body.tools)
        except InvalidMessageError as exc:
            raise invalid_message_error(exc, "tools") from None
        started = time.perf_counter()
        budget_tokens = body.budget_tokens
        if budget_tokens is None:
            budget_tokens = api.settings.budget_for_tenant(key.tenant_id)
        try:
            # The existence check is part of the window's read (one script call on Redis).
            with window_span(api.runtime.tracer, key, budget_tokens, "api") as span:
                result = api.service.get_window(
                    key, budget_tokens, system, body.tools, body.model, require_existing=True, preview=preview
                )
                describe_window(span, result)
        except InvalidMessageError as exc:
            raise invalid_message_error(exc, "system_messages") from None
        except NotFoundError:
            raise not_found() from None
        if not preview:  # the windows agents are served, not an inspector's looks
            # In-process (no store round trip): cheap enough to record before answering.
            api.metrics.window_served(time.perf_counter() - started, result.fallback_applied)
        response = WindowResponse(
            messages=to_openai(result.messages, include_extra=format == "ctxcore"),
            tools=result.tools,
            stats=WindowStats(**result.stats.as_dict()),
            state_version=result.state_version,
            compaction=result.compaction,
            compaction_detail=detail_out(result.compaction_detail),
            fallback_applied=result.fallback_applied,
            elided_ranges=[ElidedRange(first_id=a, last_id=b) for a, b in result.elided_ranges],
        )
        # Serialised here in one pass: returned as a model, FastAPI validates it again, dumps
        # it to Python and then to JSON (4x the time of model_dump_json, bench/README).
        return Response(response.model_dump_json(), media_type="application/json")

    return router
