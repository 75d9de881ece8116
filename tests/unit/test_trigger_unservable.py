"""The compaction trigger counts a tool result no window could serve whole (larger than the
room) at the cap once it is older than the newest step, as planning counts it: counted whole
it asked for a compaction on every window it stayed in the tail."""

from __future__ import annotations

import json

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.pipeline.sizing import unservable_tokens
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.tokens import TiktokenCounter
from workers.service import ContextService, InlineQueue

COUNTER = TiktokenCounter()
KEY = ConversationKey("acme", "huge-log")
BUDGET = 4_000
LOG = "\n".join(f"tests/test_core.py::test_case_{n} PASSED" for n in range(1500)) + "\nFAILED test_x - boom"


def step(i: int, output: str) -> list[AnyMessage]:
    call = ToolCall(id=f"c{i}", name="bash", arguments=json.dumps({"command": f"pytest -k case_{i}"}))
    return [
        AssistantMessage(content=f"Running case {i}.", tool_calls=[call]),
        ToolMessage(tool_call_id=call.id, content=output),
    ]


def test_only_older_results_larger_than_the_room_count_at_the_cap() -> None:
    messages = [
        UserMessage(content="Fix the failing test."),
        *step(0, LOG),
        *step(1, "ok " * 50),
        *step(2, LOG),
    ]
    whole = COUNTER.count_messages([messages[2]])
    assert whole > BUDGET
    # The first log counts at the cap (500); the newest step's log counts whole: compaction can
    # give it the room the older messages hold.
    assert unservable_tokens(messages, BUDGET, 500, COUNTER) == whole - 500
    assert unservable_tokens(messages, whole + 1, 500, COUNTER) == 0  # fits the room: whole
    assert unservable_tokens(messages, BUDGET, None, COUNTER) == 0  # no cap: nothing shed


def test_an_older_log_larger_than_the_room_does_not_ask_for_a_compaction_on_every_window() -> None:
    asked: list[ConversationKey] = []
    service = ContextService(
        Settings(),
        MemoryStateStore(),
        MemoryMessageLog(),
        None,
        InlineQueue(on_request=asked.append),
        counter=COUNTER,
    )
    service.append(KEY, [UserMessage(content="Fix the failing test.")])
    service.append(KEY, step(0, LOG))
    window = service.get_window(KEY, BUDGET)
    assert window.stats.total_tokens <= BUDGET
    assert len(asked) == 1  # newest: counted whole, a compaction could give it more room
    for i in range(1, 4):
        service.append(KEY, step(i, f"case {i} ok"))
        window = service.get_window(KEY, BUDGET)
        assert window.stats.total_tokens <= BUDGET
    assert len(asked) == 1  # older: at the cap, the view is far under the trigger
