"""The trace contexts of the requests a compaction job serves, kept in Redis until it starts.

A window request does not start a task: it asks the fair scheduler for a job, N requests of
one conversation coalesce into one job, and a drain token starts it later, in another
process. So each request that asks (``noted``: the window's span is current) pushes its
``traceparent`` with its time onto a list beside the conversation,
``<prefix>:{<tenant>:<conversation>}:traces`` (its slot: one script call), keeping the first
``telemetry.max_job_links`` and counting the rest. The job (``job_span``, when a drain pops
it) takes the list, starts a trace of its own and links to every context younger than
``telemetry.job_context_ttl_seconds``: the first is the request that queued it, the others
coalesced into it. A context that expired is not linked (a job with none starts a trace
linked to nothing); the list itself expires that long after its last push. Requests while a
job runs coalesce into its follow-up, which takes them when it starts.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager

import redis

from ctxcore.config import TelemetrySettings
from ctxcore.errors import StoreUnavailable
from ctxcore.state import ConversationKey
from ctxcore.state.redis.common import UNAVAILABLE
from ctxcore.telemetry import Span, Tracer
from workers.telemetry.spans import conversation_attributes

__all__ = ["JOB_SPAN", "JobTraces"]

log = logging.getLogger(__name__)
JOB_SPAN = "ctxcore.compaction.job"
_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, *UNAVAILABLE)

# KEYS: list, count. ARGV: entry, most kept, ttl ms. The first entries stay (the queuing one).
_PUSH = """
local n = redis.call('INCR', KEYS[2])
if n <= tonumber(ARGV[2]) then redis.call('RPUSH', KEYS[1], ARGV[1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return n
"""
# KEYS: list, count. Returns {entries, count} and deletes both.
_TAKE = """
local entries = redis.call('LRANGE', KEYS[1], 0, -1)
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('DEL', KEYS[1], KEYS[2])
return {entries, n}
"""


class JobTraces:
    """Where window requests leave their trace context for the job they asked for."""

    def __init__(self, client: redis.Redis, prefix: str, settings: TelemetrySettings) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_seconds = settings.job_context_ttl_seconds
        self.max_links = settings.max_job_links
        self._push = client.register_script(_PUSH)
        self._take = client.register_script(_TAKE)

    def keys(self, key: ConversationKey) -> list[str]:
        """The list of contexts and the count of requests, in the conversation's slot."""
        base = f"{self.prefix}:{key.hash_tag}:traces"
        return [base, f"{base}:n"]

    def noted(self, key: ConversationKey, tracer: Tracer) -> None:
        """The current request asked for a job of ``key``: keep its context (``tracer``'s
        current one) for the job. Nothing at all with telemetry off; a Redis error only
        loses the link (logged)."""
        if not tracer.enabled:
            return
        traceparent = tracer.traceparent()
        if traceparent is None:
            return
        entry = f"{time.time():.3f} {traceparent}"
        try:
            self._push(keys=self.keys(key), args=[entry, self.max_links, int(self.ttl_seconds * 1000)])
        except _ERRORS as exc:
            log.debug("trace context of a request for %s not kept: %s", key, exc)

    def delete(self, key: ConversationKey) -> None:
        """Forget ``key``'s waiting contexts (the conversation is deleted)."""
        try:
            self.client.delete(*self.keys(key))
        except _ERRORS as exc:
            raise StoreUnavailable(f"trace contexts of {key} not deleted: {exc}") from exc

    def take(self, key: ConversationKey) -> tuple[list[str], int, int]:
        """The contexts to link (oldest first), how many requests asked, how many expired."""
        got = self._take(keys=self.keys(key), args=[])
        entries, count = got[0], int(got[1])
        oldest = time.time() - self.ttl_seconds
        linked: list[str] = []
        for raw in entries:
            stamp, _, traceparent = (raw.decode() if isinstance(raw, bytes) else str(raw)).partition(" ")
            if float(stamp) >= oldest:
                linked.append(traceparent)
        return linked, count, min(len(entries), self.max_links) - len(linked)

    def job_span(self, key: ConversationKey, ring: int, tracer: Tracer) -> AbstractContextManager[Span]:
        """The span of a job of ``key`` starting (current while it plans and sends its first
        stage, whose task continues its trace): a new trace linked to its requests, whose
        contexts it takes from Redis now (a Redis error only loses the links)."""
        if not tracer.enabled:
            return tracer.span(JOB_SPAN)
        try:
            linked, count, expired = self.take(key)
        except _ERRORS as exc:
            log.debug("trace contexts of the job of %s not read: %s", key, exc)
            linked, count, expired = [], 0, 0
        attributes = {
            **conversation_attributes(key),
            "ctxcore.job.ring": ring,
            "ctxcore.job.requests": count,
            "ctxcore.job.linked_requests": len(linked),
            "ctxcore.job.expired_contexts": expired,
        }
        return tracer.span(JOB_SPAN, attributes, root=True, links=linked)
