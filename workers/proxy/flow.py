"""The proxy's log side, run in the thread pool: match a request against the log, append
what is new (idempotently), serve the window, and append the upstream's reply."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxcore.errors import InvalidMessageError
from ctxcore.messages import AnyMessage, SystemMessage, from_openai, to_openai
from ctxcore.state import ConversationKey
from ctxcore.telemetry import NO_TRACER, Tracer
from workers.proxy.errors import ProxyError
from workers.proxy.index import HashIndex, IndexEntry
from workers.proxy.match import (
    PROXY_HASH_KEY,
    Divergence,
    canonical_hash,
    entry_hash,
    match_request,
    new_message_id,
    reply_message_id,
)
from workers.service import ContextService
from workers.telemetry.spans import describe_window, window_span

__all__ = ["Prepared", "ProxyFlow"]

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A request ready to go upstream (``window``) or answered from the log (``replay``)."""

    reply_id: str
    last_id: str | None = None
    window: list[dict[str, Any]] = field(default_factory=list)
    replay: dict[str, Any] | None = None
    appended: int = 0
    fallback: bool = False
    timings: dict[str, float] = field(default_factory=dict)


def _stamp(message: AnyMessage, message_id: str, digest: str) -> AnyMessage:
    return message.model_copy(
        update={"message_id": message_id, "metadata": {**message.metadata, PROXY_HASH_KEY: digest}}
    )


class ProxyFlow:
    """Matching, appends and windows over one ``ContextService``."""

    def __init__(self, service: ContextService, index: HashIndex, tracer: Tracer = NO_TRACER) -> None:
        self.service = service
        self.index = index
        self.tracer = tracer

    def prepare(
        self,
        key: ConversationKey,
        messages: Sequence[AnyMessage],
        indices: Sequence[int],
        system: Sequence[SystemMessage],
        tools: Sequence[Mapping[str, Any]],
        model: str,
        budget: int,
    ) -> Prepared:
        """Match ``messages`` (the request's non-system messages, at request ``indices``)
        against the log, append the new ones and serve the window (system messages first).

        ``ProxyError`` 400 ``history_diverged`` when the request does not follow the log.
        """
        started, cpu_started = time.perf_counter(), time.thread_time()
        entries = self.index.entries(key, self.service.log)
        hashes = [canonical_hash(m) for m in messages]
        match = match_request([e.log_id for e in entries], [e.digest for e in entries], hashes)
        if isinstance(match, Divergence):
            raise _diverged(indices, match.index, match.log_id)
        end = match.end(len(messages))
        reply_id = reply_message_id(key.conversation_id, end, hashes)
        if end < len(entries):
            following = entries[end]
            if following.message_id == reply_id:
                stored = self.service.log.get(key, following.log_id)
                if stored is not None:
                    return Prepared(reply_id, following.log_id, replay=to_openai([stored])[0])
            raise _diverged(indices, len(messages), following.log_id)
        last = entries[-1].log_id if entries else None
        fresh = [
            _stamp(m, new_message_id(key.conversation_id, len(entries) + j, digest), digest)
            for j, (m, digest) in enumerate(
                zip(messages[match.new_from :], hashes[match.new_from :], strict=True)
            )
        ]
        if fresh:
            try:
                ids = self.service.append(key, fresh)
            except InvalidMessageError as exc:
                if exc.index < 0:
                    raise
                at = indices[match.new_from + exc.index]
                raise ProxyError(
                    400,
                    f"message {at}: field {exc.field!r}: {exc.detail}",
                    exc.field,
                    param=f"messages[{at}]",
                ) from None
            self.index.extend(
                key,
                last,
                [
                    IndexEntry(i, m.metadata[PROXY_HASH_KEY], m.message_id or "")
                    for i, m in zip(ids, fresh, strict=True)
                    if last is None or i > last
                ],
            )
            last = max([last or "", *ids]) or None
        appended, cpu_appended = time.perf_counter(), time.thread_time()
        with window_span(self.tracer, key, budget, "proxy") as span:
            result = self.service.get_window(key, budget, list(system), tools, model, own_tools=False)
            describe_window(span, result)
        served = [m for m in result.messages if not isinstance(m, SystemMessage)]
        done, cpu_done = time.perf_counter(), time.thread_time()
        return Prepared(
            reply_id,
            last,
            window=to_openai(served),
            appended=len(fresh),
            fallback=result.fallback_applied,
            # Wall and CPU milliseconds (CPU: this thread's, so a loaded machine's waiting is out).
            timings={
                "append": (appended - started) * 1000,
                "window": (done - appended) * 1000,
                "append-cpu": (cpu_appended - cpu_started) * 1000,
                "window-cpu": (cpu_done - cpu_appended) * 1000,
            },
        )

    def record_reply(
        self, key: ConversationKey, prepared: Prepared, reply: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Append the upstream's complete reply under ``prepared.reply_id``.

        Returns the logged reply when another attempt of the same request logged a different
        one first (the client must get what the log holds), else None.
        """
        try:
            parsed = from_openai([{k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")}])
        except InvalidMessageError as exc:
            # The client's next request carries the reply, and it is appended then.
            log.warning("proxy: the upstream's reply is not a loggable message (%s); not appended", exc)
            return None
        digest = canonical_hash(parsed[0])
        try:
            ids = self.service.append(key, [_stamp(parsed[0], prepared.reply_id, digest)])
        except InvalidMessageError as exc:
            # Over the message contract or the protocol: the client still gets the reply.
            log.warning("proxy: the upstream's reply breaks the message contract (%s); not appended", exc)
            return None
        last = prepared.last_id
        if last is None or ids[0] > last:
            self.index.extend(key, last, [IndexEntry(ids[0], digest, prepared.reply_id)])
            return None
        # Another attempt of this request logged its reply first: answer with that one.
        existing = self.service.log.get(key, ids[0])
        if existing is not None and entry_hash(existing) != digest:
            return to_openai([existing])[0]
        return None


def _diverged(indices: Sequence[int], index: int, log_id: str | None) -> ProxyError:
    at = indices[index] if index < len(indices) else (indices[-1] + 1 if indices else 0)
    return ProxyError(
        400,
        f"history_diverged: request message {at} does not match the conversation's log at {log_id!r}; "
        "send the conversation as logged (a trimmed prefix is fine), or start a new conversation",
        "history_diverged",
        param=f"messages[{at}]",
    )
