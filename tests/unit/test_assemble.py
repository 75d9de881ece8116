"""assemble_window: budget, anchors and protocol on every served window; fallback never saved."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxcore.assemble import assemble_window
from ctxcore.errors import BudgetExceeded
from ctxcore.markers import ELIDED_STEPS
from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, message_text
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

    def rules(messages: list[AnyMessage], tail_budget: int | None) -> list[AnyMessage]:
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
