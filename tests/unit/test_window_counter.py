"""WindowCounter: the same counts as its counter, each message object counted once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from ctxcore.counting import tolerant
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.tokens import CounterBase, EstimateCounter, TiktokenCounter
from ctxcore.window_counter import WindowCounter

MESSAGES: list[AnyMessage] = [
    UserMessage(content="fix the failing test in tests/test_dates.py"),
    AssistantMessage(
        content="", tool_calls=[ToolCall(id="c1", name="bash", arguments='{"command": "pytest -x"}')]
    ),
    ToolMessage(tool_call_id="c1", content="FAILED tests/test_dates.py::test_leap - AssertionError\n" * 40),
    AssistantMessage(content="The leap-year branch is off by one."),
]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


class Tally(CounterBase):
    """A counter that counts its own calls (no ``count_message``: requests only)."""

    def __init__(self) -> None:
        self.calls = 0

    def count_text(self, text: str) -> int:
        return len(text)

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        self.calls += 1
        return 7 * len(messages)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        self.calls += 1
        return 5 * len(tools)


class Spy(TiktokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.messages_counted = 0
        self.tools_counted = 0

    def count_message(self, message: AnyMessage) -> int:
        self.messages_counted += 1
        return super().count_message(message)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        self.tools_counted += 1
        return super().count_tools(tools)


@pytest.mark.parametrize("inner", [TiktokenCounter(), EstimateCounter()], ids=["tiktoken", "estimate"])
def test_it_counts_exactly_what_its_counter_counts(inner: TiktokenCounter | EstimateCounter) -> None:
    counter = WindowCounter(inner)
    for prefix in range(len(MESSAGES) + 1):
        assert counter.count_messages(MESSAGES[:prefix]) == inner.count_messages(MESSAGES[:prefix])
    assert [counter.count_message(m) for m in MESSAGES] == [inner.count_message(m) for m in MESSAGES]
    assert counter.count_tools(TOOLS) == inner.count_tools(TOOLS)
    assert counter.count_text("a few words") == inner.count_text("a few words")


def test_each_message_and_tool_list_is_counted_once_per_window() -> None:
    spy = Spy()
    counter = WindowCounter(spy)
    for _ in range(5):
        counter.count_messages(MESSAGES)
        counter.count_tools(list(TOOLS))  # a new list of the same definitions
    assert spy.messages_counted == len(MESSAGES)
    assert spy.tools_counted == 1
    # An equal but distinct message object is counted on its own.
    counter.count_message(MESSAGES[0].model_copy())
    assert spy.messages_counted == len(MESSAGES) + 1


def test_a_counter_without_single_message_counts_is_asked_for_each_request() -> None:
    tally = Tally()
    counter = WindowCounter(tally)
    assert counter.count_messages(MESSAGES) == 7 * len(MESSAGES)
    assert counter.count_messages(MESSAGES[:2]) == 14
    assert tally.calls == 2  # no priming known: requests are not composed from messages
    assert counter.count_message(MESSAGES[0]) == 7


def test_it_is_tolerant_already_and_a_failing_counter_is_estimated() -> None:
    class Broken(Tally):
        def count_messages(self, messages: Sequence[AnyMessage]) -> int:
            raise RuntimeError("tokenizer crashed")

    counter = WindowCounter(Broken())
    assert tolerant(counter) is counter
    assert counter.count_messages(MESSAGES) == EstimateCounter().count_messages(MESSAGES)
