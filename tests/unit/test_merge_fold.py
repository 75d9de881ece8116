"""A merge takes in the oldest raw steps when L0->L1 alone cannot reach the target: one model
call instead of an L1 block merged again at once, landing within the target, the newest steps
verbatim. Sizing counts as a window serves (one list, anchors saving nothing)."""

from __future__ import annotations

from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.pipeline import PipelineConfig, View, compress_until_target, plan_next_stage
from ctxcore.pipeline.sizing import item_tokens, message_tokens
from ctxcore.pipeline.targets import build_targets, l1_falls_short
from ctxcore.summarize.extractive import ExtractiveModel
from tests.unit.test_tail_room import COUNTER, _block, _summary, agent_steps, chat_turns


class _Calls:
    """Counts the summariser's calls."""

    def __init__(self) -> None:
        self.inner = ExtractiveModel(COUNTER)
        self.calls = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def complete(self, messages, *, max_tokens, contract=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self.inner.complete(messages, max_tokens=max_tokens, contract=contract)


def _saturated(
    tail: list[AnyMessage], block_lines: int = 70, first_pass: int = 1500
) -> tuple[View, PipelineConfig]:
    """A view whose one block (after the pinned task) fills most of the target, over it by
    two messages; a new summary may not be smaller than ``first_pass``."""
    block = _block(_summary(1, block_lines), 2, 90)
    task = UserMessage(content="help me plan the trip", context_message_id="000000000001")
    view = View(version=2, pinned=(task,), blocks=(block,), tail=tuple(tail), covered_until="000000000090")
    over = message_tokens(COUNTER, tail[:2])
    target = view.tokens(COUNTER) - over
    passes = {"first_pass_target_tokens": first_pass, "second_pass_target_tokens": first_pass // 2}
    passes["third_pass_target_tokens"] = first_pass // 4
    return view, PipelineConfig(target_tokens=target, keep_recent_messages=4, **passes)


def test_a_dialogue_with_full_summaries_merges_its_oldest_turns_in_one_call() -> None:
    view, cfg = _saturated(chat_turns(100, 5))
    assert l1_falls_short(view, cfg, COUNTER)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "recursive_merge"
    (target,) = build_targets("recursive_merge", view, cfg, COUNTER)
    assert target.blocks == view.blocks and target.raw  # the block and the oldest turns
    assert target.raw == view.tail[: len(target.raw)]

    client = _Calls()
    run = compress_until_target(view, cfg, client, COUNTER)
    assert client.calls == 1
    assert run.view.tokens(COUNTER) <= cfg.target_tokens
    kept = {m.context_message_id for m in run.view.tail}
    assert all(m.context_message_id in kept for m in view.tail[-cfg.keep_recent_messages :])


def test_an_agent_run_over_its_summary_cap_folds_steps_into_the_merge() -> None:
    tail = agent_steps(100, 10)
    view, cfg = _saturated(tail, block_lines=40)
    cfg = cfg.model_copy(update={"summary_share": 0.3})
    client = _Calls()
    run = compress_until_target(view, cfg, client, COUNTER)
    assert client.calls == 1
    assert run.view.tokens(COUNTER) <= cfg.target_tokens
    assert len(run.view.blocks) == 1 and run.view.blocks[0].level == 2
    # Only the steps the target needs: more than the kept recent messages stay verbatim.
    assert len(run.view.tail) > cfg.keep_recent_messages + 2
    assert run.view.tail[-1] == tail[-1]


def test_with_room_for_the_summary_l0_to_l1_runs_alone() -> None:
    view, cfg = _saturated(chat_turns(100, 12), first_pass=200)
    assert not l1_falls_short(view, cfg, COUNTER)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1"


def test_sizes_are_counted_as_one_list() -> None:
    turns = chat_turns(0, 20)
    assert item_tokens(COUNTER, turns, PipelineConfig(target_tokens=100)) == message_tokens(COUNTER, turns)
    assert sum(message_tokens(COUNTER, [m]) for m in turns) > message_tokens(COUNTER, turns)


def test_the_first_summary_does_not_count_the_task_anchor_as_saved() -> None:
    task = UserMessage(content="fix the parser " + "context " * 600, context_message_id="000000000001")
    tail = [task, *agent_steps(0, 30)]
    view = View(version=0, tail=tuple(tail))
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) * 3 // 4, keep_recent_messages=4)
    client = _Calls()
    run = compress_until_target(view, cfg, client, COUNTER)
    assert run.view.tokens(COUNTER) <= cfg.target_tokens
    assert client.calls == 1  # one L0->L1 that reaches the target, not a second to make up
    assert run.view.tail[0] == task or task in run.view.pinned


def test_the_protected_recent_messages_reach_the_summariser_as_previews() -> None:
    tail = agent_steps(100, 10, output_words=600)
    view = View(version=0, tail=tuple(tail))
    prompts: list[str] = []

    class _Recording(_Calls):
        def complete(self, messages, *, max_tokens, contract=None):  # type: ignore[no-untyped-def]
            prompts.append(str(messages[-1].content))
            return super().complete(messages, max_tokens=max_tokens, contract=contract)

    newest = str(tail[-1].content)
    for chars, whole in ((800, False), (0, True)):
        prompts.clear()
        cfg = PipelineConfig(
            target_tokens=view.tokens(COUNTER) * 3 // 4, keep_recent_messages=4, protected_preview_chars=chars
        )
        compress_until_target(view, cfg, _Recording(), COUNTER)
        protected = prompts[0].split("[Protected Recent Context]", 1)[1]
        assert (newest in protected) is whole
        assert newest[:300] in protected and newest[-300:] in protected  # head and tail kept


def test_a_result_over_the_budget_reaches_the_summariser_cut_to_the_budget() -> None:
    tail = agent_steps(100, 10, output_words=60)
    huge = " ".join(f"log_{w}" for w in range(6000)) + " VERDICT: 3 failed"
    tail[1] = tail[1].model_copy(update={"content": huge})
    view = View(version=0, tail=tuple(tail))
    budget = message_tokens(COUNTER, [tail[1]]) // 3
    prompts: list[str] = []

    class _Recording(_Calls):
        def complete(self, messages, *, max_tokens, contract=None):  # type: ignore[no-untyped-def]
            prompts.append(str(messages[-1].content))
            return super().complete(messages, max_tokens=max_tokens, contract=contract)

    for ceiling, whole in ((budget, False), (None, True)):
        prompts.clear()
        cfg = PipelineConfig(target_tokens=budget // 2, keep_recent_messages=4, ceiling_tokens=ceiling)
        compress_until_target(view, cfg, _Recording(), COUNTER)
        selected = prompts[0].split("[Selected Targets]", 1)[1].split("[Protected Recent Context]", 1)[0]
        assert (huge in selected) is whole
        # Head and tail (the verdict) kept; the other results whole either way.
        assert huge[:300] in selected and huge[-300:] in selected
        assert str(tail[3].content) in selected
        if not whole:
            assert COUNTER.count_text(selected) < budget * 2


def test_a_summary_before_the_users_new_request_shrinks_with_the_work_after_it() -> None:
    # The follow-up is pinned as the intent anchor between the blocks: no run can take them
    # together, so each is a group of its own and the two share the cap.
    task = UserMessage(content="fix the parser", context_message_id="000000000001")
    follow_up = UserMessage(content="now make it handle tabs", context_message_id="000000000041")
    before, after = _block(_summary(1, 70), 2, 40), _block(_summary(2, 30), 42, 80)
    tail = agent_steps(100, 6)
    view = View(
        version=3,
        pinned=(task, follow_up),
        blocks=(before, after),
        tail=tuple(tail),
        covered_until="000000000080",
    )
    blocks = sum(message_tokens(COUNTER, b.messages) for b in view.blocks)
    cfg = PipelineConfig(
        target_tokens=view.tokens(COUNTER) - 100,
        summary_share=blocks * 0.6 / (view.tokens(COUNTER) - 100),
        first_pass_target_tokens=200,
        second_pass_target_tokens=150,
        third_pass_target_tokens=100,
    )
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "recursive_merge"
    assert set(stage.block_ids) == {before.block_id, after.block_id}
    targets = build_targets("recursive_merge", view, cfg, COUNTER)
    assert [t.blocks for t in targets] == [(before,), (after,)]
    run = compress_until_target(view, cfg, _Calls(), COUNTER)
    # The older block keeps its range, the request stays verbatim after it.
    assert (run.view.blocks[0].first_id, run.view.blocks[0].last_id) == ("000000000002", "000000000040")
    assert run.view.blocks[1].first_id == "000000000042"
    assert follow_up in run.view.pinned
    assert [r.stage.kind for r in run.results] == ["recursive_merge"]
    assert message_tokens(COUNTER, run.view.blocks[0].messages) < 0.7 * message_tokens(
        COUNTER, before.messages
    )
    assert run.view.tokens(COUNTER) <= cfg.target_tokens


def test_blocks_within_their_cap_on_either_side_of_a_request_are_left_alone() -> None:
    task = UserMessage(content="fix the parser", context_message_id="000000000001")
    follow_up = UserMessage(content="now make it handle tabs", context_message_id="000000000041")
    blocks = (_block(_summary(1, 20), 2, 40), _block(_summary(2, 20), 42, 80))
    view = View(
        version=3,
        pinned=(task, follow_up),
        blocks=blocks,
        tail=tuple(agent_steps(100, 12)),
        covered_until="000000000080",
    )
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) - 100, summary_share=0.9)
    assert build_targets("recursive_merge", view, cfg, COUNTER) == []
