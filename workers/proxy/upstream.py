"""The proxy's upstream: one async httpx client per process (per event loop, to be exact:
an httpx pool cannot cross loops) and the mapping of transport failures to 504 and 502."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ctxcore.state import ConversationKey
from ctxcore.summarize.redact import scrub
from ctxcore.telemetry import NO_TRACER, Tracer
from workers.proxy.errors import ProxyError
from workers.telemetry.spans import upstream_span

__all__ = ["Answer", "Upstream", "deadline_passed", "reply_too_large", "upstream_error"]

# The upstream's headers a client may see: what the OpenAI SDK reads (request ids, rate
# limits, retry advice) and the body's type. Anything else (Set-Cookie, Location, debug and
# infrastructure headers) is the upstream's business, not the tenant's.
_RELAYED = frozenset(
    {
        "content-type",
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
        "x-request-id",
        "request-id",
        "openai-processing-ms",
        "openai-version",
        "openai-model",
    }
)
_RELAYED_PREFIXES = ("x-ratelimit-",)
# An upstream error's message is shown up to this many characters.
_MAX_ERROR_CHARS = 1000


@dataclass(frozen=True)
class Answer:
    """A complete upstream response."""

    status_code: int
    content: bytes
    headers: dict[str, str]


class Upstream:
    """Posts chat-completion requests to an OpenAI-compatible endpoint."""

    def __init__(self, tracer: Tracer = NO_TRACER) -> None:
        self.tracer = tracer
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        """The shared client, built on first use in the running loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)
            )
            self._loop = loop
        return self._client

    @staticmethod
    def relayed_headers(headers: Mapping[str, str]) -> dict[str, str]:
        """The upstream's headers a client should see (request ids, rate limits, Retry-After)."""
        return {
            k: v
            for k, v in headers.items()
            if k.lower() in _RELAYED or k.lower().startswith(_RELAYED_PREFIXES)
        }

    def _request(
        self, base_url: str, body: Mapping[str, Any], api_key: str | None, timeout: float
    ) -> httpx.Request:
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return self.client().build_request(
            "POST",
            base_url.rstrip("/") + "/chat/completions",
            content=json.dumps(body, separators=(",", ":")).encode(),
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        )

    async def post(
        self,
        base_url: str,
        body: Mapping[str, Any],
        api_key: str | None,
        timeout: float,
        *,
        deadline_at: float,
        max_bytes: int,
        key: ConversationKey | None = None,
    ) -> Answer:
        """The upstream's whole answer, read into a buffer of at most ``max_bytes`` (a
        declared ``Content-Length`` over it is refused before reading, a body growing over it
        as soon as it does: 502 ``upstream_reply_too_large``); ``ProxyError`` 504 when a read
        waits ``timeout`` s or the whole call passes ``deadline_at`` (the loop's clock), 502
        when unreachable."""
        request = self._request(base_url, body, api_key, timeout)
        with upstream_span(self.tracer, request, body, key) as span:
            try:
                async with asyncio.timeout_at(deadline_at):
                    response = await self.client().send(request, stream=True)
                    try:
                        declared = response.headers.get("content-length", "")
                        if declared.isdigit() and int(declared) > max_bytes:
                            raise reply_too_large(max_bytes)
                        chunks: list[bytes] = []
                        size = 0
                        async for chunk in response.aiter_bytes():  # decoded: a compressed bomb counts whole
                            size += len(chunk)
                            if size > max_bytes:
                                raise reply_too_large(max_bytes)
                            chunks.append(chunk)
                    finally:
                        await response.aclose()
            except TimeoutError:
                raise deadline_passed() from None
            except httpx.HTTPError as exc:
                raise _failure(exc, timeout) from exc
            span.set("http.response.status_code", response.status_code)
        return Answer(response.status_code, b"".join(chunks), self.relayed_headers(response.headers))

    async def open_stream(
        self,
        base_url: str,
        body: Mapping[str, Any],
        api_key: str | None,
        timeout: float,
        *,
        deadline_at: float,
        key: ConversationKey | None = None,
    ) -> httpx.Response:
        """The upstream's response with its body unread (the caller closes it, and holds the
        rest of the call to ``deadline_at``); its span ends with the response's headers."""
        request = self._request(base_url, body, api_key, timeout)
        with upstream_span(self.tracer, request, body, key) as span:
            try:
                async with asyncio.timeout_at(deadline_at):
                    response = await self.client().send(request, stream=True)
            except TimeoutError:
                raise deadline_passed() from None
            except httpx.HTTPError as exc:
                raise _failure(exc, timeout) from exc
            span.set("http.response.status_code", response.status_code)
        return response


def reply_too_large(max_bytes: int) -> ProxyError:
    """502 ``upstream_reply_too_large``, naming the limit."""
    return ProxyError(
        502,
        f"the upstream's reply is larger than {max_bytes} bytes, more than a logged message may hold "
        "(4 bytes per character of service.max_message_chars, plus 64 KiB); it was not read further",
        "upstream_reply_too_large",
    )


def deadline_passed() -> ProxyError:
    """504 ``upstream_timeout`` for a call that outlived ``proxy.upstream_deadline``."""
    return ProxyError(
        504, "the upstream call outlived proxy.upstream_deadline (its total deadline)", "upstream_timeout"
    )


def _failure(exc: httpx.HTTPError, timeout: float) -> ProxyError:
    if isinstance(exc, httpx.TimeoutException):
        return ProxyError(
            504,
            f"the upstream did not answer within {timeout:g} s (proxy.upstream_timeout)",
            "upstream_timeout",
        )
    # The transport's text without URLs: the upstream's address is the operator's business.
    text = scrub(str(exc), urls=True)
    if isinstance(exc, httpx.ConnectError):
        return ProxyError(502, f"the upstream refused the connection: {text}", "upstream_unreachable")
    return ProxyError(502, f"the upstream's answer broke off: {type(exc).__name__}: {text}", "upstream_error")


def upstream_error(
    status: int, content: bytes, headers: Mapping[str, str], secrets: Sequence[str]
) -> ProxyError:
    """The proxy's OpenAI-shaped error for an upstream's error answer: its status, its
    ``error`` object's code, type and param when it sent one, and its message (or the start
    of a body that is not OpenAI's error JSON) with ``secrets`` (the upstream keys), bearer
    tokens and credential-shaped strings redacted; the allow-listed headers but its type."""
    try:
        parsed = json.loads(content)
    except ValueError:  # not JSON (UnicodeDecodeError is a ValueError)
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        message = error["message"]
        code, kind, param = (error.get(k) for k in ("code", "type", "param"))
    else:
        text = content.decode("utf-8", errors="replace").strip()
        message = f"the upstream answered {status}" + (f": {text}" if text else " with an empty body")
        code, kind, param = "upstream_error", None, None
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + "..."
    relayed = {k: v for k, v in Upstream.relayed_headers(headers).items() if k.lower() != "content-type"}
    return ProxyError(
        status if 400 <= status <= 599 else 502,
        scrub(message, secrets),
        scrub(code, secrets) if isinstance(code, str) else "upstream_error",
        param=scrub(param, secrets) if isinstance(param, str) else None,
        type_=scrub(kind, secrets) if isinstance(kind, str) else None,
        headers=relayed or None,
    )
