"""Text renderings of messages for prompts and truncation: compact, one line of header each."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, message_text

__all__ = ["head_tail", "serialize_messages"]


def serialize_message(message: AnyMessage, label: str | None = None) -> str:
    """``[id] role=R | tool_calls=... | tool_call_id=X | compress_level=lN | content=...``."""
    parts = [f"[{label if label is not None else message.context_message_id or '-'}] role={message.role}"]
    if isinstance(message, AssistantMessage) and message.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        parts.append(f"tool_calls={calls}")
    if isinstance(message, ToolMessage):
        parts.append(f"tool_call_id={message.tool_call_id}")
    level = message.metadata.get("compress_level")
    if isinstance(level, int):
        parts.append(f"compress_level=l{level}")
    parts.append(f"content={message_text(message)}")
    return " | ".join(parts)


def serialize_messages(messages: Sequence[AnyMessage]) -> str:
    """One serialized message per line (``(none)`` for no messages)."""
    if not messages:
        return "(none)"
    return "\n".join(serialize_message(m) for m in messages)


def head_tail(text: str, keep_chars: int, head_ratio: float, marker: str) -> str:
    """``text`` cut to ``keep_chars`` characters: a head share and the tail, joined by ``marker``."""
    if keep_chars >= len(text):
        return text
    keep_chars = max(keep_chars, 0)
    head = int(keep_chars * head_ratio)
    tail = keep_chars - head
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail :] if tail else ''}"
