"""The tail keeps its room in an agent's run: summaries are capped, old ones merge first,
and the hard truncate never wipes blocks when only the tail is over the target."""

from __future__ import annotations

import json

import pytest

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.pipeline import PipelineConfig, View, plan_next_stage
from ctxcore.pipeline.sizing import summary_cap
from ctxcore.pipeline.targets import build_targets
from ctxcore.pipeline.truncate import truncate_blocks
from ctxcore.pipeline.view import block_message
from ctxcore.state.models import SummaryBlock
from ctxcore.tokens import TiktokenCounter

COUNTER = TiktokenCounter()


def _ids(messages: list[AnyMessage], start: int) -> list[AnyMessage]:
    return [m.model_copy(update={"context_message_id": f"{start + i:012d}"}) for i, m in enumerate(messages)]


def _block(text: str, first: int, last: int) -> SummaryBlock:
    a, b = f"{first:012d}", f"{last:012d}"
    message = block_message(text, block_id=f"L1-{a}-{b}", first_id=a, last_id=b, level=1, scope="s")
    return SummaryBlock(
        block_id=f"L1-{a}-{b}",
        messages=[message.model_copy(update={"context_message_id": a})],
        first_id=a,
        last_id=b,
        level=1,
        tokens_before=20_000,
        tokens_after=COUNTER.count_messages([message]),
    )


def _summary(n: int, lines: int) -> str:
    body = "\n".join(
        f"- tool bash: block {n} line {i} found value_{n}_{i} in src/mod_{i}.py" for i in range(lines)
    )
    return f"## Task state\n{body}\n## Files and changes\n(none)"


def agent_steps(start: int, count: int, output_words: int = 120) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(count):
        cid = f"c{start + i}"
        call = ToolCall(id=cid, name="bash", arguments=json.dumps({"command": f"python step_{start + i}.py"}))
        out += [
            AssistantMessage(content=f"THOUGHT: step {start + i}.", tool_calls=[call]),
            ToolMessage(
                tool_call_id=cid,
                name="bash",
                content=" ".join(f"out{start + i}_{w}" for w in range(output_words)),
            ),
        ]
    return _ids(out, start * 2 + 100)


def chat_turns(start: int, count: int) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(count):
        out += [
            UserMessage(content=" ".join(f"said{start + i}_{w}" for w in range(60))),
            AssistantMessage(content=" ".join(f"answered{start + i}_{w}" for w in range(60))),
        ]
    return _ids(out, start * 2 + 100)


def test_an_agent_run_caps_its_summaries_a_dialogue_does_not() -> None:
    cfg = PipelineConfig(target_tokens=8000, summary_share=0.4)
    assert summary_cap(View(version=1, tail=tuple(agent_steps(0, 2))), cfg) == 3200
    assert summary_cap(View(version=1, tail=tuple(chat_turns(0, 2))), cfg) is None
    assert (
        summary_cap(
            View(version=1, tail=tuple(agent_steps(0, 2))), cfg.model_copy(update={"summary_share": 1.0})
        )
        is None
    )


def test_in_a_small_room_the_summaries_keep_their_floor_and_never_pass_the_target() -> None:
    tail = tuple(agent_steps(0, 2))
    cfg = PipelineConfig(target_tokens=4000, summary_share=0.4, summary_floor_tokens=2500)
    assert summary_cap(View(version=1, tail=tail), cfg) == 2500
    assert summary_cap(View(version=1, tail=tail), cfg.model_copy(update={"target_tokens": 1200})) == 1200
    assert summary_cap(View(version=1, tail=tail), cfg.model_copy(update={"summary_floor_tokens": 0})) == 1600


def test_new_summaries_share_the_cap_with_the_blocks_already_there() -> None:
    blocks = (_block(_summary(1, 40), 2, 40),)
    tail = agent_steps(50, 30)
    view = View(version=2, blocks=blocks, tail=tuple(tail), covered_until="000000000040")
    capped = PipelineConfig(target_tokens=view.tokens(COUNTER) // 2, summary_share=0.4)
    free = capped.model_copy(update={"summary_share": 1.0})
    room_capped = sum(t.target_tokens for t in build_targets("l0_to_l1", view, capped, COUNTER))
    room_free = sum(t.target_tokens for t in build_targets("l0_to_l1", view, free, COUNTER))
    assert room_capped < room_free


def test_blocks_over_their_share_merge_before_the_tail_is_summarised() -> None:
    blocks = (_block(_summary(1, 60), 2, 40), _block(_summary(2, 60), 41, 80))
    tail = agent_steps(90, 12)
    view = View(version=3, blocks=blocks, tail=tuple(tail), covered_until="000000000080")
    target = view.tokens(COUNTER) - 200
    stage = plan_next_stage(view, PipelineConfig(target_tokens=target, summary_share=0.3), COUNTER)
    assert stage is not None and stage.kind == "recursive_merge"
    # Without the cap the newest steps are summarised first, as before.
    stage = plan_next_stage(view, PipelineConfig(target_tokens=target, summary_share=1.0), COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1"


def test_block_text_is_cut_only_for_a_view_over_the_budget_not_to_reach_the_target() -> None:
    blocks = (_block(_summary(1, 30), 2, 40),)
    tail = agent_steps(50, 6, output_words=400)
    view = View(version=2, blocks=blocks, tail=tuple(tail), covered_until="000000000040")
    served = view.tokens(COUNTER)
    model_stages = ["l0_to_l1", "recursive_merge", "aggressive_keep_recent", "aggressive_full_context"]
    # Over the target, within the budget, every model pass spent: the window serves the view
    # as it is; cutting the block would only lose what it says.
    within = PipelineConfig(target_tokens=served - 100, ceiling_tokens=served + 10)
    assert plan_next_stage(view, within, COUNTER, exhausted=model_stages) is None
    over = within.model_copy(update={"ceiling_tokens": served - 50})
    stage = plan_next_stage(view, over, COUNTER, exhausted=model_stages)
    assert stage is not None and stage.kind == "hard_truncate"
    # Without a ceiling (the pipeline used on its own) the target is all there is.
    alone = within.model_copy(update={"ceiling_tokens": None})
    stage = plan_next_stage(view, alone, COUNTER, exhausted=model_stages)
    assert stage is not None and stage.kind == "hard_truncate"


@pytest.mark.parametrize("ceiling", [None, "budget"])
def test_hard_truncate_keeps_block_lines_when_only_the_tail_is_over(ceiling: str | None) -> None:
    blocks = (_block(_summary(1, 30), 2, 40),)
    tail = agent_steps(50, 6, output_words=400)
    view = View(version=2, blocks=blocks, tail=tuple(tail), covered_until="000000000040")
    fixed = View(version=2, tail=tuple(tail)).tokens(COUNTER)
    target = fixed - 50  # the tail alone is over the target
    budget = view.tokens(COUNTER) + 100  # room for the sections the truncated block adds
    cfg = PipelineConfig(target_tokens=target, ceiling_tokens=budget if ceiling else None)
    out = truncate_blocks(view, cfg, COUNTER, target)
    text = out[0].messages[0].text
    if ceiling is None:
        assert "block 1 line" not in text  # nothing fits the target: the bare marker
    else:
        assert text.count("block 1 line") == 30  # it all fits the budget: nothing is lost
        assert fixed + COUNTER.count_messages(out[0].messages) <= budget


def test_no_stage_runs_when_the_newest_step_and_anchors_alone_are_over_the_budget() -> None:
    # Every stage would be a model call that cannot make the view fit: the aggressive passes
    # folded all history into a block the window then cut to its header (tau-bench at half of
    # each run: 995 summariser calls for 60 runs with them, 527 without; the worker's
    # ``newest_step`` hold says why the view stays over).
    blocks = (_block(_summary(1, 30), 2, 40),)
    tail = [*agent_steps(50, 6), *agent_steps(60, 1, output_words=900)]
    view = View(version=2, blocks=blocks, tail=tuple(tail), covered_until="000000000040")
    newest = View(version=2, tail=tuple(tail[-2:])).tokens(COUNTER)
    over = PipelineConfig(target_tokens=newest - 300, ceiling_tokens=newest - 100)
    assert plan_next_stage(view, over, COUNTER) is None
    # Under the budget but over the target, the stages bring the view as far down as they can.
    under = PipelineConfig(target_tokens=newest - 300, ceiling_tokens=newest + 300)
    assert plan_next_stage(view, under, COUNTER) is not None
