"""``POST /v1/chat/completions``: an OpenAI-compatible proxy that serves ctxcore's window.

An agent on the OpenAI SDK gets compaction by configuration: ``base_url`` here, ``api_key``
a ctxcore token (never forwarded), and the header ``X-Ctxcore-Conversation``. Each request:

1. its ``system``/``developer`` messages are kept aside (never logged; they go upstream
   first, in order); the rest is matched against the log (``workers.proxy_match``) and what
   is new is appended with ids derived from its position and content, so a retry appends
   nothing twice;
2. ``messages`` is replaced by the window within ``window(model) - reserve`` (the reserve is
   ``max_completion_tokens``, else ``max_tokens``, else ``proxy.default_reserve_tokens``),
   counting ``tools``; every other field is forwarded unchanged;
3. the upstream's answer is returned (a stream relayed chunk by chunk) with an allow-list of
   its headers, and a complete reply is appended; an upstream error becomes the proxy's
   OpenAI error with its status and its message redacted (``upstream_error``). A request whose reply is already logged is answered from the log with
   ``x-ctxcore-replayed: true``, without an upstream call.

Errors are OpenAI-shaped (``workers.proxy_errors``). ``/v1/responses`` is a 404.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations.
import json
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ctxcore.config import ProxySettings, Settings
from ctxcore.contract import MAX_NESTING_DEPTH, check_message, check_tools, json_problem
from ctxcore.errors import ConfigError, InvalidKeyError, InvalidMessageError
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.state import ConversationKey
from ctxcore.window import known_context_window
from workers.http_api import ApiState
from workers.http_auth import rate_limit, tenant_for_token
from workers.proxy_errors import ProxyError, openai_error, proxy_responses
from workers.proxy_flow import Prepared, ProxyFlow
from workers.proxy_index import HashIndex
from workers.proxy_stream import ReplyAssembler, replay_chunks, replay_completion, sse
from workers.proxy_upstream import Upstream, upstream_error

__all__ = ["CONVERSATION_HEADER", "proxy_router"]

CONVERSATION_HEADER = "X-Ctxcore-Conversation"
REPLAYED_HEADER = "x-ctxcore-replayed"
# A request body nesting deeper than this holds a field over the message contract's limit
# (ctxcore.contract.MAX_NESTING_DEPTH within a message or a tool) whatever the field.
BODY_MAX_DEPTH = MAX_NESTING_DEPTH + 32


def _api_keys(settings: Settings) -> dict[str, str]:
    """Each configured ``upstream_api_key_env``'s value, read once (at start-up)."""
    names = {
        s.upstream_api_key_env
        for s in [settings.proxy, *(t.proxy for t in settings.tenants.values() if t.proxy)]
    }
    keys: dict[str, str] = {}
    for name in sorted(n for n in names if n):
        value = os.environ.get(name)
        if not value:
            raise ConfigError(
                f"proxy.upstream_api_key_env names {name!r}, which is not set; export it or unset the setting"
            )
        keys[name] = value
    return keys


def _tenant(api: ApiState, request: Request) -> str:
    """Authenticate by the bearer token (a ctxcore token) and charge the rate limit."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="ctxcore"'}
    if scheme.lower() != "bearer" or not token.strip():
        raise ProxyError(
            401,
            "missing bearer token: the api_key must be a ctxcore token",
            "unauthorized",
            headers=challenge,
        )
    tenant = tenant_for_token(api.settings, token.strip())
    if tenant is None:
        raise ProxyError(
            401,
            "invalid bearer token: the api_key must be a ctxcore token",
            "invalid_api_key",
            headers=challenge,
        )
    rate_limit(api, tenant)
    return tenant


def _budget(proxy: ProxySettings, scope: str, model: str, body: Mapping[str, Any]) -> int:
    window = known_context_window(model, proxy.context_window_tokens)
    if window is None:
        raise ProxyError(
            400,
            f"no context window known for model {model!r}: set {scope}.context_window_tokens[{model!r}]",
            "unknown_model_window",
            param="model",
        )
    reserve = proxy.default_reserve_tokens
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ProxyError(400, f"{name} must be a positive integer", "invalid_value", param=name)
            if value >= window:
                raise ProxyError(
                    400,
                    f"{name} ({value}) is at or over the window of {model!r} ({window} tokens): nothing is left for the messages",
                    "invalid_value",
                    param=name,
                )
            reserve = value
            break
    if window - reserve <= 0:
        raise ProxyError(
            400,
            f"{scope}.default_reserve_tokens ({reserve}) leaves no budget in the window of {model!r} ({window})",
            "invalid_value",
            param="max_tokens",
        )
    return window - reserve


def _split(raw: list[Any]) -> tuple[list[dict[str, Any]], list[SystemMessage], list[AnyMessage], list[int]]:
    """System/developer messages (raw, and parsed for counting) apart from the rest."""
    system_raw: list[dict[str, Any]] = []
    system: list[SystemMessage] = []
    rest: list[Any] = []
    indices: list[int] = []
    for i, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            try:
                parsed = from_openai([{**message, "role": "system"}])[0]
                check_message(i, parsed, stored=False)
            except InvalidMessageError as exc:
                raise ProxyError(
                    400, f"message {i}: {exc.detail}", exc.field, param=f"messages[{i}]"
                ) from None
            system_raw.append(message)
            # from_openai returns AnyMessage; the role forced to "system" makes it a SystemMessage.
            system.append(parsed)  # type: ignore[arg-type]
        else:
            rest.append(message)
            indices.append(i)
    try:
        parsed_rest = from_openai(rest)
    except InvalidMessageError as exc:
        at = indices[exc.index] if exc.index >= 0 else -1
        raise ProxyError(
            400, f"message {at}: field {exc.field!r}: {exc.detail}", exc.field, param=f"messages[{at}]"
        ) from None
    return system_raw, system, parsed_rest, indices


def proxy_router(api: ApiState) -> APIRouter:
    """The proxy routes over ``api`` (its settings, service and token table)."""
    router = APIRouter(tags=["proxy"])
    keys = _api_keys(api.settings)
    # What an upstream error may echo and a tenant must not read.
    secrets = tuple(sorted(set(keys.values()) | set(api.runtime.secrets), key=len, reverse=True))
    upstream = Upstream()
    flows: dict[int, ProxyFlow] = {}

    def flow() -> ProxyFlow:
        service = api.service
        found = flows.get(id(service))
        if found is None:
            index = HashIndex(api.runtime.redis, api.settings.redis.key_prefix, api.runtime.retention)
            found = flows.setdefault(id(service), ProxyFlow(service, index))
        return found

    def prepare(
        request: Request, body: Any
    ) -> tuple[ConversationKey, ProxySettings, Prepared, list[dict[str, Any]]]:
        tenant = _tenant(api, request)
        proxy = api.settings.proxy_for_tenant(tenant)
        tenant_scoped = api.settings.tenant(tenant).proxy is not None
        scope = f"tenants.{tenant}.proxy" if tenant_scoped else "proxy"
        if proxy.upstream_base_url is None:
            raise ProxyError(
                404,
                f"no upstream is configured for this tenant: set {scope}.upstream_base_url",
                "proxy_not_configured",
            )
        conversation = request.headers.get(CONVERSATION_HEADER)
        if not conversation:
            raise ProxyError(
                400,
                f"missing {CONVERSATION_HEADER} header: name the conversation (1-128 of letters, digits, '-', '_', '.')",
                "missing_conversation",
                param=CONVERSATION_HEADER,
            )
        try:
            key = ConversationKey(tenant, conversation)
        except InvalidKeyError as exc:
            raise ProxyError(
                400,
                f"invalid {CONVERSATION_HEADER}: {exc}",
                "invalid_conversation",
                param=CONVERSATION_HEADER,
            ) from None
        if not isinstance(body, dict):
            raise ProxyError(400, "the request body must be a JSON object", "invalid_request")
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            raise ProxyError(400, "model must be a non-empty string", "invalid_value", param="model")
        if not isinstance(messages, list) or not messages:
            raise ProxyError(400, "messages must be a non-empty list", "invalid_value", param="messages")
        n = body.get("n")
        if n is not None and n != 1:
            raise ProxyError(
                400, "n must be 1: the log holds one reply per request", "invalid_value", param="n"
            )
        budget = _budget(proxy, scope, model, body)
        parse_started, parse_cpu = time.perf_counter(), time.thread_time()
        system_raw, system, rest, indices = _split(messages)
        parse_ms = (time.perf_counter() - parse_started) * 1000
        parse_cpu_ms = (time.thread_time() - parse_cpu) * 1000
        tools = body.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ProxyError(400, "tools must be a list of objects", "invalid_value", param="tools")
        try:
            check_tools(tools)
        except InvalidMessageError as exc:
            raise ProxyError(400, f"{exc.field}: {exc.detail}", "invalid_value", param=exc.field) from None
        if api.runtime.log.last_id(key) is None:
            api.service.check_conversation_limit(tenant)
        prepared = flow().prepare(key, rest, indices, system, tools, model, budget)
        if "window" in prepared.timings:  # a replay serves no window
            api.metrics.window_served(prepared.timings["window"] / 1000, prepared.fallback, route="proxy")
        prepared.timings = {"parse": parse_ms, "parse-cpu": parse_cpu_ms, **prepared.timings}
        return key, proxy, prepared, system_raw

    @router.post(
        "/v1/chat/completions",
        responses=proxy_responses(),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"type": "object", "description": "OpenAI's chat completion request"}
                    }
                },
            }
        },
    )
    async def chat_completions(request: Request) -> Response:
        """OpenAI's chat completions, with ``messages`` replaced by ctxcore's window."""
        try:
            raw = await request.body()
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            except RecursionError:
                raise ProxyError(
                    400, f"the request body nests deeper than {BODY_MAX_DEPTH} levels", "invalid_request"
                ) from None
            problem = json_problem(body, BODY_MAX_DEPTH)
            if problem is not None:
                path, rule = problem
                raise ProxyError(
                    400, f"request body{path}: {rule}", "invalid_request", param=path[1:] or None
                )
            key, proxy, prepared, system_raw = await run_in_threadpool(prepare, request, body)
            return await _answer(key, proxy, prepared, system_raw, body)
        except Exception as exc:
            response = openai_error(exc)
            if response is None:
                raise
            return response

    async def _answer(
        key: ConversationKey,
        proxy: ProxySettings,
        prepared: Prepared,
        system_raw: list[dict[str, Any]],
        body: dict[str, Any],
    ) -> Response:
        stream = body.get("stream") is True
        include_usage = (
            bool((body.get("stream_options") or {}).get("include_usage"))
            if isinstance(body.get("stream_options"), dict)
            else False
        )
        replayed = {REPLAYED_HEADER: "true"}
        if prepared.replay is not None:
            if stream:
                chunks = replay_chunks(prepared.replay, body["model"], prepared.reply_id, include_usage)
                return StreamingResponse(_iterate(chunks), media_type="text/event-stream", headers=replayed)
            return JSONResponse(
                replay_completion(prepared.replay, body["model"], prepared.reply_id), headers=replayed
            )
        base_url = proxy.upstream_base_url
        if base_url is None:  # prepare() refused it already; this keeps the type honest
            raise ProxyError(404, "no upstream is configured for this tenant", "proxy_not_configured")
        outgoing = {**body, "messages": [*system_raw, *prepared.window]}
        key_name = proxy.upstream_api_key_env
        api_key = keys.get(key_name) if key_name else None
        timing = ", ".join(f"{name};dur={ms:.3f}" for name, ms in prepared.timings.items())
        started = time.perf_counter()
        if not stream:
            answer = await upstream.post(base_url, outgoing, api_key, proxy.upstream_timeout)
            forward_ms = (time.perf_counter() - started) * 1000
            reply_ms = 0.0
            if answer.status_code != 200:
                return upstream_error(answer.status_code, answer.content, answer.headers, secrets).response()
            if answer.status_code == 200:
                reply = _reply_of(answer.content)
                if reply is not None:
                    logged = await run_in_threadpool(flow().record_reply, key, prepared, reply)
                    reply_ms = (time.perf_counter() - started) * 1000 - forward_ms
                    if logged is not None:
                        return JSONResponse(
                            replay_completion(logged, body["model"], prepared.reply_id), headers=replayed
                        )
            # Server-Timing: what the proxy spent (ms), so a client can split the overhead.
            timing += f", upstream;dur={forward_ms:.3f}, reply;dur={reply_ms:.3f}"
            headers = {**answer.headers, "server-timing": timing}
            return Response(answer.content, status_code=answer.status_code, headers=headers)
        opened = await upstream.open_stream(base_url, outgoing, api_key, proxy.upstream_timeout)
        if opened.status_code != 200:
            content = await opened.aread()
            await opened.aclose()
            return upstream_error(opened.status_code, content, opened.headers, secrets).response()

        async def relay() -> AsyncIterator[bytes]:
            assembler = ReplyAssembler()
            try:
                async for chunk in opened.aiter_bytes():
                    if assembler.feed(chunk) and assembler.complete:
                        # Logged before the client sees [DONE]: its next request finds it.
                        await run_in_threadpool(flow().record_reply, key, prepared, assembler.message())
                    yield chunk
                if not assembler.done:
                    yield _stream_error(
                        "the upstream's stream ended without [DONE]; the partial reply was not logged"
                    )
            except httpx.HTTPError as exc:
                yield _stream_error(
                    f"the upstream's stream broke off ({type(exc).__name__}); the partial reply was not logged"
                )
            finally:
                await opened.aclose()

        headers = {**Upstream.relayed_headers(opened.headers), "server-timing": timing}
        return StreamingResponse(relay(), status_code=200, headers=headers, media_type="text/event-stream")

    @router.post("/v1/responses", include_in_schema=False)
    async def responses() -> Response:
        return ProxyError(
            404,
            "the proxy serves /v1/chat/completions only; Agents SDK users take the ctxcore.integrations.openai_agents adapter",
            "not_supported",
        ).response()

    return router


async def _iterate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _stream_error(message: str) -> bytes:
    return sse(
        {"error": {"message": message, "type": "server_error", "param": None, "code": "upstream_stream_cut"}}
    )


def _reply_of(content: bytes) -> dict[str, Any] | None:
    """The assistant message of a 200 completion body (None if it has no such thing)."""
    try:
        data = json.loads(content)
        message = data["choices"][0]["message"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError):
        return None
    return message if isinstance(message, dict) else None
