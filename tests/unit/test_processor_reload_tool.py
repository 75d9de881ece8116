"""The reload_original_context_messages tool and ModelContext.reload."""

from __future__ import annotations

import json

import pytest

from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.errors import InvalidKeyError
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage, from_openai
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.processors.reload_tool import (
    RELOAD_TOOL_NAME,
    execute_reload_tool,
    reload_tool_definition,
    reload_tool_message,
)

OUTPUT = "line of output\n" * 100


@pytest.fixture
def offloaded() -> tuple[ModelContext, str]:
    ctx = ContextEngine({"strict_processors": True}).create_context(
        "c", processors=[("MessageOffloader", {"tokens_threshold": 1, "keep_last_round": False})]
    )
    call = ToolCall(id="1", name="bash", arguments="{}")
    ctx.add_messages(
        [
            UserMessage(content="go"),
            AssistantMessage(content="", tool_calls=[call]),
            ToolMessage(content=OUTPUT, tool_call_id="1"),
        ]
    )
    match = OFFLOAD_MARKER_RE.search(str(ctx.get_messages()[2].content))
    assert match
    return ctx, match.group(1)


def test_definition_is_an_openai_function_tool() -> None:
    definition = reload_tool_definition()
    assert definition["type"] == "function"
    assert definition["function"]["name"] == RELOAD_TOOL_NAME
    assert definition["function"]["parameters"]["required"] == ["handle"]
    definition["function"]["name"] = "changed"
    assert reload_tool_definition()["function"]["name"] == RELOAD_TOOL_NAME


def test_executing_the_tool_returns_the_original_messages(offloaded: tuple[ModelContext, str]) -> None:
    ctx, handle = offloaded
    for arguments in (json.dumps({"handle": handle}), {"offload_handle": handle}):
        restored = from_openai(json.loads(execute_reload_tool(ctx, arguments)))
        assert restored[0].content == OUTPUT and restored[0].role == "tool"
    reply = reload_tool_message(
        ctx, ToolCall(id="r1", name=RELOAD_TOOL_NAME, arguments=json.dumps({"handle": handle}))
    )
    assert reply.tool_call_id == "r1" and OUTPUT.strip() in json.loads(str(reply.content))[0]["content"]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("not json", "pass the handle"),
        ("{}", "pass the handle"),
        ('{"handle": "../../x"}', "not an offload handle"),
    ],
)
def test_bad_arguments_give_the_model_an_error_text(
    offloaded: tuple[ModelContext, str], arguments: str, error: str
) -> None:
    assert error in execute_reload_tool(offloaded[0], arguments)


def test_unknown_handles_reload_nothing_and_malformed_ones_raise(offloaded: tuple[ModelContext, str]) -> None:
    ctx, _ = offloaded
    assert ctx.reload("0123456789abcdef") == []
    assert "nothing is stored" in execute_reload_tool(ctx, {"handle": "0123456789abcdef"})
    with pytest.raises(InvalidKeyError):
        ctx.reload("../../etc/passwd")


def test_offloads_are_scoped_to_their_conversation(offloaded: tuple[ModelContext, str]) -> None:
    ctx, handle = offloaded
    engine_store = ctx.offload_store
    other = ContextEngine(offload_store=engine_store).create_context("other")
    assert other.reload(handle) == []
