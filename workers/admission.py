"""Admission before a body is read: one tenant cannot stall the others.

A pure ASGI middleware in front of the tenant routes (``/v1/conversations...``,
``/v1/usage``; the OpenAI proxy charges its own requests). For a request with a known
bearer token it asks the tenant's Redis bucket (``RateLimiter.admit``, shared by every API
process) for a request token, the body's bytes (its declared ``Content-Length``; a body
without one is charged ``http.max_body_bytes``) and a place among the tenant's requests in
flight, all before reading a byte of the body: a refusal is a 429 with ``Retry-After`` and
the body is never read. The place is given back when the response is sent. Requests without
a known token pass through to the routes' own 401.

An append's body is counted while it is read: its ``messages`` are counted as they stream
(ijson's C push parser: a hand-written scanner would be Python per byte, and parsing the
whole body first is the cost being avoided), and the first message over
``service.max_messages_per_append`` ends the read with the 422 the service gives for the
count, without parsing (or validating) the rest: each received chunk is counted 16 KiB at
a time, so the count stops within 16 KiB of the limit whatever the chunk size (uvicorn hands
over up to 256 KiB at once). Measured in process on this loaded 2-core machine: the issue's
100,000 small messages (3.9 MB) are refused after ~1,300 counted, in 5-8 ms (a 256 KiB
chunk counted whole: ~6,900 messages, 37 ms); a legitimate 4 MB append of 1,000 messages
is counted in 14-20 ms. Over HTTP the refused append costs the API ~17 ms of CPU in all (the
request's admission and routing, uvicorn discarding the rest of the body), a 429 ~4 ms,
an accepted 4 MB append ~85-95 ms (bench/noisy_neighbour.py, bench/README.md).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

import ijson
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ctxcore.errors import InvalidMessageError, StoreUnavailable
from workers.api_common.auth import ADMITTED, tenant_for_token
from workers.api_common.errors import ApiError, invalid_message_error
from workers.api_common.state import ApiState
from workers.bodylimit import CutOff
from workers.ratelimit import Admission

__all__ = ["AdmissionMiddleware"]

log = logging.getLogger(__name__)

_APPEND = re.compile(r"^/v1/conversations/[^/]+/messages$")
# How much of a received chunk is counted before the count is checked (see _counted).
_SLICE = 16 * 1024


def _admitted_path(path: str) -> bool:
    return path.startswith("/v1/conversations") or path == "/v1/usage"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class _MessageCounter:
    """ijson's target: counts the top-level ``messages`` array's items as events arrive."""

    def __init__(self) -> None:
        self.count = 0

    def send(self, event: tuple[str, str, Any]) -> None:
        if event[0] == "messages.item" and event[1] in ("start_map", "start_array", "string", "number"):
            self.count += 1


class AdmissionMiddleware:
    """Charge and admit tenant requests before their bodies are read (module docstring)."""

    def __init__(self, app: ASGIApp, api: ApiState) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _admitted_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        tenant = tenant_for_token(self.api.settings, token) if token is not None else None
        if tenant is None:
            if token is not None:
                scope.setdefault("state", {})[ADMITTED] = None  # looked up: no tenant's
            await self.app(scope, receive, send)  # the route answers 401
            return
        request_id = uuid.uuid4().hex
        try:
            admission = await run_in_threadpool(self._admit, scope, tenant, request_id)
        except StoreUnavailable as exc:
            log.warning("admission of a %s request unavailable: %s", tenant, exc)
            error = ApiError(
                503, "store_unavailable", "a store is unavailable; retry later", {"Retry-After": "1"}
            )
            await self._answer(error, scope, receive, send)
            return
        if not admission.admitted:
            await self._answer(self._refusal(tenant, admission), scope, receive, send)
            return
        scope.setdefault("state", {})[ADMITTED] = tenant
        try:
            if scope["method"] == "POST" and _APPEND.match(scope["path"]):
                await self._counted(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            try:
                await run_in_threadpool(self.api.limiter.release, tenant, request_id)
            except StoreUnavailable as exc:
                log.warning("request of %s not released (%s): its place frees itself later", tenant, exc)

    def _admit(self, scope: Scope, tenant: str, request_id: str) -> Admission:
        http, own = self.api.settings.http, self.api.settings.tenant(tenant)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit():
            body = int(declared)
        else:
            body = http.max_body_bytes if _header(scope, b"transfer-encoding") else 0
        byte_rate = own.bytes_per_second or http.bytes_per_second
        return self.api.limiter.admit(
            tenant,
            request_id,
            rate=own.requests_per_second or http.requests_per_second,
            burst=http.burst,
            byte_rate=byte_rate,
            byte_burst=int(max(http.max_body_bytes, byte_rate)),
            body_bytes=min(body, http.max_body_bytes),
            max_in_flight=own.max_concurrent_requests or http.max_concurrent_requests,
        )

    def _refusal(self, tenant: str, admission: Admission) -> ApiError:
        http, own = self.api.settings.http, self.api.settings.tenant(tenant)
        detail = {
            "rate": f"more than {own.requests_per_second or http.requests_per_second:g} requests per "
            f"second (burst {http.burst}); retry later",
            "bytes": f"more than {own.bytes_per_second or http.bytes_per_second:g} request body bytes "
            "per second; retry later",
            "concurrent": f"more than {own.max_concurrent_requests or http.max_concurrent_requests} "
            "requests in flight at once; retry later",
        }[admission.verdict]
        return ApiError(
            429, "rate_limited", detail, {"Retry-After": str(admission.retry_after)}, limit=admission.verdict
        )

    async def _answer(self, error: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        # The connection stays open: uvicorn discards the rest of the body (its C parser,
        # never the app's JSON parsing), so the client reads this answer and its
        # Retry-After instead of a connection reset under its upload.
        await error.response()(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The append route, its ``messages`` counted as the body streams in."""
        limit = self.api.settings.service.max_messages_per_append
        counter = _MessageCounter()
        parser: Any = ijson.parse_coro(counter)
        run = CutOff(send)

        async def counted_receive() -> Message:
            nonlocal parser
            if run.refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] != "http.request" or parser is None:
                return message
            body = message.get("body", b"")
            try:
                # Slice by slice: a chunk may be 256 KiB (~6,900 small messages, ~37 ms of
                # events on this 2-core machine); slices stop the count within 16 KiB of the
                # limit (~1,300 for the 100,000-message append, ~6 ms).
                for at in range(0, len(body), _SLICE):
                    parser.send(body[at : at + _SLICE])
                    if counter.count > limit:
                        break
            except (ijson.JSONError, UnicodeError):
                # Not JSON, or a string ijson cannot decode (a lone surrogate escape): the
                # route's own parsing and the message contract answer it, naming the rule.
                parser = None
                return message
            if counter.count > limit:
                run.refused = True
                if not run.started:
                    error = invalid_message_error(
                        InvalidMessageError(-1, "messages", f"at most {limit} messages per append"),
                        "messages",
                    )
                    await self._answer(error, scope, receive, send)
                    run.answered = True
                return {"type": "http.disconnect"}
            return message

        # The route may let the simulated disconnect escape: the 422 is already sent.
        await run.run(self.app, scope, counted_receive)
