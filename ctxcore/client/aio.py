"""``AsyncCtxcoreClient``: the asyncio client of the HTTP API (on httpx)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from ctxcore.client.calls import Call, MessageLike, calls
from ctxcore.client.models import (
    AppendResponse,
    CompactResponse,
    JournalEntryOut,
    RecallResponse,
    RollbackResponse,
    StateResponse,
    TruncateResponse,
    UsageResponse,
    WindowFormat,
    WindowResponse,
)
from ctxcore.client.retry import RetryPolicy
from ctxcore.messages import AnyMessage, from_openai

__all__ = ["AsyncCtxcoreClient", "send_async"]

T = TypeVar("T")


async def send_async(http: httpx.AsyncClient, policy: RetryPolicy, call: Call[T]) -> T:
    """Send ``call``, retrying 429, 503 and connection errors under ``policy``."""
    for attempt in range(policy.max_retries + 1):
        try:
            response = await http.request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers
            )
        except httpx.TransportError as exc:
            await asyncio.sleep(policy.after_failure(http, call, attempt, exc))
            continue
        outcome = policy.settle(call, response, attempt)
        if isinstance(outcome, tuple):
            return outcome[0]
        await asyncio.sleep(outcome)
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


class AsyncCtxcoreClient:
    """The ctxcore HTTP API from asyncio: ``CtxcoreClient``'s methods as coroutines.

    ``AsyncCtxcoreClient("http://127.0.0.1:8000", token="...")``. Errors are ``CtxcoreError``s
    carrying the response's ``status`` and the body's error ``code``: ``AuthenticationError``
    (401, never retried), ``QuotaExceeded`` (403), ``NotFoundError`` (404), ``ConflictError``
    / ``TruncateRefused`` (409), ``InvalidMessageError`` / ``BudgetExceeded`` (422, 413),
    ``RateLimited`` (429), ``StoreUnavailable`` (503 or no answer). 429, 503 and connection
    errors are retried up to ``max_retries`` times (see ``RetryPolicy``). Use it as a
    async context manager or call ``aclose()``.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        max_retries: int = 3,
        max_retry_wait: float = 30.0,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.policy = RetryPolicy(max_retries=max_retries, max_retry_wait=max_retry_wait)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCtxcoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def append(
        self, conversation_id: str, messages: Iterable[MessageLike], *, if_match: str | None = None
    ) -> AppendResponse:
        """Append messages (ctxcore messages, OpenAI dicts or SDK objects) to the log.

        Each message without a ``message_id`` gets a random one before the first attempt, so
        a retry (after a dropped connection, a 503) gets the same log ids back. With
        ``if_match`` (a log id, e.g. the previous ``last_id``) the append happens only if the
        log still ends there (``ConflictError`` otherwise); it is retried too: the server
        answers a replay of an append that landed with its ids (the replay rule).
        """
        return await send_async(self._http, self.policy, calls.append(conversation_id, messages, if_match))

    async def window(
        self,
        conversation_id: str,
        budget_tokens: int | None = None,
        *,
        system: str | Sequence[MessageLike] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        model: str | None = None,
        format: WindowFormat = "ctxcore",
        preview: bool = False,
    ) -> WindowResponse:
        """The window within ``budget_tokens`` (system + tools + messages; None: the tenant's
        default budget, else the service's); send
        ``window.openai_messages()`` and ``window.tools`` to the model. ``preview``: only look
        (the budget is not recorded, no compaction is asked for)."""
        return await send_async(
            self._http,
            self.policy,
            calls.window(conversation_id, budget_tokens, system, tools, model, format, preview),
        )

    async def compact(self, conversation_id: str) -> CompactResponse:
        """Ask for a background compaction; the status after asking."""
        return await send_async(self._http, self.policy, calls.compact(conversation_id))

    async def state(self, conversation_id: str, *, history: bool = False) -> StateResponse:
        """The compaction state (blocks with provenance, ``compaction_detail``)."""
        return await send_async(self._http, self.policy, calls.state(conversation_id, history))

    async def offload(self, conversation_id: str, handle: str) -> list[AnyMessage]:
        """The original messages behind an offload handle (``NotFoundError`` if unknown)."""
        return from_openai(
            (await send_async(self._http, self.policy, calls.offload(conversation_id, handle))).messages
        )

    async def journal(self, conversation_id: str, *, limit: int = 200) -> list[JournalEntryOut]:
        """What each compaction stage run (and rollback) did, newest first (the newest 200 are kept)."""
        return (await send_async(self._http, self.policy, calls.journal(conversation_id, limit))).entries

    async def rollback(self, conversation_id: str, version: int) -> RollbackResponse:
        """Make kept state ``version`` current again (as a new version); ``VersionNotKept``
        (with the kept versions) when it is no longer kept, nothing changed."""
        return await send_async(self._http, self.policy, calls.rollback(conversation_id, version))

    async def conversations(self, *, page_size: int = 100) -> AsyncIterator[str]:
        """Every conversation id of the tenant, in id order (fetched a page at a time)."""
        after: str | None = None
        while True:
            page = await send_async(self._http, self.policy, calls.conversations(after, page_size))
            for conversation_id in page.conversations:
                yield conversation_id
            if page.next is None:
                return
            after = page.next

    async def messages(
        self, conversation_id: str, *, after: str | None = None, page_size: int = 500
    ) -> AsyncIterator[AnyMessage]:
        """The raw log after ``after`` (never compacted), oldest first, log ids set."""
        while True:
            page = await send_async(
                self._http, self.policy, calls.messages(conversation_id, after, page_size)
            )
            for message in from_openai(page.messages):
                yield message
            if page.next is None:
                return
            after = page.next

    async def recall(self, conversation_id: str, query: str, max_tokens: int = 2000) -> RecallResponse:
        """Search what compaction folded in the conversation: at most two archived chunks
        within ``max_tokens``, each with its log-id range and score; ``note`` says why there
        are none. Answer the window's ``recall_compressed_context`` calls with it.
        ``RecallDisabled`` when recall is off for the tenant."""
        return await send_async(self._http, self.policy, calls.recall(conversation_id, query, max_tokens))

    async def usage(self) -> UsageResponse:
        """Summariser calls and tokens spent on the tenant's conversations."""
        return await send_async(self._http, self.policy, calls.usage())

    async def delete(self, conversation_id: str) -> None:
        """Delete the conversation (log, state, offloads, queued work)."""
        await send_async(self._http, self.policy, calls.delete(conversation_id))

    async def truncate_after(
        self, conversation_id: str, log_id: str, *, if_match: str | None = None
    ) -> TruncateResponse:
        """Remove the messages after ``log_id``; ``TruncateRefused`` (reason ``covered``,
        ``busy``, ``moved``) when it must not, nothing removed."""
        return await send_async(
            self._http, self.policy, calls.truncate_after(conversation_id, log_id, if_match)
        )
