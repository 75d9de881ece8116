"""assemble_window: budget, anchors and protocol on every served window; fallback never saved."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxcore.assemble import assemble_window
from ctxcore.errors import BudgetExceeded
from ctxcore.markers import ELIDED_STEPS
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_text,
)
from ctxcore.pipeline import PipelineConfig, View, compress_until_target
from ctxcore.state import CompressionState
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window
from tests.datasets import conversations
from tests.pipeline_helpers import logged
from tests.strategies import conversations as generated

COUNTER = TiktokenCounter()


def assert_served(result_messages: list[AnyMessage], rest: list[AnyMessage], budget: int) -> None:
    assert check_window(result_messages) == []
    assert COUNTER.count_messages(result_messages) <= budget
    ids = {m.context_message_id: m for m in result_messages if m.context_message_id}
    for i in anchors(rest).indices():
        assert ids.get(rest[i].context_message_id) == rest[i]


def test_within_budget_is_the_plain_view() -> None:
    system, rest = logged(next(conversations("tau_bench.jsonl"))["messages"])
    result = assemble_window(CompressionState(), rest, 10**6, system, [], None, COUNTER)
    assert result.messages == [*system, *rest]
    assert not result.fallback_applied and result.state_version == 0
    assert result.stats.total_tokens == COUNTER.count_messages(result.messages)


def test_budget_exceeded_names_three_sizes() -> None:
    system = [SystemMessage(content="policy " * 500)]
    rest = [UserMessage(content="please help", context_message_id="000000000001")]
    with pytest.raises(BudgetExceeded) as info:
        assemble_window(
            CompressionState(),
            rest,
            100,
            system,
            [{"type": "function", "function": {"name": "f"}}],
            None,
            COUNTER,
        )
    err = info.value
    assert err.budget == 100 and err.system_tokens > 400 and err.tools_tokens > 0 and err.anchor_tokens > 0
    assert "system messages" in str(err) and "anchors" in str(err)


@pytest.mark.parametrize("budget", [16_000, 8_000, 4_000])
def test_fallback_on_every_swe_run(budget: int) -> None:
    for conv in conversations("minisweagent.jsonl"):
        system, rest = logged(conv["messages"])
        state = CompressionState()
        result = assemble_window(state, rest, budget, system, [], None, COUNTER)
        assert_served(result.messages, rest, budget)
        assert result.fallback_applied == (COUNTER.count_messages([*system, *rest]) > budget)
        if result.elided_ranges:
            markers = [m for m in result.messages if message_text(m).startswith(ELIDED_STEPS)]
            if markers:
                assert result.elided_ranges[0][0] in message_text(markers[0])
            else:
                # Not even the note fits beside the anchors: everything else was cut first.
                kept = [rest[i] for i in anchors(rest).indices()]
                others = [m for m in result.messages[len(system) :] if m not in kept]
                assert all(len(message_text(m)) <= len("...[TRUNCATED]...") for m in others)
        assert state == CompressionState()  # the fallback is never saved


def test_fallback_truncates_blocks_when_tail_is_not_enough() -> None:
    system, rest = logged(next(conversations("minisweagent.jsonl"))["messages"])
    view = View(version=0, system=tuple(system), tail=tuple(rest))
    run = compress_until_target(
        view, PipelineConfig(target_tokens=view.tokens(COUNTER) // 3), ExtractiveModel(COUNTER), COUNTER
    )
    state = run.view.to_state()
    budget = COUNTER.count_messages([*system, *run.view.pinned]) + 700
    result = assemble_window(
        state, list(run.view.tail), budget, system, [], None, COUNTER, pinned=list(run.view.pinned)
    )
    assert_served(result.messages, rest, budget)
    assert result.fallback_applied


def test_rules_apply_to_tail_only() -> None:
    system, rest = logged(next(conversations("tau_bench.jsonl"))["messages"])
    seen: list[tuple[int, int | None]] = []

    def rules(messages: list[AnyMessage], tail_budget: int | None, chunk: int) -> list[AnyMessage]:
        assert chunk == 0  # none asked for
        seen.append((len(messages), tail_budget))
        return list(messages)

    assemble_window(CompressionState(), rest[5:], 10**6, system, [], rules, COUNTER)
    # The rules see the tail and the room it has: the budget minus everything else.
    room = 10**6 - COUNTER.count_messages(system)
    assert len(seen) == 1 and seen[0][0] == len(rest) - 5
    assert seen[0][1] is not None and room - 10 <= seen[0][1] <= room


@given(generated(), st.integers(min_value=50, max_value=6000))
def test_any_conversation_any_budget(messages: list[AnyMessage], budget: int) -> None:
    system = [m for m in messages if m.role == "system"]
    rest = [
        m.model_copy(update={"context_message_id": f"{i:012d}"})
        for i, m in enumerate(messages)
        if m.role != "system"
    ]
    try:
        result = assemble_window(CompressionState(), rest, budget, system, [], None, COUNTER)
    except BudgetExceeded as exc:
        assert exc.system_tokens + exc.anchor_tokens + exc.tools_tokens > budget - 10
        return
    assert_served(result.messages, rest, budget)


def test_the_newest_step_is_never_elided_when_a_user_message_opens_it() -> None:
    # A tail of [user, call, result] is one step that starts at the user's message: the
    # fallback elided the call and its result behind a marker (tau-bench at 0.5: a window of
    # anchors only, a fifth of the budget unused, the result the agent acts on gone).
    system = [SystemMessage(content="policy " * 200)]
    call = ToolCall(id="c1", name="get_reservation_details", arguments='{"reservation_id": "GV1N64"}')
    result_text = (
        '{"reservation_id": "GV1N64", "user_id": "james_patel_9828", "flights": "' + "HAT003 " * 60 + '"}'
    )
    rest = [
        UserMessage(content="Please remove a passenger from my flights.", context_message_id="000000000001"),
        AssistantMessage(content="Which reservation?", context_message_id="000000000002"),
        UserMessage(content="The reservation ID is GV1N64.", context_message_id="000000000003"),
        AssistantMessage(content="", tool_calls=[call], context_message_id="000000000004"),
        ToolMessage(tool_call_id="c1", content=result_text, context_message_id="000000000005"),
    ]
    whole = COUNTER.count_messages([*system, *rest])
    budget = whole - 60
    result = assemble_window(CompressionState(), rest, budget, system, [], None, COUNTER)
    assert_served(result.messages, rest, budget)
    served = [m for m in result.messages if m.context_message_id]
    assert [m.context_message_id for m in served][-2:] == ["000000000004", "000000000005"]
    assert "james_patel_9828" in message_text(served[-1])
    assert all(
        not message_text(m).startswith(ELIDED_STEPS) or "000000000004" not in message_text(m)
        for m in result.messages
    )


def test_a_cut_frees_what_the_window_is_over_and_keeps_the_rest_of_the_text() -> None:
    system = [SystemMessage(content="policy " * 200)]
    call = ToolCall(id="c1", name="bash", arguments='{"command": "pytest -q"}')
    output = "\n".join(f"tests/test_mod.py::test_case_{i} PASSED" for i in range(80))
    rest = [
        UserMessage(content="Fix the failing test.", context_message_id="000000000001"),
        AssistantMessage(content="", tool_calls=[call], context_message_id="000000000002"),
        ToolMessage(tool_call_id="c1", content=output, context_message_id="000000000003"),
    ]
    budget = COUNTER.count_messages([*system, *rest]) - 40
    result = assemble_window(CompressionState(), rest, budget, system, [], None, COUNTER)
    assert_served(result.messages, rest, budget)
    served = message_text(result.messages[-1])
    assert "...[TRUNCATED]..." in served
    # About 40 tokens of ~1,100 go, not a fixed six characters per token plus 200.
    assert len(served) > 0.85 * len(output)
    assert COUNTER.count_messages(result.messages) > budget - 40
