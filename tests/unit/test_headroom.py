"""Headroom-aware windows: the raw tail is verbatim while it fits; rules and the fallback act
only to bring the window under the budget, oldest content first."""

from __future__ import annotations

import json

import pytest

from ctxcore.assemble import assemble_window, fit_to_budget
from ctxcore.engine import ContextEngine
from ctxcore.errors import BudgetExceeded, ConfigError
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_text,
)
from ctxcore.pipeline import View
from ctxcore.processors import apply_rules_result, build_rule_chain, default_rule_chain
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.processors.reload_tool import RELOAD_TOOL_NAME
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from tests.datasets import swe_runs
from tests.pipeline_helpers import logged

COUNTER = TiktokenCounter()
KEY = ConversationKey("t", "c")
SYSTEM = [SystemMessage(content="You are a coding agent.")]


def run(steps: int, size: int, *, first_id: int = 1) -> list[AnyMessage]:
    """A task, then ``steps`` bash steps with outputs of about ``size`` words, with log ids."""
    out: list[AnyMessage] = [UserMessage(content="Fix the crash in core.py.")]
    for i in range(steps):
        call = ToolCall(id=f"c{i}", name="bash", arguments=json.dumps({"command": f"cat f{i}.py"}))
        out.append(AssistantMessage(content=f"step {i}", tool_calls=[call]))
        out.append(ToolMessage(tool_call_id=f"c{i}", content=f"output {i}\n" + "word " * size))
    return [m.model_copy(update={"context_message_id": f"{n:012d}"}) for n, m in enumerate(out, first_id)]


def rules(budget: int, store: MemoryOffloadStore):  # type: ignore[no-untyped-def]
    chain = build_rule_chain(default_rule_chain(budget))

    def apply(messages: list[AnyMessage], room: int | None, chunk: int) -> list[AnyMessage]:
        return apply_rules_result(
            messages,
            chain,
            COUNTER,
            store,
            KEY,
            budget_tokens=budget,
            tail_budget_tokens=room,
            chunk_tokens=chunk,
        ).messages

    return apply


def test_a_tail_that_fits_is_served_verbatim() -> None:
    tail = run(30, 40)
    budget = COUNTER.count_messages([*SYSTEM, *tail]) + 200
    result = assemble_window(
        CompressionState(), tail, budget, SYSTEM, [], rules(budget, MemoryOffloadStore()), COUNTER
    )
    assert result.messages == [*SYSTEM, *tail] and not result.fallback_applied


def test_over_budget_the_rules_act_oldest_first_and_stop_when_it_fits() -> None:
    tail = run(30, 200)
    total = COUNTER.count_messages([*SYSTEM, *tail])
    budget = total - 1500
    store = MemoryOffloadStore()
    result = assemble_window(CompressionState(), tail, budget, SYSTEM, [], rules(budget, store), COUNTER)
    served = result.messages
    assert check_window(served) == [] and COUNTER.count_messages(served) <= budget
    outputs = [m for m in served if isinstance(m, ToolMessage)]
    changed = [i for i, m in enumerate(outputs) if OFFLOAD_MARKER_RE.search(message_text(m))]
    # The oldest outputs went, as few as needed, and the newest ones are untouched.
    assert changed and changed == list(range(len(changed))) and len(changed) < len(outputs) // 2
    assert outputs[-1] == tail[-1]
    assert budget - COUNTER.count_messages(served) < 600  # it stopped once the window fit
    for message in outputs[: len(changed)]:
        handle = OFFLOAD_MARKER_RE.search(message_text(message)).group(1)  # type: ignore[union-attr]
        assert store.get(KEY, handle) is not None


def test_the_cap_keeps_head_and_tail_of_a_huge_result_and_offloads_it() -> None:
    tail = run(2, 10)
    huge = "first line of the log\n" + "noise " * 400_000 + "\nTraceback ...\nValueError: the end"
    tail[-1] = tail[-1].model_copy(update={"content": huge})
    store = MemoryOffloadStore()
    budget = 8000
    result = assemble_window(CompressionState(), tail, budget, SYSTEM, [], rules(budget, store), COUNTER)
    text = message_text(result.messages[-1])
    assert text.startswith("first line of the log") and text.endswith("ValueError: the end")
    # The older steps are kept whole and the output takes the room they leave, well past the
    # cap (a quarter of the window), which is what it was cut to while 3/4 of the window
    # stayed free.
    assert result.messages[1:-1] == [*tail[:-1]]
    served = COUNTER.count_messages(result.messages)
    assert served <= budget and served > budget - 600
    assert COUNTER.count_messages([result.messages[-1]]) > budget // 2
    handle = OFFLOAD_MARKER_RE.search(text).group(1)  # type: ignore[union-attr]
    stored = store.get(KEY, handle)
    assert stored is not None and message_text(stored[0]) == huge
    assert not result.fallback_applied


@pytest.mark.parametrize("chunk", [0, 1600])
def test_a_huge_newest_output_leaves_older_outputs_whole_and_fills_what_they_leave(chunk: int) -> None:
    tail = run(6, 120)
    huge = "collected 512 items\n" + "tests/test_core.py::test_case PASSED\n" * 6000 + "FAILED test_x - boom"
    tail[-1] = tail[-1].model_copy(update={"content": huge})
    budget = 8000
    # Chunks keep a lagging worker's windows calm; the newest output, rewritten on the next
    # window whatever its size, still fills the room rather than a chunk below it.
    result = assemble_window(
        CompressionState(),
        tail,
        budget,
        SYSTEM,
        [],
        rules(budget, MemoryOffloadStore()),
        COUNTER,
        rule_chunk_tokens=chunk,
    )
    served = result.messages
    assert check_window(served) == [] and COUNTER.count_messages(served) <= budget
    # Freeing the older outputs could never make the newest one fit: they stay as they were.
    assert served[1:-1] == tail[:-1]
    text = message_text(served[-1])
    assert text.startswith("collected 512 items") and text.endswith("FAILED test_x - boom")
    assert COUNTER.count_messages(served) > budget - 600


def test_a_newest_output_that_fits_once_older_outputs_go_is_served_whole() -> None:
    tail = run(12, 400)
    output = "\n".join(f"{n:5d}  line {n} of the file view" for n in range(360))
    tail[-1] = tail[-1].model_copy(update={"content": output})
    budget = 8000
    result = assemble_window(
        CompressionState(), tail, budget, SYSTEM, [], rules(budget, MemoryOffloadStore()), COUNTER
    )
    served = result.messages
    assert COUNTER.count_messages([tail[-1]]) > budget // 4  # over the cap, under the room
    assert COUNTER.count_messages(served) <= budget and served[-1] == tail[-1]


def test_one_older_output_that_is_the_whole_excess_goes_alone() -> None:
    tail = run(4, 400)
    huge = "collected 512 items\n" + "tests/test_core.py::test_case PASSED\n" * 3000
    tail[6] = tail[6].model_copy(update={"content": huge})  # the third step's output
    budget = 8000
    store = MemoryOffloadStore()
    result = assemble_window(CompressionState(), tail, budget, SYSTEM, [], rules(budget, store), COUNTER)
    served = result.messages
    assert COUNTER.count_messages(served) <= budget
    outputs = [m for m in served if isinstance(m, ToolMessage)]
    # Oldest first alone would have previewed the two 400-word views before it as well.
    assert outputs[0] == tail[2] and outputs[1] == tail[4] and outputs[3] == tail[8]
    assert OFFLOAD_MARKER_RE.search(message_text(outputs[2]))


def test_an_older_output_over_the_cap_is_served_at_the_cap_not_as_a_preview() -> None:
    # Compaction plans every result at the cap: a window that previewed an older 30k-token
    # log to a few hundred tokens left the room between them unused (retention.py
    # --huge-outputs: windows 0.4-0.7 full at 16k).
    tail = run(4, 200)
    huge = "collected 512 items\n" + "tests/test_core.py::test_case PASSED\n" * 3000 + "FAILED test_x - boom"
    tail[4] = tail[4].model_copy(update={"content": huge})  # the second step's output
    budget = 8000
    result = assemble_window(
        CompressionState(), tail, budget, SYSTEM, [], rules(budget, MemoryOffloadStore()), COUNTER
    )
    served = result.messages
    assert check_window(served) == [] and COUNTER.count_messages(served) <= budget
    outputs = [m for m in served if isinstance(m, ToolMessage)]
    assert outputs[0] == tail[2] and outputs[2:] == [tail[6], tail[8]]
    text = message_text(outputs[1])
    assert text.startswith("collected 512 items") and text.endswith("FAILED test_x - boom")
    assert OFFLOAD_MARKER_RE.search(text)
    assert budget // 4 - 150 <= COUNTER.count_messages([outputs[1]]) <= budget // 4


def test_the_cap_reads_list_content_by_its_text_parts() -> None:
    tail = run(1, 10)
    parts = [{"type": "text", "text": "head " + "x " * 20_000}, {"type": "text", "text": "tail end"}]
    tail[-1] = tail[-1].model_copy(update={"content": parts})
    result = assemble_window(
        CompressionState(), tail, 4000, SYSTEM, [], rules(4000, MemoryOffloadStore()), COUNTER
    )
    text = message_text(result.messages[-1])
    assert text.startswith("head") and text.endswith("tail end") and "OFFLOAD" in text


def test_the_switch_off_keeps_the_reference_behaviour() -> None:
    tail = run(12, 40)
    off = build_rule_chain(
        [
            (
                "MicroCompactProcessor",
                {"compactable_tool_names": ["*"], "keep_recent_per_tool": 3, "trigger_threshold": 1},
            )
        ]
    )
    on = build_rule_chain(
        [("MicroCompactProcessor", {"compactable_tool_names": ["*"], "act_only_over_budget": True})]
    )
    store = MemoryOffloadStore()
    # Reference: keep the newest K per tool, whatever the room.
    kept = apply_rules_result(tail, off, COUNTER, store, KEY, tail_budget_tokens=10**6).messages
    assert sum("cleared" in message_text(m) for m in kept) == 12 - 3
    # Headroom-aware: nothing while it fits, nothing without a budget.
    assert apply_rules_result(tail, on, COUNTER, store, KEY, tail_budget_tokens=10**6).messages == tail
    assert apply_rules_result(tail, on, COUNTER, store, KEY).messages == tail


def test_a_tail_budget_at_or_below_zero_leaves_the_fallback_to_fit() -> None:
    tail = run(10, 100)
    pinned_heavy = [UserMessage(content="task " * 10, context_message_id="000000000001")]
    budget = COUNTER.count_messages([*SYSTEM, *pinned_heavy]) + 60
    result = assemble_window(
        CompressionState(),
        [*pinned_heavy, *tail[1:]],
        budget,
        SYSTEM,
        [],
        rules(budget, MemoryOffloadStore()),
        COUNTER,
    )
    assert COUNTER.count_messages(result.messages) <= budget and check_window(result.messages) == []
    assert result.fallback_applied


def test_the_fallback_drops_blocks_before_tail_steps_and_cuts_the_newest_step_last() -> None:
    from ctxcore.pipeline.view import block_message
    from ctxcore.state.models import SummaryBlock

    tail = run(8, 150, first_id=20)
    block = SummaryBlock(
        block_id="L1-000000000002-000000000019",
        messages=[
            block_message(
                "old work " * 300,
                block_id="L1-000000000002-000000000019",
                first_id="000000000002",
                last_id="000000000019",
                level=1,
                scope="completed_react",
            )
        ],
        first_id="000000000002",
        last_id="000000000019",
        level=1,
    )
    task = UserMessage(content="Fix the crash.", context_message_id="000000000001")
    view = View(
        version=1,
        system=tuple(SYSTEM),
        pinned=(task,),
        blocks=(block,),
        tail=tuple(tail[1:]),
        covered_until="000000000019",
    )
    budget = View(version=1, system=tuple(SYSTEM), pinned=(task,), tail=tuple(tail[1:])).tokens(COUNTER) - 100
    fitted, elided = fit_to_budget(view, budget, COUNTER, anchor_ids=frozenset({"000000000001"}))
    assert fitted.tokens(COUNTER) <= budget
    # Blocks first (truncated, then dropped); the tail's newest step untouched.
    assert fitted.tail[-1] == tail[-1] and fitted.tail[-2] == tail[-2]
    assert ("000000000002", "000000000019") in elided or fitted.blocks[0].messages != block.messages


def test_the_fallback_leaves_out_raw_messages_a_compaction_left_between_its_blocks() -> None:
    # Raw messages below the cursor that no block covers stay pinned beside the anchors; the
    # fallback must be able to leave them out too, or the window stays over its budget.
    task = UserMessage(content="Fix the crash.", context_message_id="000000000001")
    old = [
        UserMessage(
            content=f"an earlier request {n}: " + "detail " * 200, context_message_id=f"00000000000{n}"
        )
        for n in (2, 3, 4)
    ]
    intent = UserMessage(content="Now only fix the docs.", context_message_id="000000000005")
    tail = run(1, 20, first_id=6)[1:]
    view = View(
        version=1,
        system=tuple(SYSTEM),
        pinned=(task, *old, intent),
        tail=tuple(tail),
        covered_until="000000000005",
    )
    anchors = frozenset({"000000000001", "000000000005"})
    budget = view.tokens(COUNTER) - 150
    fitted, elided = fit_to_budget(view, budget, COUNTER, anchor_ids=anchors)
    assert fitted.tokens(COUNTER) <= budget
    # Only when the tail's steps are not enough, oldest first and only as many as the budget
    # needs: the anchors stay.
    assert ("000000000002", "000000000002") in elided
    kept = [m.context_message_id for m in fitted.pinned]
    assert kept[0] == "000000000001" and kept[-2:] == ["000000000004", "000000000005"]


def test_embedded_default_chain_is_headroom_aware_and_within_budget() -> None:
    record = next(swe_runs())
    system, rest = logged(record["messages"])
    budget = 12_000
    engine = ContextEngine(
        {"context_window_tokens": budget, "strict_processors": True, "enable_reload": True}
    )
    ctx = engine.create_context("swe", processors=default_rule_chain(budget))
    for start in range(0, len(rest), 7):
        ctx.add_messages([m.model_copy(update={"context_message_id": None}) for m in rest[start : start + 7]])
    # At add time only the cap acts: the view holds every message, raw unless capped.
    view = ctx.get_messages()
    assert len(view) == len(rest)
    assert all(
        m.content == r.content or "OFFLOAD" in message_text(m) for m, r in zip(view, rest, strict=True)
    )
    window = ctx.get_context_window(system_messages=system)
    tokens = COUNTER.count_messages(window.get_messages()) + COUNTER.count_tools(window.get_tools())
    assert tokens <= budget and check_window(window.get_messages()) == []
    # The reload tool is in the window and was counted.
    assert [t["function"]["name"] for t in window.get_tools()] == [RELOAD_TOOL_NAME]


def test_embedded_budget_below_system_and_anchors_raises() -> None:
    engine = ContextEngine({"context_window_tokens": 300})
    ctx = engine.create_context("c", processors=default_rule_chain(300))
    ctx.add_messages([UserMessage(content="a long task " * 100)])
    with pytest.raises(BudgetExceeded) as info:
        ctx.get_context_window(system_messages=SYSTEM)
    assert info.value.anchor_tokens > 300 and "anchors" in str(info.value)


def test_the_engine_setting_validates_the_cap_ratio() -> None:
    from ctxcore.config import Settings

    with pytest.raises(ConfigError, match="max_result_ratio"):
        Settings.load({"engine": {"max_result_ratio": 1.5}})
    assert Settings.load({"engine": {"max_result_ratio": 0.5}}).engine.max_result_ratio == 0.5


def prefix_breaks(chunk: int, budget: int, windows: int = 24) -> tuple[int, int]:
    """Windows of a tail growing one step each while no compaction lands: how many rewrote a
    message the window before had served (a broken prompt-cache prefix), and the most
    tokens any window served."""
    tail = run(30 + windows, 120)
    store = MemoryOffloadStore()
    apply = rules(budget, store)
    previous: list[AnyMessage] = []
    breaks = peak = 0
    for n in range(windows):
        served = assemble_window(
            CompressionState(),
            tail[: 61 + 2 * n],
            budget,
            SYSTEM,
            [],
            apply,
            COUNTER,
            rule_chunk_tokens=chunk,
        ).messages
        peak = max(peak, COUNTER.count_messages(served))
        shared = 0
        for a, b in zip(served, previous, strict=False):
            if a != b:
                break
            shared += 1
        breaks += int(bool(previous) and shared < len(previous))
        previous = served
    return breaks, peak


def test_while_a_worker_lags_the_rules_free_room_in_chunks_so_prefixes_stay() -> None:
    budget = COUNTER.count_messages([*SYSTEM, *run(30, 120)])
    one_at_a_time, peak_plain = prefix_breaks(0, budget)
    chunked, peak_chunked = prefix_breaks(budget // 5, budget)
    # Without chunks nearly every window rewrites one more old result; with a chunk of a
    # fifth of the budget (~8 steps here) a rewrite comes every few windows only.
    assert one_at_a_time >= 20
    assert 1 <= chunked <= 6
    assert peak_plain <= budget and peak_chunked <= budget


def test_a_result_over_the_cap_is_served_whole_while_the_window_fits() -> None:
    tail = run(6, 60)
    view = ToolMessage(
        tool_call_id="c5", content="\n".join(f"{n}: value_{n} = compute({n})" for n in range(400))
    )
    tail[-1] = view.model_copy(update={"context_message_id": tail[-1].context_message_id})
    budget = COUNTER.count_messages([*SYSTEM, *tail]) + 300
    assert COUNTER.count_messages([tail[-1]]) > budget * 0.25  # over the default cap
    store = MemoryOffloadStore()
    served = assemble_window(
        CompressionState(), tail, budget, SYSTEM, [], rules(budget, store), COUNTER
    ).messages
    assert served[-1] == tail[-1]  # whole: the window has room for it
    # Once the window is over its room, the cap cuts it (nothing older could free enough).
    tight = COUNTER.count_messages([*SYSTEM, *tail]) - 400
    cut = assemble_window(CompressionState(), tail, tight, SYSTEM, [], rules(tight, store), COUNTER).messages
    assert OFFLOAD_MARKER_RE.search(message_text(cut[-1])) and COUNTER.count_messages(cut) <= tight


def chat(turns: int, steps: int, size: int) -> list[AnyMessage]:
    """``turns`` requests of a user, each answered after ``steps`` lookups of ``size`` words."""
    out: list[AnyMessage] = []
    for t in range(turns):
        out.append(UserMessage(content=f"request {t}: look up the bookings"))
        for s in range(steps):
            call = ToolCall(id=f"t{t}s{s}", name="get_booking", arguments=json.dumps({"id": f"B{t}{s}"}))
            out.append(AssistantMessage(content="", tool_calls=[call]))
            out.append(ToolMessage(tool_call_id=call.id, content=f"booking B{t}{s} " + "seat " * size))
        out.append(AssistantMessage(content=f"answer {t}"))
    return [m.model_copy(update={"context_message_id": f"{n:012d}"}) for n, m in enumerate(out, 1)]


def test_a_long_follow_up_request_is_shrunk_by_the_rules_not_left_to_the_fallback() -> None:
    # A follow-up request in a coding session runs long: its older results are cleared by
    # the rules, oldest first (while a worker lags they go in chunks and the prefix stays
    # put), rather than its oldest steps left out by the fallback on every window. Keeping the
    # request's turn whole while it fit the room cost such sessions cache share at lag 5
    # (bench/README.md, "The turn a new request answers").
    tail = chat(2, 12, 150)[:-1]
    second = tail[26:]  # the second request and its 12 lookups, no answer yet
    budget = COUNTER.count_messages([*SYSTEM, *second]) - 400
    result = assemble_window(
        CompressionState(), tail, budget, SYSTEM, [], rules(budget, MemoryOffloadStore()), COUNTER
    )
    served = result.messages
    assert check_window(served) == [] and COUNTER.count_messages(served) <= budget
    assert not result.fallback_applied
    results = [m for m in served if isinstance(m, ToolMessage) and m.tool_call_id.startswith("t1")]
    assert len(results) == 12  # every step of the working turn is there
    assert any(OFFLOAD_MARKER_RE.search(message_text(m)) for m in results)
    assert served[-1] == tail[-1]
