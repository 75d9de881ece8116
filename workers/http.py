"""The HTTP API over the fast path: ``create_app(runtime, queue)`` builds a FastAPI app.

Serve it with ``uvicorn workers.http:app_from_env --factory`` (``app_from_env`` is the one
place that reads the environment) or ``serve(settings)``. Importing this module reads no
environment and opens no connection.

Routes (``/v1/*`` need ``Authorization: Bearer <token>``; the tenant is looked up by the
token's sha256 in ``http.tokens``):

- ``POST   /v1/conversations/{id}/messages``       append (idempotent by ``message_id``;
  ``If-Match: <last log id>`` -> 409 when the log ends elsewhere); 201, or 200 when every
  message was already logged
- ``POST   /v1/conversations/{id}/window``         the window within ``budget_tokens``, its
  ``tools``, ``compaction`` (``idle|queued|running|failing``) and ``compaction_detail``;
  ``?format=openai`` serves OpenAI keys only
- ``GET    /v1/conversations/{id}/messages``       the raw log, paged (``after``, ``limit``)
- ``DELETE /v1/conversations/{id}/messages?after=`` remove the messages after a log id (409
  ``truncate_refused`` when a compaction covers one, the lock is busy or ``If-Match`` moved)
- ``POST   /v1/conversations/{id}/compact``        ask for background compaction; 202 (a
  ``failing`` conversation is not queued again until its failure backoff passes)
- ``GET    /v1/conversations/{id}/state``          blocks with provenance (``?history=1``)
  and ``compaction_detail`` (the last error, the last success)
- ``GET    /v1/conversations/{id}/offloads/{h}``   offloaded originals
- ``GET    /v1/conversations``                     the tenant's conversations, paged
- ``DELETE /v1/conversations/{id}``                log, state, offloads and queued work; 204
- ``GET    /v1/usage``                             the tenant's summariser calls and tokens
- ``GET    /healthz``, ``GET /metrics``            unauthenticated

Status codes: 401 (no or unknown token, with ``WWW-Authenticate: Bearer``); 403 (tenant's
``max_conversations`` reached by an append that would create one more); 404 for an
unknown conversation, an invalid id and another tenant's conversation alike (byte-identical
bodies: a caller learns nothing about ids it does not own); 409 (``If-Match`` mismatch, with
the log's ``last_id`` and ``ETag``; ``invalid_window`` when the saved state cannot be served
without breaking the chat protocol, naming the violations: roll back; or a compaction
holding the conversation's lock during DELETE); 413 (body over ``http.max_body_bytes``, checked before any parsing); 422 (invalid message,
naming its index and field; ``BudgetExceeded`` with its three sizes; malformed request);
429 (per-tenant token bucket, with ``Retry-After``); 503 (store outage, ``Retry-After: 1``).
Every error body is JSON ``{"error": <code>, "detail": ...}`` plus code-specific fields.
"""

import logging
import time
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Path, Query, Response

from ctxcore import __version__
from ctxcore.client.models import (
    AppendRequest,
    AppendResponse,
    CompactResponse,
    ConversationList,
    ElidedRange,
    OffloadResponse,
    StateResponse,
    UsageResponse,
    WindowFormat,
    WindowRequest,
    WindowResponse,
    WindowStats,
)
from ctxcore.config import Settings
from ctxcore.errors import ConflictError, InvalidKeyError, InvalidMessageError, NotFoundError
from ctxcore.messages import from_openai, to_openai
from ctxcore.state import CompressionState, validate_id
from ctxcore.state.filesystem import validate_handle
from workers.bodylimit import BodyLimitMiddleware
from workers.http_api import ApiState, parse_if_match, tenant_dependency
from workers.http_errors import (
    ApiError,
    error_responses,
    install_error_handlers,
    invalid_message_error,
    not_found,
)
from workers.http_log import log_router
from workers.http_ops import operations_router
from workers.http_recall import recall_router
from workers.http_status import detail_out, snapshot_out
from workers.locks import LockBusy, conversation_lock
from workers.logs import apply_log_format, uvicorn_log_config
from workers.prom_api import RequestMetricsMiddleware
from workers.proxy import proxy_router
from workers.proxy_index import HashIndex
from workers.runtime import Runtime, check_startup
from workers.service import CompactionQueue

__all__ = ["app_from_env", "create_app", "serve"]

log = logging.getLogger(__name__)

ConversationId = Annotated[str, Path(description="Conversation id: 1-128 of letters, digits, '-', '_', '.'")]

# How long DELETE waits for a running compaction stage to release the conversation's lock.
DELETE_LOCK_WAIT_SECONDS = 5.0

# --- the application ---------------------------------------------------------------------


def create_app(runtime: Runtime, queue: CompactionQueue | None = None) -> FastAPI:
    """The HTTP API over ``runtime``'s stores (see the module docstring).

    ``queue`` defaults to ``workers.tasks.CeleryQueue`` (Celery is then configured from
    ``runtime.settings`` so compaction requests reach the configured broker); tests pass an
    ``InlineQueue``.
    """
    if queue is None:
        from workers.app import configure
        from workers.tasks import CeleryQueue

        configure(runtime.settings)
        queue = CeleryQueue()
    api = ApiState(runtime, queue)

    app = FastAPI(
        title="ctxcore",
        version=__version__,
        description="Context engine for LLM agents: append messages, get windows within a token "
        "budget, compact in the background. Authenticate with `Authorization: Bearer <token>`.",
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.http.max_body_bytes)
    # Outermost (added last): a 413 from the body limit is counted too.
    app.add_middleware(RequestMetricsMiddleware, metrics=api.metrics)
    install_error_handlers(app)

    current_tenant = tenant_dependency(api)
    Tenant = Annotated[str, Depends(current_tenant)]
    conv = "/v1/conversations/{conversation_id}"
    app.include_router(log_router(api, current_tenant))
    app.include_router(recall_router(api, current_tenant))
    app.include_router(proxy_router(api))

    @app.post(
        f"{conv}/messages",
        response_model=AppendResponse,
        status_code=201,
        responses={
            200: {"model": AppendResponse, "description": "Every message was already logged (a replay)"},
            **error_responses(401, 403, 404, 409, 413, 422, 429, 503),
        },
        tags=["conversations"],
    )
    def append_messages(
        conversation_id: ConversationId,
        body: AppendRequest,
        response: Response,
        tenant: Tenant,
        if_match: Annotated[
            str | None, Header(alias="If-Match", description="The log id the log must end at (else 409)")
        ] = None,
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
        expected = parse_if_match(if_match)
        previous = runtime.log.last_id(key)
        if expected == "*":
            # RFC 9110: "*" matches any current representation, i.e. the conversation exists.
            if previous is None:
                raise ApiError(409, "conflict", "If-Match: * but the conversation does not exist")
            expected = None
        if previous is None and expected is None:
            api.check_conversation_limit(tenant)
        try:
            ids = api.service.append(key, messages, expected_last_id=expected)
        except ConflictError as exc:
            # The last id the atomic check saw: no second read that could see a later one.
            last = exc.last_id
            raise ApiError(
                409,
                "conflict",
                f"If-Match {expected!r} does not match the log's last id {last!r}",
                headers={"ETag": f'"{last}"'} if last else None,
                last_id=last,
            ) from exc
        # Under concurrent appends the max of our ids is the id our writes end at: a client
        # sending it as If-Match gets 409 if someone else appended after us, as it should.
        last_id = max(ids) if ids else previous
        if previous is not None and all(i <= previous for i in ids):
            response.status_code = 200  # nothing new: an idempotent replay
        if last_id is not None:
            response.headers["ETag"] = f'"{last_id}"'
        return AppendResponse(ids=ids, last_id=last_id)

    @app.post(
        f"{conv}/window",
        response_model=WindowResponse,
        responses=error_responses(401, 404, 409, 413, 422, 429, 503),
        tags=["conversations"],
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
    ) -> WindowResponse:
        """The window to send to the model: system messages first, within ``budget_tokens``,
        and ``tools``, exactly the tools the budget counted.

        Never calls a model; asks for background compaction when the conversation is over
        its trigger. 422 ``budget_exceeded`` when system + tools + anchors alone do not fit;
        409 ``invalid_window`` (with the violations) when the saved state cannot be served
        without breaking the chat protocol: roll the conversation back.
        """
        key = api.key(tenant, conversation_id)
        try:
            system = from_openai(body.system_messages)
        except InvalidMessageError as exc:
            raise invalid_message_error(exc, "system_messages") from None
        started = time.perf_counter()
        try:
            # The existence check is part of the window's read (one script call on Redis).
            budget = body.budget_tokens or runtime.settings.budget_for_tenant(key.tenant_id)
            result = api.service.get_window(
                key, budget, system, body.tools, body.model, require_existing=True
            )
        except InvalidMessageError as exc:
            raise invalid_message_error(exc, "system_messages") from None
        except NotFoundError:
            raise not_found() from None
        # In-process (no store round trip): cheap enough to record before answering.
        api.metrics.window_served(time.perf_counter() - started, result.fallback_applied)
        return WindowResponse(
            messages=to_openai(result.messages, include_extra=format == "ctxcore"),
            tools=result.tools,
            stats=WindowStats(**result.stats.as_dict()),
            state_version=result.state_version,
            compaction=result.compaction,
            compaction_detail=detail_out(result.compaction_detail),
            fallback_applied=result.fallback_applied,
            elided_ranges=[ElidedRange(first_id=a, last_id=b) for a, b in result.elided_ranges],
        )

    @app.post(
        f"{conv}/compact",
        response_model=CompactResponse,
        status_code=202,
        responses=error_responses(401, 404, 429, 503),
        tags=["conversations"],
    )
    def compact(conversation_id: ConversationId, tenant: Tenant) -> CompactResponse:
        """Ask for a background compaction (coalesced with any already queued or running)."""
        key = api.require(tenant, conversation_id)
        return CompactResponse(status=api.queue.request(key))

    @app.get(
        f"{conv}/state",
        response_model=StateResponse,
        response_model_exclude_unset=True,
        responses=error_responses(401, 404, 429, 503),
        tags=["conversations"],
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
        result = StateResponse(
            **current.model_dump(),
            budget=runtime.state_store.get_budget(key),
            compaction_detail=detail_out(runtime.failures.detail(key)),
        )
        if history:
            result.history = [snapshot_out(s) for s in runtime.state_store.history(key)]
        return result

    @app.get(
        f"{conv}/offloads/{{handle}}",
        response_model=OffloadResponse,
        responses=error_responses(401, 404, 429, 503),
        tags=["conversations"],
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

    @app.get(
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
        page = runtime.log.list_conversations(tenant, after, limit)
        return ConversationList(conversations=page, next=page[-1] if len(page) == limit else None)

    @app.delete(
        conv,
        status_code=204,
        response_class=Response,
        responses=error_responses(401, 404, 409, 429, 503),
        tags=["conversations"],
    )
    def delete_conversation(conversation_id: ConversationId, tenant: Tenant) -> Response:
        """Delete the conversation: queued work, offloads, state, then the log."""
        key = api.require(tenant, conversation_id)
        settings = runtime.settings
        deadline = time.monotonic() + DELETE_LOCK_WAIT_SECONDS
        while True:
            try:
                # Under the conversation's lock a running stage cannot save a state (and so
                # resurrect the conversation) between our deletes.
                with conversation_lock(
                    runtime.redis, settings.redis.key_prefix, key, settings.worker.lock_timeout
                ):
                    scheduler = getattr(runtime, "scheduler", None)
                    if scheduler is not None:
                        scheduler.forget(key)
                    runtime.offloads.delete(key)
                    runtime.state_store.delete(key)
                    runtime.failures.delete(key)
                    HashIndex(runtime.redis, settings.redis.key_prefix).delete(key)  # the proxy's
                    # The log goes last: if anything above fails, the conversation still
                    # exists and the DELETE can simply be retried.
                    runtime.log.delete(key)
                break
            except LockBusy:
                if time.monotonic() >= deadline:
                    raise ApiError(
                        409,
                        "conversation_busy",
                        "a compaction of this conversation is running; retry shortly",
                        headers={"Retry-After": "1"},
                    ) from None
                time.sleep(0.05)
        return Response(status_code=204)

    @app.get(
        "/v1/usage", response_model=UsageResponse, responses=error_responses(401, 429, 503), tags=["tenant"]
    )
    def usage(tenant: Tenant) -> UsageResponse:
        """Summariser calls and tokens spent on the tenant's conversations."""
        return UsageResponse(tenant=tenant, **runtime.usage.of(tenant))

    app.include_router(operations_router(runtime, api.metrics))
    return app


def app_from_env() -> FastAPI:
    """The app configured from ``CTXCORE_*`` (for ``uvicorn workers.http:app_from_env --factory``)."""
    settings = Settings.from_env()
    apply_log_format(settings)  # uvicorn configured its logging before calling the factory
    check_startup(settings)
    return create_app(Runtime(settings))


def serve(settings: Settings, *, log_level: str = "info") -> None:
    """Run the API with uvicorn on ``http.host:http.port`` (the CLI's ``ctxcore serve``)."""
    import uvicorn

    app, log_config = create_app(Runtime(settings)), uvicorn_log_config(settings)
    uvicorn.run(
        app, host=settings.http.host, port=settings.http.port, log_level=log_level, log_config=log_config
    )
