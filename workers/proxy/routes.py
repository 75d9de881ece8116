"""``POST /v1/chat/completions``: an OpenAI-compatible proxy that serves ctxcore's window.

An agent on the OpenAI SDK gets compaction by configuration: ``base_url`` here, ``api_key``
a ctxcore token (never forwarded), and the header ``X-Ctxcore-Conversation``. Each request:

1. its ``system``/``developer`` messages are kept aside (never logged; they go upstream
   first, in order); the rest is matched against the log (``workers.proxy.match``) and what
   is new is appended with ids derived from its position and content, so a retry appends
   nothing twice;
2. ``messages`` is replaced by the window within ``window(model) - reserve`` (the reserve is
   ``max_completion_tokens``, else ``max_tokens``, else ``proxy.default_reserve_tokens``),
   counting ``tools``; every other field is forwarded unchanged;
3. the upstream's answer is returned (a stream relayed chunk by chunk) with an allow-list of
   its headers, and a complete reply is appended; an upstream error becomes the proxy's
   OpenAI error with its status and its message redacted (``upstream_error``). A request whose reply is already logged is answered from the log with
   ``x-ctxcore-replayed: true``, without an upstream call.

Errors are OpenAI-shaped (``workers.proxy.errors``). ``/v1/responses`` is a 404.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations.
import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ctxcore.config import ProxySettings
from ctxcore.contract import MAX_NESTING_DEPTH, check_tools, json_problem
from ctxcore.errors import InvalidKeyError, InvalidMessageError
from ctxcore.state import ConversationKey
from workers.api_common.auth import rate_limit, tenant_for_token
from workers.api_common.state import ApiState
from workers.proxy.errors import ProxyError, openai_error, proxy_responses
from workers.proxy.flow import Prepared, ProxyFlow
from workers.proxy.index import HashIndex
from workers.proxy.request import api_keys, request_budget, split_messages
from workers.proxy.stream import ReplyAssembler, replay_chunks, replay_completion, sse
from workers.proxy.upstream import Upstream, deadline_passed, upstream_error

__all__ = ["CONVERSATION_HEADER", "proxy_router"]

CONVERSATION_HEADER = "X-Ctxcore-Conversation"
REPLAYED_HEADER = "x-ctxcore-replayed"
# A request body nesting deeper than this holds a field over the message contract's limit
# (ctxcore.contract.MAX_NESTING_DEPTH within a message or a tool) whatever the field.
BODY_MAX_DEPTH = MAX_NESTING_DEPTH + 32
# Of an upstream's error body, only its start is shown (redacted): no more is read.
ERROR_BODY_BYTES = 64 * 1024


def _tenant(api: ApiState, request: Request) -> str:
    """Authenticate by the bearer token (a ctxcore token) and charge the rate limit."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    missing = scheme.lower() != "bearer" or not token.strip()
    tenant = None if missing else tenant_for_token(api.settings, token.strip())
    if tenant is None:
        raise ProxyError(
            401,
            f"{'missing' if missing else 'invalid'} bearer token: the api_key must be a ctxcore token",
            "unauthorized" if missing else "invalid_api_key",
            headers={"WWW-Authenticate": 'Bearer realm="ctxcore"'},
        )
    rate_limit(api, tenant)
    return tenant


def proxy_router(api: ApiState) -> APIRouter:
    """The proxy routes over ``api`` (its settings, service and token table)."""
    router = APIRouter(tags=["proxy"])
    keys = api_keys(api.settings)
    # A reply the log may hold: service.max_message_chars characters of at most 4 UTF-8
    # bytes each, plus the completion's envelope; read into a buffer of this size at most.
    max_chars = api.settings.service.max_message_chars
    reply_bytes = 4 * max_chars + 64 * 1024
    # What an upstream error may echo and a tenant must not read.
    secrets = tuple(sorted(set(keys.values()) | set(api.runtime.secrets), key=len, reverse=True))
    upstream = Upstream(api.runtime.tracer)
    flows: dict[int, ProxyFlow] = {}

    def flow() -> ProxyFlow:
        service = api.service
        found = flows.get(id(service))
        if found is None:
            index = HashIndex(api.runtime.redis, api.settings.redis.key_prefix, api.runtime.retention)
            found = flows.setdefault(id(service), ProxyFlow(service, index, api.runtime.tracer))
        return found

    def prepare(
        request: Request, body: Any
    ) -> tuple[ConversationKey, ProxySettings, str, Prepared, list[dict[str, Any]]]:
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
        if body.get("n") not in (None, 1):
            raise ProxyError(
                400, "n must be 1: the log holds one reply per request", "invalid_value", param="n"
            )
        budget = request_budget(proxy, scope, model, body)
        parse_started, parse_cpu = time.perf_counter(), time.thread_time()
        system_raw, system, rest, indices = split_messages(messages)
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
        return key, proxy, proxy.upstream_base_url, prepared, system_raw

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
            return await _answer(*await run_in_threadpool(prepare, request, body), body)
        except Exception as exc:
            response = openai_error(exc)
            if response is None:
                raise
            return response

    async def _answer(
        key: ConversationKey,
        proxy: ProxySettings,
        base_url: str,
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
                return StreamingResponse(iter(chunks), media_type="text/event-stream", headers=replayed)
            return JSONResponse(
                replay_completion(prepared.replay, body["model"], prepared.reply_id), headers=replayed
            )
        outgoing = {**body, "messages": [*system_raw, *prepared.window]}
        # api_keys() holds no empty name: an unset key env finds no key.
        api_key = keys.get(proxy.upstream_api_key_env or "")
        timing = ", ".join(f"{name};dur={ms:.3f}" for name, ms in prepared.timings.items())
        started = time.perf_counter()
        deadline_at = asyncio.get_running_loop().time() + proxy.upstream_deadline
        if not stream:
            answer = await upstream.post(
                base_url,
                outgoing,
                api_key,
                proxy.upstream_timeout,
                deadline_at=deadline_at,
                max_bytes=reply_bytes,
                key=key,
            )
            forward_ms = (time.perf_counter() - started) * 1000
            reply_ms = 0.0
            if answer.status_code != 200:
                return upstream_error(answer.status_code, answer.content, answer.headers, secrets).response()
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
        opened = await upstream.open_stream(
            base_url, outgoing, api_key, proxy.upstream_timeout, deadline_at=deadline_at, key=key
        )
        if opened.status_code != 200:
            try:
                async with asyncio.timeout_at(deadline_at):
                    content = await _bounded_read(opened, ERROR_BODY_BYTES)
            except TimeoutError:
                raise deadline_passed() from None
            finally:
                await opened.aclose()
            return upstream_error(opened.status_code, content, opened.headers, secrets).response()

        async def relay() -> AsyncIterator[bytes]:
            assembler = ReplyAssembler()
            received = 0
            try:
                async with asyncio.timeout_at(deadline_at):
                    async for chunk in opened.aiter_bytes():
                        received += len(chunk)
                        if assembler.feed(chunk) and assembler.complete:
                            # Logged before the client sees [DONE]: its next request finds it.
                            await run_in_threadpool(flow().record_reply, key, prepared, assembler.message())
                        if assembler.chars > max_chars or received > reply_bytes:
                            # Cut, never logged: the error event ends the stream the SDK reads.
                            yield _stream_error(
                                f"the upstream's reply outgrew what a logged message may hold "
                                f"(service.max_message_chars, {max_chars} characters); it was cut and not logged",
                                "upstream_reply_too_large",
                            )
                            return
                        yield chunk
                if not assembler.done:
                    yield _stream_error(
                        "the upstream's stream ended without [DONE]; the partial reply was not logged"
                    )
            except TimeoutError:
                yield _stream_error(
                    f"the upstream's stream outlived proxy.upstream_deadline ({proxy.upstream_deadline:g} s); "
                    "the partial reply was not logged",
                    "upstream_timeout",
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


def _stream_error(message: str, code: str = "upstream_stream_cut") -> bytes:
    """An OpenAI-shaped error event, then ``[DONE]``: the stream ends as a stream should."""
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": code}}) + sse(
        "[DONE]"
    )


async def _bounded_read(response: httpx.Response, max_bytes: int) -> bytes:
    """An upstream error's body, at most ``max_bytes`` of it (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk[: max_bytes - size])
        size += len(chunk)
        if size >= max_bytes:
            break
    return b"".join(chunks)


def _reply_of(content: bytes) -> dict[str, Any] | None:
    """The assistant message of a 200 completion body (None if it has no such thing)."""
    try:
        data = json.loads(content)
        message = data["choices"][0]["message"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError):
        return None
    return message if isinstance(message, dict) else None
