"""The default chain and any chain of tight rules, as a property: the protocol and the
anchors survive whatever mix of tool steps, results and user turns comes in."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from ctxcore.processors import apply_rules, default_rule_chain
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import EstimateCounter
from ctxcore.window import check_window
from tests.unit.rules_chain_checks import assert_sound, with_ids

settings.register_profile(
    "ctxcore-rules", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
RULES_PROFILE = settings.get_profile("ctxcore-rules")
KEY = ConversationKey("t", "c")


BIG_LOG = "\n".join(
    [*(f"test_{i} PASSED" for i in range(60)), "test_x FAILED", "E   AssertionError", "1 failed"]
)
BIG_JSON = json.dumps([{"id": i, "name": f"item {i}", "tags": ["a", "b", "c"]} for i in range(80)])
BIG_DIFF = (
    "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,40 +1,40 @@\n"
    + "\n".join(f" same {i}" for i in range(40))
    + "\n-old\n+new"
)
CONTENTS = st.sampled_from(["ok", "", "short result", BIG_LOG, BIG_JSON, BIG_DIFF, "line\n" * 300])
TOOLS = st.sampled_from(["bash", "grep", "read_file", "search"])


@st.composite
def tool_step(draw: st.DrawFn, in_flight: bool = False) -> list[AnyMessage]:
    n = draw(st.integers(1, 3))
    # Ids come from a small pool: real agents reuse them across steps.
    ids = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=n, max_size=n, unique=True))
    calls = [
        ToolCall(id=i, name=draw(TOOLS), arguments=json.dumps({"q": draw(st.sampled_from(["x", "test_x"]))}))
        for i in ids
    ]
    results: list[AnyMessage] = [
        ToolMessage(
            content=draw(CONTENTS),
            tool_call_id=i,
            metadata={"is_error": True} if draw(st.integers(0, 9)) == 0 else {},
        )
        for i in draw(st.permutations(ids))
    ]
    if in_flight:
        results = results[: draw(st.integers(0, n - 1))]
    return [AssistantMessage(content=draw(st.sampled_from(["", "thinking"])), tool_calls=calls), *results]


@st.composite
def conversation(draw: st.DrawFn) -> list[AnyMessage]:
    messages: list[AnyMessage] = []
    if draw(st.booleans()):
        messages.append(UserMessage(content="<memory_block_dialogue>earlier work</memory_block_dialogue>"))
    n_turns = draw(st.integers(1, 6))
    for t in range(n_turns):
        messages.append(
            UserMessage(
                content=f"request {t}: " + draw(st.sampled_from(["fix test_x", "find item 7", BIG_LOG]))
            )
        )
        if draw(st.booleans()):
            messages.append(UserMessage(content="<system-reminder>stay on task</system-reminder>"))
        for _ in range(draw(st.integers(0, 4))):
            messages += draw(tool_step())
        last = t == n_turns - 1
        ending = draw(st.sampled_from(["final", "in_flight", "open"] if last else ["final"]))
        if ending == "final":
            messages.append(AssistantMessage(content=f"answer {t}"))
        elif ending == "in_flight":
            messages += draw(tool_step(in_flight=True))
    return with_ids(messages)


@RULES_PROFILE
@given(messages=conversation(), window=st.sampled_from([300, 2_000, 16_000]))
def test_default_chain_never_breaks_the_protocol_or_drops_an_anchor(
    messages: list[AnyMessage], window: int
) -> None:
    assert check_window(messages) == []
    store = MemoryOffloadStore()
    out = apply_rules(
        messages, default_rule_chain(window), EstimateCounter(), store, KEY, budget_tokens=window
    )
    assert_sound(messages, out, store, KEY)
    assert (
        apply_rules(messages, default_rule_chain(window), EstimateCounter(), store, KEY, budget_tokens=window)
        == out
    )


TIGHT_RULES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "MessageOffloader": st.fixed_dictionaries(
        {
            "tokens_threshold": st.just(1),
            "large_message_threshold": st.sampled_from([50, 500]),
            "trim_size": st.just(10),
            "keep_last_round": st.booleans(),
            "offload_message_type": st.just(["user", "assistant", "tool"]),
        }
    ),
    "MessageSummaryOffloader": st.fixed_dictionaries(
        {"add_message_threshold_ratio": st.sampled_from([0.01, 0.1])}
    ),
    "ToolResultBudgetProcessor": st.fixed_dictionaries(
        {
            "tokens_threshold": st.integers(1, 300),
            "large_message_threshold": st.just(20),
            "trim_size": st.just(10),
        }
    ),
    "ToolResultWindowProcessor": st.fixed_dictionaries(
        {
            "tool_names": st.just(["bash", "grep"]),
            "keep_last_k": st.integers(1, 2),
            "min_offload_chars": st.sampled_from([0, 300]),
        }
    ),
    "MicroCompactProcessor": st.fixed_dictionaries(
        {
            "compactable_tool_names": st.just(["*"]),
            "keep_recent_per_tool": st.integers(0, 2),
            "trigger_threshold": st.integers(1, 2),
        }
    ),
    "CompactCompletedToolTurns": st.fixed_dictionaries({"keep_recent_turns": st.integers(0, 2)}),
    "WindowLimit": st.fixed_dictionaries(
        {
            "max_attached_turns": st.none() | st.integers(1, 3),
            "max_attached_messages": st.none() | st.integers(1, 20),
        }
    ),
}


@st.composite
def tight_chain(draw: st.DrawFn) -> list[tuple[str, dict[str, object]]]:
    names = draw(st.permutations(sorted(TIGHT_RULES)))[: draw(st.integers(1, len(TIGHT_RULES)))]
    return [(name, draw(TIGHT_RULES[name])) for name in names]


@RULES_PROFILE
@given(messages=conversation(), chain=tight_chain())
def test_any_chain_of_tight_rules_keeps_the_protocol_and_the_anchors(
    messages: list[AnyMessage], chain: list[tuple[str, dict[str, object]]]
) -> None:
    store = MemoryOffloadStore()
    out = apply_rules(messages, chain, EstimateCounter(), store, KEY, budget_tokens=300)
    assert_sound(messages, out, store, KEY)


def test_the_profile_runs_one_hundred_examples() -> None:
    assert RULES_PROFILE.max_examples == 100
