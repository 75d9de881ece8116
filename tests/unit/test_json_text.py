"""JSON read from messages: nested too deep is not JSON, and nothing downstream fails on it."""

from __future__ import annotations

import json

import pytest

from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.json_text import MAX_JSON_DEPTH, loads_shallow
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.summarize import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from workers.service import ContextService, InlineQueue

DEEP_ARRAY = "[" * 50_000 + "]" * 50_000
DEEP_OBJECT = '{"a":' * 30_000 + "1" + "}" * 30_000


def test_json_nested_deeper_than_the_limit_is_not_json() -> None:
    assert loads_shallow('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_shallow(at_limit) is not None
    for bad in ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), DEEP_ARRAY, DEEP_OBJECT, "{oops"):
        with pytest.raises(ValueError):
            loads_shallow(bad)


def test_a_crafted_conversation_is_appended_served_and_compacted() -> None:
    # Arguments and results nested 30,000-50,000 deep: json.loads raises RecursionError,
    # which failed the summariser's stage on every compaction (and the conversation with it).
    counter = TiktokenCounter()
    key = ConversationKey("acme", "deep")
    states, log = MemoryStateStore(), MemoryMessageLog()
    coordinator = Coordinator(states, log, counter, model_for=lambda _key: ExtractiveModel())
    outcomes: list[str] = []

    def compact(k: ConversationKey) -> None:
        exhausted: list[str] = []
        while (stage := coordinator.plan(k, exhausted=exhausted)) is not None:
            result = coordinator.run_stage(k, stage)
            outcomes.append(result.outcome)
            if result.outcome != "compressed":
                exhausted.append(stage.kind)

    service = ContextService(Settings(), states, log, None, InlineQueue(on_request=compact), counter=counter)
    service.append(key, [UserMessage(content="Look the records up.")])
    for i in range(12):
        arguments = DEEP_ARRAY if i % 3 == 0 else json.dumps({"command": f"lookup {i} " + "x " * 200})
        content = DEEP_OBJECT if i % 2 == 0 else "row " * 400
        call = ToolCall(id=f"c{i}", name="lookup", arguments=arguments)
        batch: list[AnyMessage] = [
            AssistantMessage(content=f"Step {i}.", tool_calls=[call]),
            ToolMessage(tool_call_id=call.id, content=content),
        ]
        service.append(key, batch)
        assert service.get_window(key, 3_000).stats.total_tokens <= 3_000
    assert "compressed" in outcomes and "failed" not in outcomes
