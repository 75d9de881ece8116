"""What each inspector page shows, read from the runtime's stores (plain dicts for the
templates, which escape every value)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ctxcore.errors import CtxcoreError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, message_text
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.state.base import format_log_id, parse_log_id
from workers.api_common.state import ApiState
from workers.holds import status_of
from workers.spend import summariser_cap

__all__ = ["MAX_TEXT", "conversation_page", "conversation_rows", "diff_page", "message_rows"]

MAX_TEXT = 4000  # characters of one message shown (the API serves it whole)
RAW_LOG_ROWS = 200


def _message(message: AnyMessage) -> dict[str, Any]:
    text = message_text(message)
    handles = [m.group(1) for m in OFFLOAD_MARKER_RE.finditer(text)]
    if isinstance(message, AssistantMessage) and message.tool_calls:
        text += "".join(f"\n[tool call {c.name} {c.id}]" for c in message.tool_calls)
    if isinstance(message, ToolMessage):
        text = f"[result of {message.tool_call_id}] {text}"
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + f"… ({len(text) - MAX_TEXT} more characters)"
    return {"id": message.context_message_id or "", "role": message.role, "text": text, "offloads": handles}


def message_rows(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """Messages as the templates show them (role, log id, text cut at ``MAX_TEXT``, and the
    offload handles their markers name)."""
    return [_message(m) for m in messages]


def _status(api: ApiState, key: ConversationKey) -> tuple[str, Any]:
    record = api.runtime.failures.get(key)
    status = status_of(
        record,
        backoff_seconds=api.settings.worker.no_progress_backoff_seconds,
        cap_tokens=summariser_cap(api.settings, key.tenant_id),
    )
    return status, record.detail


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "not kept"  # Redis without a retention keeps no activity stamp
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def conversation_rows(
    api: ApiState, tenant: str, after: str | None, prefix: str, limit: int = 50
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the tenant's conversations (ids starting with ``prefix``) and the next page's ``after``."""
    rt = api.runtime
    ids = rt.log.list_conversations(tenant, after, limit)
    rows = []
    for cid in ids:
        if prefix and not cid.startswith(prefix):
            continue
        key = ConversationKey(tenant, cid)
        state = rt.state_store.load(key)
        last = rt.log.last_id(key)
        status, detail = _status(api, key)
        # The store's own figures: the stored counts' running total and the retention's
        # stamp, so a page of 50 reads no entry (and tokenizes nothing).
        overview = rt.log.overview(key)
        rows.append(
            {
                "id": cid,
                "messages": parse_log_id(last) if last else 0,
                "tokens": f"{overview.tokens:,}" if overview.tokens is not None else "not counted",
                "last_active": _when(overview.last_active),
                "version": state.version if state else 0,
                "blocks": len(state.blocks) if state else 0,
                "status": status,
                "reason": detail.reason,
                "budget": rt.state_store.get_budget(key),
            }
        )
    return rows, ids[-1] if len(ids) == limit else None


def conversation_page(api: ApiState, key: ConversationKey, budget: int | None) -> dict[str, Any]:
    """The conversation page: status, blocks, the preview window at ``budget`` and the raw log."""
    rt = api.runtime
    state = rt.state_store.load(key) or CompressionState()
    status, detail = _status(api, key)
    recorded = rt.state_store.get_budget(key)
    preview_budget = budget or recorded or api.settings.budget_for_tenant(key.tenant_id)
    window: dict[str, Any] | None = None
    window_error = None
    try:
        result = api.service.get_window(key, preview_budget, preview=True)
        rows = message_rows(result.messages)
        cleared = sum(len(r["offloads"]) for r in rows)
        window = {"messages": rows, "total_tokens": result.stats.total_tokens, "cleared": cleared}
    except CtxcoreError as exc:  # a budget that cannot hold the anchors, a state that cannot be served
        window_error = str(exc)
    last = rt.log.last_id(key)
    cursor = format_log_id(max(parse_log_id(last) - RAW_LOG_ROWS, 0)) if last else None
    blocks = [
        {
            "level": b.level,
            "first_id": b.first_id,
            "last_id": b.last_id,
            "tokens_before": b.tokens_before,
            "tokens_after": b.tokens_after,
            "model": b.model,
            "created_at": b.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "messages": message_rows(b.messages),
        }
        for b in state.blocks
    ]
    return {
        "cid": key.conversation_id,
        "compaction": status,
        "reason": detail.reason,
        "hold_why": detail.hold.why if detail.hold else None,
        "last_error": detail.last_error,
        "version": state.version,
        "budget": recorded,
        "last_id": last,
        "blocks": blocks,
        "preview_budget": preview_budget,
        "window": window,
        "window_error": window_error,
        "log": message_rows(rt.log.read_after(key, cursor, RAW_LOG_ROWS)) if last else [],
    }


def _block_text(state: CompressionState) -> dict[str, dict[str, Any]]:
    return {
        b.block_id: {
            "level": b.level,
            "first_id": b.first_id,
            "last_id": b.last_id,
            "tokens_after": b.tokens_after,
            "text": "\n".join(r["text"] for r in message_rows(b.messages)),
        }
        for b in state.blocks
    }


def diff_page(key: ConversationKey, a: CompressionState, b: CompressionState) -> dict[str, Any]:
    """What differs between kept versions ``a`` and ``b`` (blocks by id, cursor, pins)."""
    left, right = _block_text(a), _block_text(b)
    return {
        "cid": key.conversation_id,
        "a": a.version,
        "b": b.version,
        "same": a.version == b.version,
        "covered": (a.covered_until, b.covered_until),
        "pinned": (len(a.pinned), len(b.pinned)),
        "removed": [v for k, v in left.items() if k not in right],
        "added": [v for k, v in right.items() if k not in left],
        "kept": len(left.keys() & right.keys()),
    }
