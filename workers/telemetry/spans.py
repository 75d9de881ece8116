"""The spans of the fast path and of compaction stages: their names and attributes.

Attribute names: ``gen_ai.conversation.id`` (the OpenTelemetry GenAI conventions' name for
a conversation), ``ctxcore.tenant.id``, then ``ctxcore.<operation>.<what>``. Every helper
is one ``with`` at its call site; with ``NO_TRACER`` the span is ``NO_SPAN`` (one shared
context manager, nothing allocated) and the attributes are never computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import httpx

from ctxcore.assemble import WindowResult
from ctxcore.coordinator import CoordinatorResult
from ctxcore.pipeline import Stage
from ctxcore.state import ConversationKey
from ctxcore.telemetry import AttributeValue, Span, Tracer

__all__ = [
    "WINDOW_SPAN",
    "append_span",
    "conversation_attributes",
    "describe_append",
    "describe_window",
    "traced_stage",
    "upstream_span",
    "window_span",
]

WINDOW_SPAN = "ctxcore.window"
APPEND_SPAN = "ctxcore.append"
STAGE_SPAN = "ctxcore.compaction.stage"
UPSTREAM_SPAN = "ctxcore.proxy.upstream"


def conversation_attributes(key: ConversationKey) -> dict[str, AttributeValue]:
    """The tenant and conversation, on every span of ``key``."""
    return {"ctxcore.tenant.id": key.tenant_id, "gen_ai.conversation.id": key.conversation_id}


def window_span(
    tracer: Tracer, key: ConversationKey, budget_tokens: int, source: str
) -> AbstractContextManager[Span]:
    """The span of one window request (``source``: ``api`` or ``proxy``); the rule chain
    adds ``ctxcore.rules_applied`` (the rules that changed the window) while it is current."""
    if not tracer.enabled:
        return tracer.span(WINDOW_SPAN)
    return tracer.span(
        WINDOW_SPAN,
        {
            **conversation_attributes(key),
            "ctxcore.window.budget_tokens": budget_tokens,
            "ctxcore.window.source": source,
        },
    )


def describe_window(span: Span, result: WindowResult) -> None:
    """What the window served: tokens, fallback, compaction status, elided ranges."""
    served: dict[str, AttributeValue] = {
        "ctxcore.window.tokens_served": result.stats.total_tokens,
        "ctxcore.window.messages_served": result.stats.total_messages,
        "ctxcore.window.raw_tokens": result.raw_tokens,
        "ctxcore.window.fallback_applied": result.fallback_applied,
        "ctxcore.window.elided_ranges": len(result.elided_ranges),
        "ctxcore.window.state_version": result.state_version,
        "ctxcore.compaction.status": result.compaction,
    }
    for name, value in served.items():
        span.set(name, value)
    if result.compaction_detail.hold is not None:
        span.set("ctxcore.compaction.hold", result.compaction_detail.hold.reason)


def append_span(tracer: Tracer, key: ConversationKey, messages: int) -> AbstractContextManager[Span]:
    """The span of one append of ``messages`` messages."""
    if not tracer.enabled:
        return tracer.span(APPEND_SPAN)
    return tracer.span(APPEND_SPAN, {**conversation_attributes(key), "ctxcore.append.messages": messages})


def describe_append(span: Span, ids: Sequence[str], replay: bool) -> None:
    """What the append stored: how many ids, whether it was a replay of one that succeeded."""
    span.set("ctxcore.append.ids", len(ids))
    span.set("ctxcore.append.replay", replay)


def traced_stage(
    tracer: Tracer,
    key: ConversationKey,
    stage: Stage,
    run: Callable[[ConversationKey, Stage], CoordinatorResult],
) -> CoordinatorResult:
    """``run(key, stage)`` in a span of the stage: its kind, outcome, tokens before and after,
    summariser calls and tokens, duration (the summariser calls are its child spans)."""
    if not tracer.enabled:
        return run(key, stage)
    attributes = {
        **conversation_attributes(key),
        "ctxcore.stage.kind": stage.kind,
        "ctxcore.stage.based_on_version": stage.based_on_version,
    }
    with tracer.span(STAGE_SPAN, attributes) as span:
        started = time.perf_counter()
        result = run(key, stage)
        done: dict[str, AttributeValue] = {
            "outcome": result.outcome,
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "summariser_calls": result.model_calls,
            "summariser_input_tokens": result.input_tokens,
            "summariser_output_tokens": result.output_tokens,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "state_version": result.state.version,
        }
        for name, value in done.items():
            span.set(f"ctxcore.stage.{name}", value)
        if result.error_kind is not None:
            span.set("error.type", result.error_kind)
        if result.detail:
            span.set("ctxcore.stage.detail", result.detail[:300])
        return result


def upstream_span(
    tracer: Tracer, request: httpx.Request, body: Mapping[str, Any], key: ConversationKey | None
) -> AbstractContextManager[Span]:
    """The span of the proxy's call to its upstream (the URL without credentials: the API
    key travels in a header, never in the span)."""
    if not tracer.enabled:
        return tracer.span(UPSTREAM_SPAN)
    attributes = conversation_attributes(key) if key is not None else {}
    model = body.get("model")
    attributes.update(
        {
            "http.request.method": request.method,
            "server.address": request.url.host,
            "url.full": str(request.url.copy_with(username=None, password=None, query=None)),
            "gen_ai.operation.name": "chat",
            "ctxcore.proxy.stream": body.get("stream") is True,
        }
    )
    if isinstance(model, str):
        attributes["gen_ai.request.model"] = model
    return tracer.span(UPSTREAM_SPAN, attributes)
