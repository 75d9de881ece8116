"""The HTTP API over the fast path: ``create_app(runtime, queue)`` builds a FastAPI app.

Serve it with ``uvicorn workers.http:app_from_env --factory`` (``app_from_env`` is the one
place that reads the environment) or ``serve(settings)``. Importing this module reads no
environment and opens no connection.

Routes (``/v1/*`` need ``Authorization: Bearer <token>``; the tenant is looked up by the
token's sha256 in ``http.tokens``):

- ``POST   /v1/conversations/{id}/messages``       append (idempotent by ``message_id``;
  ``If-Match: <last log id>`` -> 409 when the log ends elsewhere); 201, or 200 when every
  message was already logged
- ``POST   /v1/conversations/{id}/window``         the window within ``budget_tokens``, with
  ``compaction`` (``idle|queued|running|failing``) and ``compaction_detail``
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
unknown conversation, **an invalid conversation id** and another tenant's conversation
alike (the body is byte-identical, so a caller learns nothing about ids it does not own;
an invalid id cannot name an existing conversation, so 404 is also simply true); 409
(``If-Match`` mismatch, with the log's ``last_id`` and ``ETag``; ``invalid_window`` when the saved
state cannot be served without breaking the chat protocol, naming the violations: roll back;
or a compaction holding the conversation's lock during DELETE);
413 (body over ``http.max_body_bytes``, checked before any parsing); 422 (invalid message,
naming its index and field; ``BudgetExceeded`` with its three sizes; malformed request);
429 (per-tenant token bucket, with ``Retry-After``); 503 (store outage, ``Retry-After: 1``).
Every error body is JSON ``{"error": <code>, "detail": ...}`` plus code-specific fields.
"""

import hmac
import logging
import time
from datetime import datetime
from threading import Lock
from typing import Annotated, Any, Literal

import redis
from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from sqlalchemy.exc import OperationalError as SqlOperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ctxcore import __version__
from ctxcore.config import Settings, hash_token
from ctxcore.errors import (
    BudgetExceeded,
    ConflictError,
    InvalidKeyError,
    InvalidMessageError,
    InvalidWindowError,
    StoreUnavailable,
)
from ctxcore.messages import from_openai, message_text, to_openai
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock, validate_id
from ctxcore.state.filesystem import validate_handle
from workers.bodylimit import BodyLimitMiddleware
from workers.http_recall import install_recall_route
from workers.http_status import CompactionDetailOut, CompactionStatusOut, detail_out
from workers.locks import LockBusy, conversation_lock
from workers.ratelimit import RateLimiter
from workers.runtime import Runtime, build_service
from workers.service import CompactionQueue, ContextService

__all__ = ["app_from_env", "create_app", "serve"]

log = logging.getLogger(__name__)

# How long DELETE waits for a running compaction stage to release the conversation's lock.
DELETE_LOCK_WAIT_SECONDS = 5.0

# --- request and response models (they are also the published OpenAPI schemas) ------------

# Messages are validated by ``ctxcore.messages.from_openai`` (which names the index and field
# of the first problem), not by pydantic: the schema below documents them for OpenAPI only.
_MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "ChatMessage",
    "description": "An OpenAI chat-format message. ctxcore extension keys: message_id "
    "(deduplicates appends), metadata, context_message_id (the log id, in responses). Other "
    "keys are kept and returned.",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
                {"type": "null"},
            ]
        },
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "message_id": {"type": "string"},
        "context_message_id": {"type": "string"},
        "metadata": {"type": "object"},
    },
    "additionalProperties": True,
}
MessageIn = Annotated[Any, WithJsonSchema(_MESSAGE_SCHEMA)]
MessageOut = Annotated[dict[str, Any], WithJsonSchema(_MESSAGE_SCHEMA)]
ConversationId = Annotated[str, Path(description="Conversation id: 1-128 of letters, digits, '-', '_', '.'")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AppendRequest(_Model):
    """Messages to append, in OpenAI chat format (system messages are rejected)."""

    messages: list[MessageIn] = Field(min_length=1)


class AppendResponse(_Model):
    """The log ids of the messages (existing ids for duplicates) and the id to send as If-Match."""

    ids: list[str]
    last_id: str | None


class WindowRequest(_Model):
    """What the model will be called with besides the conversation."""

    # Bounded: the budget is stored beside the state (a BIGINT column on SQL backends) and
    # no model has a billion-token window.
    budget_tokens: int = Field(
        gt=0, le=1_000_000_000, description="Token budget of the whole request (system + tools + messages)"
    )
    model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:/-]{1,128}$",
        description="Model name choosing the tokenizer (default: the configured one)",
    )
    system_messages: list[MessageIn] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)


class WindowStats(_Model):
    """Message and token counts of the served window."""

    total_messages: int
    total_tokens: int
    total_dialogues: int
    system_messages: int
    user_messages: int
    assistant_messages: int
    tool_messages: int
    tools: int
    system_message_tokens: int
    user_message_tokens: int
    assistant_message_tokens: int
    tool_message_tokens: int
    tool_tokens: int


class ElidedRange(_Model):
    """Log ids of tail messages the fast-path fallback left out of this window."""

    first_id: str
    last_id: str


class WindowResponse(_Model):
    """The window to send to the model and how it was made."""

    messages: list[MessageOut]
    stats: WindowStats
    state_version: int
    compaction: CompactionStatusOut
    compaction_detail: CompactionDetailOut
    fallback_applied: bool
    elided_ranges: list[ElidedRange] = Field(default_factory=list)


class CompactResponse(_Model):
    """The conversation's compaction status after the request."""

    status: CompactionStatusOut


class BlockOut(_Model):
    """A summary block and its provenance (the log-id range it stands for)."""

    block_id: str
    first_id: str
    last_id: str
    level: int
    tokens_before: int
    tokens_after: int
    model: str
    created_at: datetime
    text: str


class StateSnapshot(_Model):
    """One version of a conversation's compaction state."""

    version: int
    covered_until: str | None
    pinned: list[str]
    blocks: list[BlockOut]


class StateResponse(StateSnapshot):
    """The current compaction state, the budget last asked for and (``?history=1``) kept versions."""

    budget: int | None
    compaction_detail: CompactionDetailOut
    history: list[StateSnapshot] | None = Field(
        default=None, description="Kept versions, newest first (only with ?history=1)"
    )


class OffloadResponse(_Model):
    """Original messages kept behind an offload handle."""

    handle: str
    messages: list[MessageOut]


class ConversationList(_Model):
    """A page of conversation ids; pass ``next`` as ``after`` for the following page."""

    conversations: list[str]
    next: str | None


class UsageResponse(_Model):
    """Summariser calls and tokens spent on the tenant's conversations."""

    tenant: str
    calls: int
    input_tokens: int
    output_tokens: int


class HealthResponse(_Model):
    """``ok`` when Redis answers."""

    status: Literal["ok", "unavailable"]


class ErrorBody(BaseModel):
    """Every error: a code and a human-readable detail, plus fields specific to the code."""

    error: str = Field(description="Machine-readable code, e.g. not_found, invalid_message, rate_limited")
    detail: str | list[dict[str, Any]]
    index: int | None = Field(default=None, description="invalid_message: index of the bad message")
    field: str | None = Field(default=None, description="invalid_message: the offending field")
    location: str | None = Field(default=None, description="invalid_message: messages or system_messages")
    budget: int | None = Field(default=None, description="budget_exceeded: the budget asked for")
    system_tokens: int | None = None
    tools_tokens: int | None = None
    anchor_tokens: int | None = None
    last_id: str | None = Field(default=None, description="conflict: the log's actual last id")
    state_version: int | None = Field(default=None, description="invalid_window: the state served")
    violations: list[dict[str, Any]] | None = Field(
        default=None, description="invalid_window: the protocol violations (index, rule, detail)"
    )


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "Malformed request",
        401: "Missing or unknown bearer token",
        403: "The tenant's conversation limit is reached",
        404: "No such conversation (or not this tenant's)",
        409: "If-Match does not match the log, the conversation is busy, or its state cannot be served",
        413: "Request body too large",
        422: "Invalid message, budget exceeded or malformed body",
        429: "Rate limited (see Retry-After)",
        503: "A store is unavailable (see Retry-After)",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


# --- errors ------------------------------------------------------------------------------


class ApiError(Exception):
    """An error response: status, code, detail, extra body fields and headers."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        return JSONResponse(
            {"error": self.error, "detail": self.detail, **self.extra},
            status_code=self.status,
            headers=self.headers,
        )


def _not_found(what: str = "conversation") -> ApiError:
    # The same body for unknown, invalid and foreign ids: nothing is revealed.
    return ApiError(404, "not_found", f"{what} not found")


def _invalid_message(exc: InvalidMessageError, location: str) -> ApiError:
    return ApiError(422, "invalid_message", exc.detail, index=exc.index, field=exc.field, location=location)


def _unavailable() -> JSONResponse:
    # Internal addresses and driver messages stay in the log, not in the response.
    return JSONResponse(
        {"error": "store_unavailable", "detail": "a store is unavailable; retry later"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def invalid_message(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidMessageError)
        return _invalid_message(exc, "messages").response()

    async def budget_exceeded(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BudgetExceeded)
        return ApiError(
            422,
            "budget_exceeded",
            str(exc),
            budget=exc.budget,
            system_tokens=exc.system_tokens,
            tools_tokens=exc.tools_tokens,
            anchor_tokens=exc.anchor_tokens,
        ).response()

    async def conflict(_: Request, exc: Exception) -> JSONResponse:
        return ApiError(409, "conflict", str(exc)).response()

    async def invalid_window(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InvalidWindowError)
        log.warning("not serving an invalid window: %s", exc)
        violations = [{"index": v.index, "rule": v.rule, "detail": v.detail} for v in exc.violations]
        return ApiError(
            409, "invalid_window", str(exc), state_version=exc.state_version, violations=violations
        ).response()

    async def invalid_key(_: Request, exc: Exception) -> JSONResponse:
        return _not_found().response()

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("store unavailable during %s %s: %s", request.method, request.url.path, exc)
        return _unavailable()

    async def invalid_request(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        # Without "input": a validation error must not echo a (possibly large) body back.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return JSONResponse({"error": "invalid_request", "detail": errors}, status_code=422)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        # Unmatched routes (e.g. an id holding an encoded "/") and wrong methods: the same
        # {"error", "detail"} shape as every other error, not the framework's default body.
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(InvalidMessageError, invalid_message)
    app.add_exception_handler(BudgetExceeded, budget_exceeded)
    app.add_exception_handler(ConflictError, conflict)
    app.add_exception_handler(InvalidWindowError, invalid_window)
    app.add_exception_handler(InvalidKeyError, invalid_key)
    app.add_exception_handler(RequestValidationError, invalid_request)
    for kind in (
        StoreUnavailable,
        redis.ConnectionError,
        redis.TimeoutError,
        SqlOperationalError,
        SqlTimeoutError,
    ):
        app.add_exception_handler(kind, unavailable)


# --- the application ---------------------------------------------------------------------


class _Api:
    """The state routes share: runtime, queue, the lazily built service and rate limiter."""

    def __init__(self, runtime: Runtime, queue: CompactionQueue) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.queue = queue
        self._service: ContextService | None = None
        self._limiter: RateLimiter | None = None
        self._lock = Lock()

    @property
    def service(self) -> ContextService:
        """Built on first use: with SQL storage, building it touches the database, and an
        outage at start-up must be a 503 on that request, not a process that cannot start."""
        if self._service is None:
            with self._lock:
                if self._service is None:
                    self._service = build_service(self.runtime, self.queue)
        return self._service

    @property
    def limiter(self) -> RateLimiter:
        """The shared token buckets."""
        if self._limiter is None:
            with self._lock:
                if self._limiter is None:
                    self._limiter = RateLimiter(self.runtime.redis, self.settings.redis.key_prefix)
        return self._limiter

    def tenant_for_token(self, token: str) -> str | None:
        """The tenant of a bearer token, comparing digests in constant time.

        Every configured digest is compared (no early exit, no dict lookup), so the time
        taken does not depend on which entry, if any, matches.
        """
        candidate = hash_token(token)
        found: str | None = None
        for digest, tenant in self.settings.http.tokens.items():
            if hmac.compare_digest(candidate, digest):
                found = tenant
        return found

    def rate_limit(self, tenant: str) -> None:
        """Take one token from the tenant's bucket or raise 429."""
        http = self.settings.http
        rate = self.settings.tenant(tenant).requests_per_second or http.requests_per_second
        decision = self.limiter.take(tenant, rate, http.burst)
        if not decision.allowed:
            raise ApiError(
                429,
                "rate_limited",
                f"more than {rate:g} requests per second (burst {http.burst}); retry later",
                headers={"Retry-After": str(decision.retry_after)},
            )

    def key(self, tenant: str, conversation_id: str) -> ConversationKey:
        """The conversation's key; an invalid id is a 404 like any id the tenant does not own."""
        try:
            return ConversationKey(tenant, conversation_id)
        except InvalidKeyError:
            raise _not_found() from None

    def exists(self, key: ConversationKey) -> bool:
        """True when the conversation has a log or a saved state."""
        return self.runtime.log.last_id(key) is not None or self.runtime.state_store.load(key) is not None

    def require(self, tenant: str, conversation_id: str) -> ConversationKey:
        """The key of an existing conversation of ``tenant``, or 404."""
        key = self.key(tenant, conversation_id)
        if not self.exists(key):
            raise _not_found()
        return key

    def check_conversation_limit(self, tenant: str) -> None:
        """403 when the tenant already has ``max_conversations`` conversations.

        Only called for an append that would create a conversation. Two concurrent creations
        can both pass the check (it is not a transaction): the limit is a quota, not a lock.
        """
        limit = self.settings.tenant(tenant).max_conversations
        if limit is None:
            return
        existing = self.runtime.log.list_conversations(tenant, None, limit)
        if len(existing) >= limit:
            raise ApiError(
                403,
                "conversation_limit",
                f"tenant has reached its limit of {limit} conversations; delete one to start another",
            )


def _parse_if_match(value: str | None) -> str | None:
    """The log id in an ``If-Match`` header: a bare id or an entity tag (``"id"``, ``W/"id"``)."""
    if value is None:
        return None
    text = value.strip()
    text = text.removeprefix("W/")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text


def _block(block: SummaryBlock) -> BlockOut:
    return BlockOut(
        block_id=block.block_id,
        first_id=block.first_id,
        last_id=block.last_id,
        level=block.level,
        tokens_before=block.tokens_before,
        tokens_after=block.tokens_after,
        model=block.model,
        created_at=block.created_at,
        text="\n\n".join(message_text(m) for m in block.messages),
    )


def _snapshot(state: CompressionState) -> StateSnapshot:
    return StateSnapshot(
        version=state.version,
        covered_until=state.covered_until,
        pinned=list(state.pinned),
        blocks=[_block(b) for b in state.blocks],
    )


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
        queue = CeleryQueue()  # type: ignore[assignment]
    assert queue is not None
    api = _Api(runtime, queue)

    app = FastAPI(
        title="ctxcore",
        version=__version__,
        description="Context engine for LLM agents: append messages, get windows within a token "
        "budget, compact in the background. Authenticate with `Authorization: Bearer <token>`.",
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=runtime.settings.http.max_body_bytes)
    _install_error_handlers(app)

    bearer = HTTPBearer(auto_error=False, description="A tenant's API token (configured as its sha256)")

    def current_tenant(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> str:
        """Authenticate the request and charge the tenant's rate limit."""
        if credentials is None:
            raise ApiError(
                401,
                "unauthorized",
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="ctxcore"'},
            )
        tenant = api.tenant_for_token(credentials.credentials)
        if tenant is None:
            raise ApiError(
                401,
                "unauthorized",
                "invalid bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="ctxcore", error="invalid_token"'},
            )
        api.rate_limit(tenant)
        return tenant

    Tenant = Annotated[str, Depends(current_tenant)]
    conv = "/v1/conversations/{conversation_id}"

    @app.post(
        f"{conv}/messages",
        response_model=AppendResponse,
        status_code=201,
        responses={
            200: {"model": AppendResponse, "description": "Every message was already logged (a replay)"},
            **_errors(401, 403, 404, 409, 413, 422, 429, 503),
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
            raise _invalid_message(exc, "messages") from None
        expected = _parse_if_match(if_match)
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
        responses=_errors(401, 404, 409, 413, 422, 429, 503),
        tags=["conversations"],
    )
    def get_window(conversation_id: ConversationId, body: WindowRequest, tenant: Tenant) -> WindowResponse:
        """The window to send to the model: system messages first, within ``budget_tokens``.

        Never calls a model; asks for background compaction when the conversation is over
        its trigger. 422 ``budget_exceeded`` when system + tools + anchors alone do not fit;
        409 ``invalid_window`` (with the violations) when the saved state cannot be served
        without breaking the chat protocol: roll the conversation back.
        """
        key = api.require(tenant, conversation_id)
        try:
            system = from_openai(body.system_messages)
        except InvalidMessageError as exc:
            raise _invalid_message(exc, "system_messages") from None
        started = time.perf_counter()
        try:
            result = api.service.get_window(key, body.budget_tokens, system, body.tools, body.model)
        except InvalidMessageError as exc:
            raise _invalid_message(exc, "system_messages") from None
        runtime.metrics.observe("ctxcore_fast_path_seconds", time.perf_counter() - started)
        if result.fallback_applied:
            runtime.metrics.inc("ctxcore_fallback_windows_total")
        return WindowResponse(
            messages=to_openai(result.messages, include_extra=True),
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
        responses=_errors(401, 404, 429, 503),
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
        responses=_errors(401, 404, 429, 503),
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
            raise _not_found()
        current = _snapshot(state or CompressionState())
        result = StateResponse(
            **current.model_dump(),
            budget=runtime.state_store.get_budget(key),
            compaction_detail=detail_out(runtime.failures.detail(key)),
        )
        if history:
            result.history = [_snapshot(s) for s in runtime.state_store.history(key)]
        return result

    @app.get(
        f"{conv}/offloads/{{handle}}",
        response_model=OffloadResponse,
        responses=_errors(401, 404, 429, 503),
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
            raise _not_found("offload") from None
        messages = runtime.offloads.get(key, handle)
        if messages is None:
            raise _not_found("offload")
        return OffloadResponse(handle=handle, messages=to_openai(messages, include_extra=True))

    @app.get(
        "/v1/conversations",
        response_model=ConversationList,
        responses=_errors(401, 422, 429, 503),
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
        responses=_errors(401, 404, 409, 429, 503),
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

    @app.get("/v1/usage", response_model=UsageResponse, responses=_errors(401, 429, 503), tags=["tenant"])
    def usage(tenant: Tenant) -> UsageResponse:
        """Summariser calls and tokens spent on the tenant's conversations."""
        return UsageResponse(tenant=tenant, **runtime.metrics.usage(tenant))

    @app.get(
        "/healthz",
        response_model=HealthResponse,
        responses={503: {"model": HealthResponse, "description": "Redis does not answer"}},
        tags=["operations"],
    )
    def healthz() -> JSONResponse:
        """Liveness and readiness: 200 when Redis answers PING, else 503."""
        try:
            runtime.redis.ping()
        except redis.RedisError as exc:
            log.warning("health check failed: %s", exc)
            return JSONResponse({"status": "unavailable"}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "Prometheus text exposition format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **_errors(503),
        },
        tags=["operations"],
    )
    def metrics() -> PlainTextResponse:
        """Service metrics (no tenant or conversation labels: cardinality stays bounded)."""
        extra = {"ctxcore_queue_depth": float(runtime.scheduler.depth())}
        return PlainTextResponse(
            runtime.metrics.render(extra=extra), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    install_recall_route(app, api, Tenant, conv, _errors(401, 404, 409, 422, 429, 503))
    return app


def app_from_env() -> FastAPI:
    """The app configured from ``CTXCORE_*`` (for ``uvicorn workers.http:app_from_env --factory``)."""
    return create_app(Runtime(Settings.from_env()))


def serve(settings: Settings, *, log_level: str = "info") -> None:
    """Run the API with uvicorn on ``http.host:http.port`` (the CLI's ``ctxcore serve``)."""
    import uvicorn

    uvicorn.run(
        create_app(Runtime(settings)), host=settings.http.host, port=settings.http.port, log_level=log_level
    )
