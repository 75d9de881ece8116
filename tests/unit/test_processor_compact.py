"""MicroCompactProcessor (4.13), CompactCompletedToolTurns and WindowLimit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.errors import ConfigError
from ctxcore.markers import CLEARED_TOOL_RESULT
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    messages_to_json,
)
from ctxcore.processors.chain import WindowRules, apply_rules
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR
from ctxcore.window import check_window


class CountingStore(MemoryOffloadStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        written = super().put_if_absent(key, handle, messages)
        self.writes += written
        return written


def context(processors: list[Any], store: MemoryOffloadStore | None = None) -> ModelContext:
    eng = ContextEngine({"strict_processors": True}, offload_store=store or MemoryOffloadStore())
    return eng.create_context("c", processors=processors)


def step(call_id: str, name: str, content: str, **metadata: Any) -> list[AnyMessage]:
    call = ToolCall(id=call_id, name=name, arguments="{}")
    return [
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(content=content, tool_call_id=call_id, metadata=metadata),
    ]


def tool_turn(tag: str, n_steps: int = 1, **metadata: Any) -> list[AnyMessage]:
    out: list[AnyMessage] = [UserMessage(content=f"do {tag}")]
    for i in range(n_steps):
        out += step(f"{tag}{i}", "grep", f"{tag} result {i}", **metadata)
    return [*out, AssistantMessage(content=f"done {tag}")]


# --- MicroCompactProcessor ------------------------------------------------------------


def micro(**config: Any) -> list[Any]:
    return [("MicroCompactProcessor", {"keep_recent_per_tool": 2, "trigger_threshold": 1, **config})]


def results(ctx: ModelContext) -> list[str]:
    return [str(m.content) for m in ctx.get_messages() if isinstance(m, ToolMessage)]


def test_old_results_are_cleared_behind_a_reloadable_marker() -> None:
    ctx = context(micro())
    ctx.add_messages([UserMessage(content="go")])
    for i in range(4):
        ctx.add_messages(step(str(i), "grep", f"match {i}"))
    found = results(ctx)
    assert found[2:] == ["match 2", "match 3"]
    for i, text in enumerate(found[:2]):
        first, second = text.split("\n")
        assert first == CLEARED_TOOL_RESULT
        handle = OFFLOAD_MARKER_RE.fullmatch(second)
        assert handle is not None
        assert ctx.reload(handle.group(1))[0].content == f"match {i}"


def test_trigger_waits_for_threshold_plus_keep_and_a_complete_round() -> None:
    ctx = context(micro(trigger_threshold=2))
    ctx.add_messages(
        [
            UserMessage(content="go"),
            *step("0", "grep", "a"),
            *step("1", "grep", "b"),
            *step("2", "grep", "c"),
            *step("3", "grep", "d"),
        ]
    )
    assert CLEARED_TOOL_RESULT not in "".join(results(ctx))  # 4 results, threshold 2 + keep 2
    ctx.add_messages(AssistantMessage(content="", tool_calls=[ToolCall(id="4", name="grep")]))
    assert CLEARED_TOOL_RESULT not in "".join(results(ctx))  # a call is in flight
    ctx.add_messages(ToolMessage(content="e", tool_call_id="4"))
    assert results(ctx)[3:] == ["d", "e"] and all(r.startswith(CLEARED_TOOL_RESULT) for r in results(ctx)[:3])


def test_keep_recent_is_per_tool_and_other_tools_are_not_compactable() -> None:
    ctx = context(micro())
    messages: list[AnyMessage] = [UserMessage(content="go")]
    for i in range(4):
        messages += (
            step(f"g{i}", "grep", f"g{i}")
            + step(f"b{i}", "bash", f"b{i}")
            + step(f"r{i}", "read_file", f"r{i}")
        )
    ctx.add_messages(messages)
    found = results(ctx)
    assert [r for r in found if r.startswith("b")] == ["b0", "b1", "b2", "b3"]  # bash is not listed
    assert [r for r in found if not r.startswith(CLEARED_TOOL_RESULT) and r[0] in "gr"] == [
        "g2",
        "r2",
        "g3",
        "r3",
    ]


def test_cleared_results_are_not_processed_again() -> None:
    store = CountingStore()
    ctx = context(micro(), store=store)
    ctx.add_messages(
        [UserMessage(content="go"), *[m for i in range(4) for m in step(str(i), "grep", f"m{i}")]]
    )
    assert store.writes == 2
    assert ctx.compress_context() == "noop"
    ctx.add_messages(step("4", "grep", "m4"))
    assert store.writes == 2  # passive: 3 live results do not exceed threshold 1 + keep 2
    assert ctx.compress_context() == "compressed"  # forced: down to keep 2
    assert store.writes == 3


def test_a_result_offloaded_elsewhere_keeps_its_marker_and_is_not_written_again() -> None:
    store = CountingStore()
    ctx = context(
        [
            (
                "MessageOffloader",
                {
                    "tokens_threshold": 1,
                    "large_message_threshold": 50,
                    "trim_size": 5,
                    "keep_last_round": False,
                },
            ),
            *micro(compactable_tool_names=["*"]),
        ],
        store=store,
    )
    ctx.add_messages([UserMessage(content="go"), *step("0", "bash", "long " * 40)])
    assert store.writes == 1
    original_marker = OFFLOAD_MARKER_RE.search(results(ctx)[0])
    ctx.add_messages([m for i in range(1, 4) for m in step(str(i), "bash", f"m{i}")])
    cleared = results(ctx)[0]
    assert cleared.startswith(CLEARED_TOOL_RESULT) and original_marker and original_marker.group(0) in cleared
    assert store.writes == 2  # only m1 was written; the first result's original was already stored


# --- CompactCompletedToolTurns --------------------------------------------------------


def compact(keep: int = 1) -> list[Any]:
    return [("CompactCompletedToolTurns", {"keep_recent_turns": keep})]


def test_older_completed_tool_turns_become_request_and_answer_in_the_window_only() -> None:
    ctx = context(compact())
    ctx.add_messages([*tool_turn("a", 2), *tool_turn("b", 1), UserMessage(content="now")])
    window = ctx.get_context_window()
    assert [m.content for m in window.context_messages] == [
        "do a",
        "done a",
        "do b",
        "done b",
        "now",
    ]
    assert check_window(window.get_messages()) == []
    assert ctx.get_messages() == ctx.get_raw_messages()  # the view is untouched
    completed = next(s for s in ctx.compression_states if s.status == "completed")
    raw = ctx.get_raw_messages()
    spans = [(r.first, r.last) for r in completed.event.removed_ranges]  # type: ignore[union-attr]
    assert spans == [
        (raw[1].context_message_id, raw[4].context_message_id),
        (raw[7].context_message_id, raw[8].context_message_id),
    ]


def test_current_failed_cancelled_and_recent_turns_are_untouched() -> None:
    ctx = context(compact(keep=2))
    ctx.add_messages(
        [
            *tool_turn("failed", is_error=True),
            *tool_turn("cancelled", cancelled=True),
            *tool_turn("old"),
            *tool_turn("recent"),
            *tool_turn("current"),
        ]
    )
    texts = [m.content for m in ctx.get_context_window().context_messages]
    assert "failed result 0" in texts and "cancelled result 0" in texts
    assert "old result 0" not in texts and "do old" in texts and "done old" in texts
    assert "recent result 0" in texts and "current result 0" in texts


def test_an_incomplete_turn_and_a_chat_without_tools_are_left_alone() -> None:
    ctx = context(compact(keep=0))
    unfinished = tool_turn("x")[:-1]
    ctx.add_messages(
        [UserMessage(content="hi"), AssistantMessage(content="hello"), *unfinished, UserMessage(content="?")]
    )
    assert ctx.get_context_window().context_messages == ctx.get_messages()


def headroom_turns(messages: list[AnyMessage], room: int) -> list[Any]:
    counter = TiktokenCounter()
    chain = [("CompactCompletedToolTurns", {"act_only_over_budget": True})]
    served = apply_rules(messages, chain, counter, None, ConversationKey("t", "c"), tail_budget_tokens=room)
    return [m.content for m in served]


def test_over_budget_the_turn_a_new_request_answers_keeps_its_tool_steps() -> None:
    # The user's reply to "done b" asks about what turn b found: its results stay, the older
    # turn goes first, and nothing else goes even with the window still over.
    texts = headroom_turns([*tool_turn("a"), *tool_turn("b", 2), UserMessage(content="why b?")], room=10)
    assert "a result 0" not in texts and texts[:2] == ["do a", "done a"]
    assert "b result 0" in texts and "b result 1" in texts
    # Once the agent works on the new request, turn b is an older turn like any other.
    working = [*tool_turn("a"), *tool_turn("b", 2), *tool_turn("c")[:-1]]
    texts = headroom_turns(working, room=10)
    assert "b result 0" not in texts and "do b" in texts and "done b" in texts


def test_over_budget_an_old_turn_loses_its_oldest_steps_first_not_all_at_once() -> None:
    messages = [*tool_turn("a"), *tool_turn("b", 6), *tool_turn("c")[:-1]]
    texts = headroom_turns(messages, room=TiktokenCounter().sum_messages(messages) - 1)
    assert "a result 0" not in texts  # the oldest turn's step went first
    assert all(f"b result {i}" in texts for i in range(6))
    texts = headroom_turns(messages, room=TiktokenCounter().sum_messages(messages) - 60)
    assert "b result 0" not in texts and "b result 5" in texts and "done b" in texts


# --- WindowLimit ----------------------------------------------------------------------


def test_window_limit_keeps_whole_newest_turns_and_the_task_anchor() -> None:
    ctx = context([("WindowLimit", {"max_attached_turns": 2})])
    ctx.add_messages([*tool_turn("a"), *tool_turn("b"), *tool_turn("c"), *tool_turn("d")])
    window = ctx.get_context_window()
    assert [m.content for m in window.context_messages][:3] == ["do a", "do c", ""]
    assert window.context_messages[-1].content == "done d"
    assert check_window(window.get_messages()) == []
    assert ctx.get_messages() == ctx.get_raw_messages()


def test_window_limit_by_messages_never_splits_a_turn_and_always_keeps_the_current_one() -> None:
    ctx = context([("WindowLimit", {"max_attached_messages": 6})])
    ctx.add_messages([*tool_turn("a"), *tool_turn("b"), *tool_turn("c", 3)])
    texts = [m.content for m in ctx.get_context_window().context_messages]
    assert texts[0] == "do a" and texts[1] == "do c" and len(texts) == 1 + 8


def limited(messages: list[AnyMessage], room: int) -> list[Any]:
    counter = TiktokenCounter()
    chain = [("WindowLimit", {"act_only_over_budget": True})]
    served = apply_rules(messages, chain, counter, None, ConversationKey("t", "c"), tail_budget_tokens=room)
    assert check_window(served) == []
    return [m.content for m in served]


def test_over_budget_the_oldest_answered_turns_are_left_out_whole_anchors_kept() -> None:
    turns_ = [*tool_turn("a"), *tool_turn("b"), *tool_turn("c"), *tool_turn("d", 3)[:-1]]
    everything = [m.content for m in turns_]
    room = TiktokenCounter().sum_messages(turns_) - 1
    texts = limited(turns_, room)
    # Only as far as needed: the oldest turn goes, whole but for the task anchor; b stays.
    assert texts[0] == "do a" and "a result 0" not in texts and "done a" not in texts
    assert texts[1:] == everything[4:]
    # With no room at all every answered turn goes but the task anchor and the current turn.
    texts = limited(turns_, 10)
    assert texts[0] == "do a" and "done b" not in texts and "do c" not in texts
    assert texts[1:] == everything[-7:]


def test_the_turn_a_new_request_answers_and_unanswered_or_failed_turns_stay() -> None:
    asked = [*tool_turn("a"), *tool_turn("b"), UserMessage(content="why b?")]
    texts = limited(asked, 10)
    assert "b result 0" in texts and "done b" in texts and "why b?" in texts
    failed = [*tool_turn("a"), *tool_turn("b", is_error=True), *tool_turn("c")[:-1]]
    assert "b result 0" in limited(failed, 10)
    unanswered = [*tool_turn("a"), *tool_turn("b")[:-1], *tool_turn("c")[:-1]]
    assert "b result 0" in limited(unanswered, 10)
    # Within its room nothing is left out.
    assert limited(asked, 10_000) == [m.content for m in asked]


def test_window_limit_by_room_and_by_count_at_once_is_refused() -> None:
    with pytest.raises(ConfigError, match="act_only_over_budget"):
        context([("WindowLimit", {"act_only_over_budget": True, "max_attached_turns": 2})])


def test_the_default_chain_leaves_out_old_turns_before_it_previews_the_current_ones() -> None:
    lookups = [*tool_turn("a"), *tool_turn("b", 2), *tool_turn("c", 2), UserMessage(content="and d?")]
    lookups += step("d0", "grep", " ".join(f"d{i}" for i in range(400)))
    lookups += step("d1", "grep", "d result 1")
    counter = TiktokenCounter()
    # Room for the current request and the task alone: each older turn goes whole.
    room = counter.sum_messages(lookups[-5:]) + counter.sum_messages(lookups[:1]) + 10
    served = WindowRules(4000).apply(
        lookups,
        room,
        counter=counter,
        offloads=None,
        key=ConversationKey("t", "c"),
        detector=DEFAULT_DETECTOR,
    )
    texts = [m.content for m in served]
    assert texts[0] == "do a" and "do b" not in texts and "done c" not in texts
    assert lookups[-3].content in texts  # the current request's first lookup, whole


def test_window_limit_without_limits_or_turns_to_drop_does_nothing() -> None:
    ctx = context([("WindowLimit", None)])
    ctx.add_messages([*tool_turn("a"), *tool_turn("b")])
    assert ctx.get_context_window().context_messages == ctx.get_messages()
    assert ctx.compression_states == []


def test_everything_a_view_processor_leaves_out_is_in_the_log_by_its_ranges() -> None:
    ctx = context([*compact(keep=1), ("WindowLimit", {"max_attached_turns": 2})])
    ctx.add_messages([*tool_turn("a"), *tool_turn("b", 2), *tool_turn("c"), *tool_turn("d")])
    window = ctx.get_context_window()
    shown = {m.context_message_id for m in window.context_messages}
    covered = set(shown)
    for state in ctx.compression_states:
        if state.status == "completed" and state.event:
            for span in state.event.removed_ranges:
                covered |= {
                    m.context_message_id
                    for m in ctx.get_raw_messages()
                    if span.first <= str(m.context_message_id) <= span.last
                }
    assert covered == {m.context_message_id for m in ctx.get_raw_messages()}
    assert messages_to_json(ctx.get_raw_messages()) == messages_to_json(ctx.get_messages())
