"""Complete round trips: save_state carries offloads (format 2, format 1 still loads); a
token counter that raises falls back to len // 4 with one WARNING per counter instance."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from ctxcore.assemble import assemble_window
from ctxcore.coordinator import Coordinator
from ctxcore.engine import ContextEngine
from ctxcore.engine.snapshot import STATE_FORMAT
from ctxcore.errors import CtxcoreError
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state import CompressionState, ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import CounterBase, TiktokenCounter

BIG = "x" * 1500
OFFLOADER = [("MessageOffloader", {"keep_last_round": False, "tokens_threshold": 1, "trim_size": 10})]


def tool_step(call_id: str, content: str) -> list[AnyMessage]:
    return [
        AssistantMessage(content="", tool_calls=[ToolCall(id=call_id, name="bash")]),
        ToolMessage(content=content, tool_call_id=call_id),
    ]


def offloaded_context() -> tuple[Any, str]:
    ctx = ContextEngine({"strict_processors": True}).create_context("c", "s", processors=OFFLOADER)
    ctx.add_messages([UserMessage(content="go"), *tool_step("1", BIG), AssistantMessage(content="ok")])
    match = OFFLOAD_MARKER_RE.search(str(ctx.get_messages()[2].content))
    assert match is not None
    return ctx, match.group(1)


def test_save_state_carries_offloads_and_load_state_restores_them_elsewhere() -> None:
    ctx, handle = offloaded_context()
    state = json.loads(json.dumps(ctx.save_state()))
    assert state["format"] == STATE_FORMAT == 2
    assert list(state["offloads"]) == [handle]
    # A new engine has its own (empty) offload store
    other = ContextEngine({"strict_processors": True}).create_context("c", "s", processors=OFFLOADER)
    assert other.reload(handle) == []
    other.load_state(state)
    assert other.reload(handle) == ctx.reload(handle)
    assert other.reload(handle)[0].content == BIG
    # Loading again does not write twice (handles are content hashes: first write wins)
    assert other.offload_store.put_if_absent(other.key, handle, []) is False
    other.load_state(state)
    assert other.reload(handle)[0].content == BIG


def test_a_format_1_snapshot_still_loads() -> None:
    ctx, _ = offloaded_context()
    state = json.loads(json.dumps(ctx.save_state()))
    state["format"] = 1
    del state["offloads"]
    other = ContextEngine({"strict_processors": True}).create_context("c", "s", processors=OFFLOADER)
    other.load_state(state)
    assert other.get_raw_messages() == ctx.get_raw_messages()
    assert other.get_messages() == ctx.get_messages()
    for bad in (0, 3, None, "2"):
        with pytest.raises(CtxcoreError, match="format"):
            other.load_state({**state, "format": bad})


class RaisingCounter(CounterBase):
    """A custom counter with a bug: every count raises."""

    def count_text(self, text: str) -> int:
        raise RuntimeError("tokenizer crashed")

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        raise RuntimeError("tokenizer crashed")

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        raise RuntimeError("tokenizer crashed")


def counter_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and "len // 4" in r.getMessage()]


def test_a_raising_counter_falls_back_to_len_div_4_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    counter = RaisingCounter()
    ctx = ContextEngine().create_context("c", token_counter=counter)
    text = "word " * 400
    ctx.add_messages([UserMessage(content=text), AssistantMessage(content="ok")])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            window = ctx.get_context_window(system_messages=[SystemMessage(content="s")])
        stats = ctx.statistic()
    assert window.statistic.total_tokens > len(text) // 4
    assert window.statistic.user_message_tokens >= len(text) // 4
    assert stats.total_tokens > 0
    assert len(counter_warnings(caplog)) == 1
    assert "RaisingCounter" in counter_warnings(caplog)[0].getMessage()
    # Another instance of the same class gets its own warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        other = ContextEngine().create_context("d", token_counter=RaisingCounter())
        other.add_messages([UserMessage(content="q")])
        other.get_context_window()
    assert len(counter_warnings(caplog)) == 1


def test_a_raising_counter_does_not_stop_the_distributed_window_or_the_coordinator(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = RaisingCounter()
    key = ConversationKey("acme", "c")
    log = MemoryMessageLog()
    log.append(key, [UserMessage(content="task " * 50), AssistantMessage(content="answer " * 50)])
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            result = assemble_window(
                CompressionState(), log.read_after(key, None), 10_000, [], [], None, counter
            )
        coord = Coordinator(MemoryStateStore(), log, counter, model_for=lambda k: ExtractiveModel())
        coord.plan(key)
    assert result.stats.total_tokens > 0 and len(result.messages) == 2
    assert len(counter_warnings(caplog)) == 1


def test_built_in_counters_are_not_wrapped() -> None:
    from ctxcore.counting import tolerant

    counter = TiktokenCounter()
    assert tolerant(counter) is counter
    custom = RaisingCounter()
    assert tolerant(custom) is tolerant(custom)
    assert tolerant(custom).count_text("12345678") == 2
