"""The message contract: what a message must be before anything stores it.

The HTTP append, the proxy and ``ModelContext.add_messages`` check the same rules, so a
message that one entry point (or one backend) accepts reads back everywhere:

* every string (content, content parts, names, ids, tool calls, metadata keys and values)
  is valid Unicode: no lone surrogate (``"\\ud800"``), which no UTF-8 store can hold;
* ``metadata`` (which keeps a message's unknown keys under ``metadata["extra"]``), each
  content part and the extra fields of ``usage_metadata`` nest at most
  ``MAX_NESTING_DEPTH`` (32) levels of objects and arrays, counting the value itself
  (``{"a": {}}`` is 2 levels): the stores' JSON readers stop near 200 levels and a window
  must never hold a message it cannot read back;
* they hold JSON values only: objects with string keys, arrays, strings, finite numbers,
  booleans and null;
* the message survives a JSON round trip through the stores' encoding unchanged.

The protocol rules an append must keep (a tool result answers a call of the assistant
message right before it, and so on) are ``ctxcore.protocol.append_violation``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from ctxcore.errors import InvalidMessageError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, messages_from_json, messages_to_json

__all__ = [
    "MAX_NESTING_DEPTH",
    "check_json_value",
    "check_message",
    "check_messages_contract",
    "check_tools",
    "json_problem",
]

MAX_NESTING_DEPTH = 32

_JSON_SCALARS = (str, bool, int, float, type(None))
_SHOWN_PATH = 80


def _string_problem(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"holds a lone surrogate ({text[exc.start]!r} at character {exc.start}): "
            "strings must be valid Unicode"
        )
    return None


def json_problem(value: Any, max_depth: int = MAX_NESTING_DEPTH) -> tuple[str, str] | None:
    """``(path, rule)`` of the first part of ``value`` that is not a JSON value the stores
    can hold (see the module docstring), else None. ``path`` is relative to ``value``
    (``""``, ``".a[2]"``). Iterative: a value nested thousands of levels deep is refused at
    ``max_depth + 1`` without recursing."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = _string_problem(item)
            if problem is not None:
                return path, problem
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, f"{item!r} is not a JSON number (only finite numbers are)"
        elif isinstance(item, _JSON_SCALARS):
            continue
        elif isinstance(item, dict | list):
            if depth + 1 > max_depth:
                return path, f"nests deeper than {max_depth} levels of objects and arrays"
            if isinstance(item, list):
                stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in reversed(list(enumerate(item))))
                continue
            for k in reversed(list(item)):
                if not isinstance(k, str):
                    return path, f"object key {k!r} is not a string"
                key_problem = _string_problem(k)
                if key_problem is not None:
                    return path, f"a key {key_problem}"
                stack.append((item[k], f"{path}.{k}", depth + 1))
        else:
            return (
                path,
                f"a {type(item).__name__} is not a JSON value (objects, arrays, strings, numbers, booleans, null)",
            )
    return None


def check_json_value(value: Any, field: str, index: int = -1, max_depth: int = MAX_NESTING_DEPTH) -> None:
    """``InvalidMessageError`` at ``field`` (and ``index``) unless ``value`` is a JSON value
    within ``max_depth`` levels; used for the requests' ``tools`` too."""
    problem = json_problem(value, max_depth)
    if problem is not None:
        path, rule = problem
        if len(path) > _SHOWN_PATH:  # 32 levels of ".k" or "[0]": the head says where
            path = path[:_SHOWN_PATH] + "..."
        raise InvalidMessageError(index, f"{field}{path}", rule)


def _strings(message: AnyMessage) -> Iterator[tuple[str, str | None]]:
    yield "name", message.name
    yield "message_id", message.message_id
    yield "context_message_id", message.context_message_id
    if isinstance(message.content, str):
        yield "content", message.content
    if isinstance(message, AssistantMessage):
        for pos, call in enumerate(message.tool_calls):
            field = f"tool_calls[{pos}]"
            yield f"{field}.id", call.id
            yield f"{field}.name", call.name
            yield f"{field}.arguments", call.arguments
            yield f"{field}.type", call.type
        if message.usage_metadata is not None:
            yield "usage_metadata.model_name", message.usage_metadata.model_name
    if isinstance(message, ToolMessage):
        yield "tool_call_id", message.tool_call_id


def check_message(index: int, message: AnyMessage, *, stored: bool = True) -> None:
    """``InvalidMessageError`` naming ``index``, the field and the rule the message breaks.

    ``stored=False`` (system messages, sent with each window and never logged) skips the
    round trip through the stores' encoding: the other rules keep the answer serialisable."""
    for field, text in _strings(message):
        if text is not None:
            problem = _string_problem(text)
            if problem is not None:
                raise InvalidMessageError(index, field, problem)
    if isinstance(message.content, list):
        for pos, part in enumerate(message.content):
            check_json_value(part, f"content[{pos}]", index)
    check_json_value(message.metadata, "metadata", index)
    if isinstance(message, AssistantMessage) and message.usage_metadata is not None:
        check_json_value(message.usage_metadata.model_extra or {}, "usage_metadata", index)
    if not stored:
        return
    # The stores' own encoding, both ways: what is stored must read back as it was given.
    try:
        back = messages_from_json(messages_to_json([message]))
    except (PydanticSerializationError, ValidationError, ValueError) as exc:
        raise InvalidMessageError(index, "message", f"cannot be stored as JSON: {exc}") from None
    if back != [message]:
        raise InvalidMessageError(
            index, "message", "does not read back unchanged from JSON (e.g. a tuple where a list belongs)"
        )


def check_messages_contract(messages: Sequence[AnyMessage], *, stored: bool = True) -> None:
    """``check_message`` for each message, in order."""
    for i, message in enumerate(messages):
        check_message(i, message, stored=stored)


def check_tools(tools: Sequence[Any]) -> None:
    """``InvalidMessageError`` (field ``tools[i]...``) unless each tool definition is a JSON
    object within ``MAX_NESTING_DEPTH`` levels of valid Unicode."""
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidMessageError(-1, f"tools[{i}]", "a tool definition must be an object")
        check_json_value(tool, f"tools[{i}]")
