"""A ready tool an agent can give its model: ``reload_original_context_messages(handle)``.

Offload markers in the window name a handle; when the model needs the full text back it
calls this tool, and the agent answers with ``execute_reload_tool``.

    tools = [reload_tool_definition(), ...]
    ...
    for call in reply.tool_calls:
        if call.name == RELOAD_TOOL_NAME:
            ctx.add_messages(reload_tool_message(ctx, call))
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ctxcore.errors import InvalidKeyError
from ctxcore.json_text import loads_shallow
from ctxcore.messages import ToolCall, ToolMessage, to_openai

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext

__all__ = ["RELOAD_TOOL_NAME", "execute_reload_tool", "reload_tool_definition", "reload_tool_message"]

RELOAD_TOOL_NAME = "reload_original_context_messages"

_DEFINITION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RELOAD_TOOL_NAME,
        "description": (
            "Fetch the full original of content that was shortened in this conversation. "
            "Shortened content ends with a marker like [[OFFLOAD: handle=<hex>, type=...]]; "
            "pass that handle to get the original messages back verbatim."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "handle": {
                    "type": "string",
                    "description": "The hex handle from an [[OFFLOAD: handle=...]] marker.",
                }
            },
            "required": ["handle"],
            "additionalProperties": False,
        },
    },
}


def reload_tool_definition() -> dict[str, Any]:
    """The OpenAI tool definition (a fresh copy each call)."""
    return copy.deepcopy(_DEFINITION)


def _handle_of(arguments: str | Mapping[str, Any]) -> str | None:
    if isinstance(arguments, str):
        try:
            arguments = loads_shallow(arguments or "{}")
        except ValueError:
            return None
    if not isinstance(arguments, Mapping):
        return None
    # The Java reference names the argument offload_handle; accept both spellings.
    handle = arguments.get("handle", arguments.get("offload_handle"))
    return handle.strip() if isinstance(handle, str) else None


def execute_reload_tool(ctx: ProcessorContext, arguments: str | Mapping[str, Any]) -> str:
    """Run the tool: the original messages as a JSON list of OpenAI messages, or an error text.

    Never raises for bad input: the model gets a message it can act on instead.
    """
    handle = _handle_of(arguments)
    if not handle:
        return 'error: pass the handle from an [[OFFLOAD: handle=...]] marker as {"handle": "..."}'
    try:
        messages = ctx.reload(handle)
    except InvalidKeyError:
        return f"error: {handle!r} is not an offload handle (expected lowercase hex)"
    if not messages:
        return f"error: nothing is stored under handle {handle}"
    return json.dumps(to_openai(messages), ensure_ascii=False)


def reload_tool_message(ctx: ProcessorContext, call: ToolCall) -> ToolMessage:
    """The tool result message answering ``call``."""
    return ToolMessage(
        content=execute_reload_tool(ctx, call.arguments), tool_call_id=call.id, name=RELOAD_TOOL_NAME
    )
