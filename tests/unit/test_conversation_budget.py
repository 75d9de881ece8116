"""A window's system messages and tools are not the conversation's: workers compact to the
room they leave (``conversation_budget``), so a big system prompt neither makes every window
over its budget nor asks for a compaction on every window."""

from __future__ import annotations

import json

import pytest

from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.errors import BudgetExceeded
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.state.budget import conversation_budget
from ctxcore.summarize import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from workers.service import ContextService, InlineQueue

COUNTER = TiktokenCounter()
KEY = ConversationKey("acme", "big-prompt")
# A house manual in the system prompt, about 40% of the budget below.
SYSTEM = [
    SystemMessage(content="\n".join(f"Rule {i}: always check clause {i} before acting." for i in range(120)))
]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
BUDGET = 4_000


def step(i: int) -> list[AnyMessage]:
    call = ToolCall(
        id=f"c{i}", name="bash", arguments=json.dumps({"command": f"grep -n item_{i} src/app.py"})
    )
    return [
        AssistantMessage(content=f"Looking for item_{i}.", tool_calls=[call]),
        ToolMessage(tool_call_id=call.id, content=" ".join(f"{i}:{w} value_{i}_{w}" for w in range(25))),
    ]


def run_agent(steps: int) -> tuple[list[tuple[bool, bool]], MemoryStateStore]:
    """Per window of a run of ``steps`` steps: whether it was cut to fit (the fallback) and
    whether it asked for a compaction (run at once, as an idle worker would)."""
    states, log = MemoryStateStore(), MemoryMessageLog()
    coordinator = Coordinator(states, log, COUNTER, model_for=lambda _key: ExtractiveModel())
    asked: list[ConversationKey] = []

    def compact(key: ConversationKey) -> None:
        asked.append(key)
        exhausted: list[str] = []
        while (stage := coordinator.plan(key, exhausted=exhausted)) is not None:
            if coordinator.run_stage(key, stage).outcome != "compressed":
                exhausted.append(stage.kind)

    service = ContextService(Settings(), states, log, None, InlineQueue(on_request=compact), counter=COUNTER)
    service.append(KEY, [UserMessage(content="Fix the lookup of every item in src/app.py.")])
    windows = []
    for i in range(steps):
        service.append(KEY, step(i))
        before = len(asked)
        window = service.get_window(KEY, BUDGET, SYSTEM, TOOLS, own_tools=False)
        assert window.stats.total_tokens <= BUDGET
        windows.append((window.fallback_applied, len(asked) > before))
    return windows, states


def test_workers_compact_to_the_room_the_system_prompt_and_tools_leave() -> None:
    fixed = COUNTER.count_messages(SYSTEM) + COUNTER.count_tools(TOOLS)
    assert 0.3 * BUDGET < fixed < 0.5 * BUDGET
    windows, states = run_agent(60)
    assert states.get_budget(KEY) == BUDGET - fixed
    # A compaction lands at 0.8 of the room, so only a window that asks for one (its step
    # took the view over the budget; the worker has not run yet) is cut to fit, and the
    # room's chunk (a fifth of it) holds a few steps before the next one. With the request's
    # budget every compaction landed at 0.8 of it for the messages alone: every window after
    # the first compaction was cut, and asked for another. The chunk (~490 tokens) holds
    # about two of these steps (~280 tokens each).
    assert all(asked for cut, asked in windows if cut)
    assert 0 < sum(asked for _, asked in windows) <= 60 // 2


def test_a_system_prompt_and_tools_over_the_budget_are_refused_before_anything_is_recorded() -> None:
    states, log = MemoryStateStore(), MemoryMessageLog()
    service = ContextService(Settings(), states, log, None, InlineQueue(), counter=COUNTER)
    service.append(KEY, [UserMessage(content="hello")])
    with pytest.raises(BudgetExceeded, match="cannot hold system messages"):
        service.get_window(KEY, 500, SYSTEM, TOOLS, own_tools=False)
    assert states.get_budget(KEY) is None


def test_the_conversation_budget_is_the_room_system_messages_and_tools_leave() -> None:
    fixed = COUNTER.count_messages(SYSTEM) + COUNTER.count_tools(TOOLS)
    assert conversation_budget(BUDGET, SYSTEM, TOOLS, COUNTER) == BUDGET - fixed
    assert conversation_budget(BUDGET, [], [], COUNTER) == BUDGET
    with pytest.raises(BudgetExceeded):
        conversation_budget(fixed, SYSTEM, TOOLS, COUNTER)
