"""Agents SDK (Responses) input items <-> ctxcore log messages.

One log message holds one or more items: a model turn's assistant text and its function
calls become one assistant message with tool calls (the chat format needs them together);
a user message or a function-call output is one message each. Each message keeps, in
``metadata["agents_items"]``, the items it came from minus the fields its chat content
already holds, so ``message_items`` gives the exact items back (the SDK compares the
session's items by content when it rewinds a retried request).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any

from agents.models.chatcmpl_converter import Converter
from pydantic import BaseModel

from ctxcore.errors import UnsupportedItemError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, UserMessage, from_openai

__all__ = [
    "AGENTS_ITEMS",
    "group_items",
    "item_dict",
    "item_hash",
    "items_message",
    "message_items",
    "window_items",
]

AGENTS_ITEMS = "agents_items"


def item_dict(index: int, item: Any) -> dict[str, Any]:
    """An input item as a plain dict (items arrive as dicts or SDK pydantic objects)."""
    if isinstance(item, Mapping):
        return dict(item)
    if isinstance(item, BaseModel):
        return dict(item.model_dump(exclude_unset=True, mode="json"))
    raise UnsupportedItemError(index, type(item).__name__, "not a Responses input item")


def item_hash(item: Mapping[str, Any]) -> str:
    """A digest of an item's content (key order does not matter)."""
    text = json.dumps(item, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _kind(index: int, item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind in (None, "message"):
        role = item.get("role")
        if role in ("user", "assistant"):
            return str(role)
        raise UnsupportedItemError(
            index,
            f"message with role {role!r}",
            "only user and assistant messages are logged: put instructions in the Agent's instructions",
        )
    if kind in ("function_call", "function_call_output"):
        return str(kind)
    raise UnsupportedItemError(
        index,
        str(kind),
        "this item type has no chat-format equivalent ctxcore can log (reasoning items and "
        "hosted-tool calls are not supported; use function tools)",
    )


def group_items(items: Sequence[Mapping[str, Any]], start: int = 0) -> list[list[int]]:
    """Indices of ``items`` grouped into log messages: an assistant message and the function
    calls around it (a streamed turn may put its calls first) form one group."""
    groups: list[list[int]] = []
    open_turn = False  # the last group is an assistant turn that can take more calls
    has_text = False
    for i, item in enumerate(items):
        kind = _kind(start + i, item)
        if kind == "function_call" and open_turn:
            groups[-1].append(i)
        elif kind == "assistant" and open_turn and not has_text:
            groups[-1].append(i)
            has_text = True
        else:
            groups.append([i])
            open_turn = kind in ("assistant", "function_call")
            has_text = kind == "assistant"
    return groups


def _call_indices(items: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each item, how many ``function_call`` items come before it (its call's index in
    the chat message's ``tool_calls`` when it is one)."""
    return list(accumulate((int(item.get("type") == "function_call") for item in items), initial=0))[:-1]


def _stub(item: Mapping[str, Any], message: AnyMessage, call_index: int) -> dict[str, Any]:
    """The item without the field the message's chat content already holds."""
    stub = dict(item)
    if item.get("type") == "function_call_output" and item.get("output") == message.content:
        stub.pop("output")
        stub["_from"] = "output"
    elif item.get("type") == "function_call" and isinstance(message, AssistantMessage):
        if (
            call_index < len(message.tool_calls)
            and item.get("arguments") == message.tool_calls[call_index].arguments
        ):
            stub.pop("arguments")
            stub["_from"] = "arguments"
    elif isinstance(item.get("content"), str) and item.get("content") == message.content:
        stub.pop("content")
        stub["_from"] = "content"
    else:
        parts = item.get("content")
        if (
            isinstance(parts, list)
            and len(parts) == 1
            and isinstance(parts[0], Mapping)
            and parts[0].get("type") == "output_text"
            and parts[0].get("text") == message.content
        ):
            stub["content"] = [{k: v for k, v in parts[0].items() if k != "text"}]
            stub["_from"] = "output_text"
    return stub


def items_message(items: Sequence[Mapping[str, Any]], message_id: str) -> AnyMessage:
    """One group of items as a log message (``Converter.items_to_messages`` does the chat part)."""
    (chat,) = Converter.items_to_messages(list(items))  # type: ignore[arg-type]
    data: dict[str, Any] = dict(chat)
    if data.get("role") == "assistant" and data.get("content") is None:
        data["content"] = ""
    (message,) = from_openai([{**data, "message_id": message_id}])
    stubs = [_stub(item, message, n) for item, n in zip(items, _call_indices(items), strict=True)]
    return message.model_copy(update={"metadata": {**message.metadata, AGENTS_ITEMS: stubs}})


def _restore(stub: Mapping[str, Any], message: AnyMessage, call_index: int) -> dict[str, Any]:
    item = {k: v for k, v in stub.items() if k != "_from"}
    source = stub.get("_from")
    if source in ("output", "content"):
        item[str(source)] = message.content
    elif source == "arguments" and isinstance(message, AssistantMessage):
        item["arguments"] = message.tool_calls[call_index].arguments
    elif source == "output_text":
        item["content"] = [{**item["content"][0], "text": message.content}]
    return item


def _input_content(content: Any) -> Any:
    """Chat content as Responses input content (text and image parts)."""
    if not isinstance(content, list):
        return content if content is not None else ""
    parts: list[Any] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "input_text", "text": part})
        elif part.get("type") == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            parts.append(part)
    return parts


def message_items(message: AnyMessage) -> list[dict[str, Any]]:
    """The items a log message stands for: exactly those logged, or (for messages logged
    some other way, and for windows whose content ctxcore rewrote) the chat equivalent."""
    stubs = message.metadata.get(AGENTS_ITEMS)
    if isinstance(stubs, list):
        return [_restore(stub, message, n) for stub, n in zip(stubs, _call_indices(stubs), strict=True)]
    if isinstance(message, UserMessage):
        return [{"role": "user", "content": _input_content(message.content)}]
    if isinstance(message, ToolMessage):
        return [{"type": "function_call_output", "call_id": message.tool_call_id, "output": message.text}]
    if isinstance(message, AssistantMessage):
        items: list[dict[str, Any]] = []
        if message.text or not message.tool_calls:
            items.append({"role": "assistant", "content": message.text})
        items += [
            {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
            for c in message.tool_calls
        ]
        return items
    return [{"role": "system", "content": message.text}]


def _assistant_id(message: AnyMessage, index: int) -> str:
    """The provider's id of the assistant turn when it was logged, else one derived from its
    log id (a chat-completions model then gets the text and calls as one message)."""
    for stub in message.metadata.get(AGENTS_ITEMS) or []:
        if isinstance(stub, Mapping) and stub.get("type") == "message" and isinstance(stub.get("id"), str):
            return str(stub["id"])
    return f"msg_ctxcore_{message.context_message_id or index}"


def window_items(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """A served window (system messages left out: they are the instructions) as input items.

    Built from the window's chat content, never from the logged items: ctxcore may have
    summarised, capped or offloaded what the model is shown.
    """
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            continue
        bare = message.model_copy(update={"metadata": {}})
        items = message_items(bare)
        if isinstance(message, AssistantMessage) and message.tool_calls and message.text:
            items[0] = {
                "type": "message",
                "role": "assistant",
                "id": _assistant_id(message, index),
                "status": "completed",
                "content": [{"type": "output_text", "text": message.text, "annotations": []}],
            }
        out += items
    return out
