"""The raw log's routes on ``/v1/conversations/{id}/messages``: ``POST`` (append), ``GET``
(paged read) and ``DELETE`` (truncate)."""

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from ctxcore.client.models import (
    AppendRequest,
    AppendResponse,
    MessagesPage,
    TruncateResponse,
    UndecodableEntry,
)
from ctxcore.errors import InvalidKeyError, InvalidMessageError
from ctxcore.messages import from_openai, to_openai
from ctxcore.state.base import parse_log_id
from ctxcore.state.undecodable import UNDECODABLE_KEY, is_undecodable
from workers.api_common.errors import ApiError, invalid_message_error
from workers.api_common.state import ApiState
from workers.http.dependencies import ConversationId, IfMatch, parse_if_match
from workers.http.errors import error_responses
from workers.telemetry.spans import append_span, describe_append
from workers.truncate import truncate_conversation

__all__ = ["log_router"]


def _log_id(value: str, name: str) -> str:
    try:
        parse_log_id(value)
    except InvalidKeyError as exc:
        raise ApiError(422, "invalid_request", f"{name}: {exc}") from None
    return value


def log_router(api: ApiState, current_tenant: Callable[..., str]) -> APIRouter:
    """The log routes over ``api``; ``current_tenant`` is the authenticating dependency."""
    router = APIRouter(tags=["conversations"])
    conv = "/v1/conversations/{conversation_id}"
    Tenant = Annotated[str, Depends(current_tenant)]

    @router.post(
        f"{conv}/messages",
        response_model=AppendResponse,
        status_code=201,
        responses={
            200: {"model": AppendResponse, "description": "Every message was already logged (a replay)"},
            **error_responses(401, 403, 404, 409, 413, 422, 429, 503),
        },
    )
    def append_messages(
        conversation_id: ConversationId,
        body: AppendRequest,
        response: Response,
        tenant: Tenant,
        if_match: IfMatch = None,
    ) -> AppendResponse:
        """Append messages to the conversation's log (creating it).

        A message whose ``message_id`` is already logged is not appended again: it gets its
        existing log id back, so retries are safe.
        """
        key = api.key(tenant, conversation_id)
        try:
            messages = from_openai(body.messages)
        except InvalidMessageError as exc:
            raise invalid_message_error(exc, "messages") from None
        with append_span(api.runtime.tracer, key, len(messages)) as span:
            outcome = api.service.append_if_match(key, messages, parse_if_match(if_match))
            describe_append(span, outcome.ids, outcome.replay)
        if outcome.replay:
            response.status_code = 200  # nothing new: an idempotent replay
        if outcome.last_id is not None:
            response.headers["ETag"] = f'"{outcome.last_id}"'
        return AppendResponse(ids=outcome.ids, last_id=outcome.last_id)

    @router.get(
        f"{conv}/messages", response_model=MessagesPage, responses=error_responses(401, 404, 422, 429, 503)
    )
    def read_messages(
        conversation_id: ConversationId,
        tenant: Tenant,
        after: Annotated[str | None, Query(description="Return messages after this log id")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> MessagesPage:
        """The raw log (never compacted), oldest first, with each message's ``context_message_id``;
        entries that no longer decode are listed in ``undecodable`` with their ids."""
        key = api.require(tenant, conversation_id)
        cursor = _log_id(after, "after") if after is not None else None
        page = api.runtime.log.read_after(key, cursor, limit)
        last = page[-1].context_message_id if len(page) == limit else None
        lost = [
            UndecodableEntry(id=m.context_message_id or "", detail=str(m.metadata[UNDECODABLE_KEY]))
            for m in page
            if is_undecodable(m)
        ]
        readable = [m for m in page if not is_undecodable(m)] if lost else page
        return MessagesPage(messages=to_openai(readable, include_extra=True), next=last, undecodable=lost)

    @router.delete(
        f"{conv}/messages",
        response_model=TruncateResponse,
        responses=error_responses(401, 404, 409, 422, 429, 503),
    )
    def truncate_messages(
        conversation_id: ConversationId,
        tenant: Tenant,
        after: Annotated[str, Query(description="Keep the log up to this log id, remove what follows")],
        if_match: IfMatch = None,
    ) -> TruncateResponse:
        """Remove the messages after ``after`` (the log's one exception to append-only).

        409 ``truncate_refused`` with ``reason``: ``covered`` when a compaction summarised or
        pinned one of them, ``busy`` when a compaction holds the conversation, ``moved`` when
        the log does not end at ``If-Match``. Removed ids are never reused.
        """
        key = api.require(tenant, conversation_id)
        removed = truncate_conversation(
            api.runtime, key, _log_id(after, "after"), expected_last_id=parse_if_match(if_match)
        )
        return TruncateResponse(removed=removed, last_id=api.runtime.log.last_id(key))

    return router
