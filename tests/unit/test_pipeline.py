"""The compaction pipeline over real conversations: targets, coverage, anchors, fallbacks."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ctxcore import check_window
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, message_text
from ctxcore.pipeline import (
    PipelineConfig,
    Stage,
    StageResult,
    View,
    compress_until_target,
    parse_blocks,
    plan_next_stage,
    run_stage,
)
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from tests.datasets import conversations
from tests.pipeline_helpers import FailingModel, ScriptedModel, check_coverage, logged, raw_view

COUNTER = TiktokenCounter()


def sample() -> list[dict[str, object]]:
    """The bundled runs, half of the tau-bench slice, every SWE run, two dated chats."""
    return (
        list(conversations("agent_runs.jsonl"))
        + list(conversations("tau_bench.jsonl", every=2))
        + list(conversations("minisweagent.jsonl"))
        + list(conversations("dialogue_qa.jsonl", every=2))
    )


def test_config_defaults_and_validation() -> None:
    cfg = PipelineConfig(target_tokens=160_000)
    assert cfg.pass_targets() == (30_000, 20_000, 10_000)
    with pytest.raises(ValidationError, match="third"):
        PipelineConfig(target_tokens=1000, first_pass_target_tokens=10, second_pass_target_tokens=20)
    with pytest.raises(ValidationError):
        PipelineConfig(target_tokens=0)
    with pytest.raises(ValidationError):
        PipelineConfig(target_tokens=10, truncate_head_ratio=1.0)
    with pytest.raises(ValidationError):
        PipelineConfig(target_tokens=10, unknown=1)  # type: ignore[call-arg]


def test_stage_and_result_survive_json() -> None:
    view = raw_view(next(conversations("minisweagent.jsonl"))["messages"])
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 2)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1" and stage.based_on_version == 0
    assert Stage.model_validate_json(stage.model_dump_json()) == stage
    result = run_stage(stage, view, ExtractiveModel(COUNTER), COUNTER, config=cfg)
    assert StageResult.model_validate_json(result.model_dump_json()) == result
    assert result.changed and result.tokens_after < result.tokens_before


def test_nothing_to_do_within_target() -> None:
    view = raw_view(next(conversations("tau_bench.jsonl"))["messages"])
    assert plan_next_stage(view, PipelineConfig(target_tokens=10**6), COUNTER) is None


def test_every_conversation_compacts_to_target_keeping_anchors_and_protocol() -> None:
    model = ExtractiveModel(COUNTER)
    for conv in sample():
        system, rest = logged(conv["messages"])
        view = View(version=0, system=tuple(system), tail=tuple(rest))
        pinned = [rest[i] for i in anchors(rest).indices()]
        # Half of the conversation, but never below what system prompt + anchors need.
        floor = COUNTER.count_messages([*system, *pinned]) + 400
        target = max(view.tokens(COUNTER) // 2, floor)
        run = compress_until_target(
            view, PipelineConfig(target_tokens=target, keep_recent_messages=4), model, COUNTER
        )
        out = run.view.messages()
        assert run.view.tokens(COUNTER) <= target, conv["id"]
        assert check_window(out) == [], conv["id"]
        found = anchors(rest)
        rendered = {m.context_message_id: m for m in out if m.context_message_id}
        for i in found.indices():
            assert rendered.get(rest[i].context_message_id) == rest[i], f"{conv['id']}: anchor {i} lost"
        check_coverage(run.view, [m.context_message_id or "" for m in rest])
        for block in run.view.blocks:
            assert not any(block.first_id <= a <= block.last_id for a in run.view.anchor_id_set())


def test_incremental_l1_blocks_have_provenance_and_summarise_only_new_range() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    system, rest = logged(conv["messages"])
    model = ScriptedModel()
    extractive = ExtractiveModel(COUNTER)
    half = len(rest) // 2
    view = View(version=0, system=tuple(system), tail=tuple(rest[:half]))
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 3)
    first = compress_until_target(view, cfg, extractive, COUNTER)
    cursor = first.view.covered_until
    assert cursor is not None and first.view.blocks
    l1 = first.results[0]
    assert l1.stage.kind == "l0_to_l1" and l1.changed
    assert all(b.level == 1 and b.tokens_before > b.tokens_after > 0 for b in l1.blocks)
    assert all(b.tokens_before > b.tokens_after > 0 for b in first.view.blocks)
    # New messages arrive; the next L0->L1 sees only what is after the cursor.
    grown = View(
        version=1,
        system=first.view.system,
        pinned=first.view.pinned,
        blocks=first.view.blocks,
        tail=tuple(m for m in rest if (m.context_message_id or "") > cursor),
        covered_until=cursor,
    )
    stage = plan_next_stage(grown, PipelineConfig(target_tokens=grown.tokens(COUNTER) // 2), COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1" and stage.first_id is not None
    assert stage.first_id > cursor and stage.block_ids == []
    model.texts = ['{"blocks": []}']
    run_stage(stage, grown, model, COUNTER, config=PipelineConfig(target_tokens=grown.tokens(COUNTER) // 2))
    contract = model.calls[0]
    assert contract is not None and contract.kind == "blocks"
    sources = [m.context_message_id for b in contract.blocks for m in b.source]
    assert sources and all((i or "") > cursor for i in sources)
    # Earlier blocks travel as context only.
    assert any("ROUND_LEVEL_MEMORY_BLOCK" in message_text(m) for m in contract.context)


def test_model_failure_escalates_to_hard_truncate_and_keeps_state_on_single_stage() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    view = raw_view(conv["messages"])
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 2)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    with pytest.raises(Exception) as info:
        run_stage(stage, view, FailingModel(), COUNTER, config=cfg)
    assert getattr(info.value, "kind", None) == "server_unstable"
    # In the loop, every model stage fails; with no block to truncate it stays over target.
    run = compress_until_target(view, cfg, FailingModel(), COUNTER)
    assert run.view == view and {k for k, _ in run.errors} >= {"l0_to_l1"}


def test_hard_truncate_brings_blocks_within_target_deterministically() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    view = raw_view(conv["messages"])
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 2, keep_recent_messages=2)
    first = compress_until_target(view, cfg, ExtractiveModel(COUNTER), COUNTER).view
    tight = PipelineConfig(target_tokens=first.tokens(COUNTER) - 300, keep_recent_messages=2)
    stage = Stage(
        kind="hard_truncate",
        based_on_version=first.version,
        target_tokens=tight.target_tokens,
        block_ids=[b.block_id for b in first.blocks],
    )
    a = run_stage(stage, first, None, COUNTER, config=tight)
    b = run_stage(stage, first, None, COUNTER, config=tight)
    assert a.model_dump(exclude={"blocks"}) == b.model_dump(exclude={"blocks"})
    assert [m.content for blk in a.blocks for m in blk.messages] == [
        m.content for blk in b.blocks for m in blk.messages
    ]
    assert a.changed and a.tokens_after <= tight.target_tokens
    assert all("...[TRUNCATED]..." in message_text(blk.messages[0]) for blk in a.blocks)


def six_listings() -> tuple[View, PipelineConfig, Stage]:
    """Six ``ls`` steps after a task, over a third of their size: one stage planned."""
    msgs: list[AnyMessage] = [UserMessage(content="fix the parser bug in src/parse.py")]
    for k in range(6):
        msgs.append(
            AssistantMessage(
                content=f"step {k}", tool_calls=[ToolCall(id="c1", name="bash", arguments='{"cmd": "ls"}')]
            )
        )
        msgs.append(ToolMessage(tool_call_id="c1", content=f"output line {k} " * 120))
    msgs.append(AssistantMessage(content="done"))
    rest = [m.model_copy(update={"context_message_id": f"{i:012d}"}) for i, m in enumerate(msgs, 1)]
    view = View(version=0, tail=tuple(rest))
    cfg = PipelineConfig(
        target_tokens=view.tokens(COUNTER) // 3, keep_recent_messages=0, l1_source_tokens=10**6
    )
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    return view, cfg, stage


def test_raw_fallback_when_model_ignores_json() -> None:
    view, cfg, stage = six_listings()
    result = run_stage(
        stage, view, ScriptedModel("The agent listed files six times; nothing found."), COUNTER, config=cfg
    )
    assert result.changed and len(result.blocks) == 1
    assert "nothing found" in message_text(result.blocks[0].messages[0])
    assert result.blocks[0].first_id == "000000000002"  # the task anchor stays pinned
    assert result.pinned == ["000000000001"]


def test_a_blocks_reply_with_empty_summaries_is_no_summary() -> None:
    # An extractive model with no room for a line answers the contract with empty summaries;
    # its JSON was saved as a block's text (prose fallback) before.
    view, cfg, stage = six_listings()
    empty = json.dumps({"blocks": [{"block_id": "block_1", "summary": ""}]})
    result = run_stage(stage, view, ScriptedModel(empty), COUNTER, config=cfg)
    assert not result.changed and result.blocks == []
    assert "no summary was usable" in (result.detail or result.error or "")


def test_wrong_block_ids_change_nothing_across_anchor() -> None:
    msgs: list[AnyMessage] = [UserMessage(content="task")]
    for _k in range(3):
        msgs += [
            AssistantMessage(content="", tool_calls=[ToolCall(id="c", name="bash")]),
            ToolMessage(tool_call_id="c", content="x " * 400),
        ]
    msgs.append(UserMessage(content="now do the next thing"))
    for _k in range(3):
        msgs += [
            AssistantMessage(content="", tool_calls=[ToolCall(id="c", name="bash")]),
            ToolMessage(tool_call_id="c", content="y " * 400),
        ]
    msgs.append(AssistantMessage(content="done"))
    rest = [m.model_copy(update={"context_message_id": f"{i:012d}"}) for i, m in enumerate(msgs, 1)]
    view = View(version=0, tail=tuple(rest))
    cfg = PipelineConfig(target_tokens=400, keep_recent_messages=0)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    bogus = json.dumps({"blocks": [{"block_id": "nope", "summary": "x"}]})
    result = run_stage(stage, view, ScriptedModel(bogus), COUNTER, config=cfg)
    assert not result.changed and result.blocks == [] and result.covered_until is None


def test_parse_blocks_tolerates_fences_and_noise() -> None:
    assert parse_blocks('```json\n{"blocks": [{"block_id": "a", "summary": " s "}]}\n```') == {"a": "s"}
    assert parse_blocks(
        'Here you go: {"blocks": [{"block_id": "a", "summary": "s"}, {"block_id": "", "summary": "x"}]} thanks'
    ) == {"a": "s"}
    assert parse_blocks("not json") == {}
    assert parse_blocks('{"blocks": "nope"}') == {}


def test_from_messages_recovers_blocks_from_rendered_context() -> None:
    view = raw_view(next(conversations("minisweagent.jsonl"))["messages"])
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 3)
    done = compress_until_target(view, cfg, ExtractiveModel(COUNTER), COUNTER).view
    again = View.from_messages(done.context_messages(), system=done.system)
    assert [b.block_id for b in again.blocks] == [b.block_id for b in done.blocks]
    assert [(b.first_id, b.last_id, b.level) for b in again.blocks] == [
        (b.first_id, b.last_id, b.level) for b in done.blocks
    ]
    assert again.covered_until == done.covered_until
    assert again.tail == done.tail
    assert again.context_messages() == done.context_messages()


def test_recursive_merge_raises_level() -> None:
    view = raw_view(next(conversations("dialogue_qa.jsonl"))["messages"])
    cfg = PipelineConfig(
        target_tokens=view.tokens(COUNTER) // 2, l1_source_tokens=1500, summarise_all_pending=True
    )
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1"
    l1 = run_stage(stage, view, ExtractiveModel(COUNTER), COUNTER, config=cfg)
    first = view.with_blocks(l1.blocks, l1.covered_until, version=1)
    assert len(first.blocks) > 2
    tighter = PipelineConfig(target_tokens=first.tokens(COUNTER) * 2 // 3, l1_source_tokens=1500)
    stage = plan_next_stage(first, tighter, COUNTER)
    assert stage is not None and stage.kind == "recursive_merge" and len(stage.block_ids) >= 2
    result = run_stage(stage, first, ExtractiveModel(COUNTER), COUNTER, config=tighter)
    assert result.changed and max(b.level for b in result.blocks) == 2


def test_summarizer_strategy_path() -> None:
    view = raw_view(next(conversations("minisweagent.jsonl"))["messages"])
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 2)
    seen: list[int] = []

    def summarizer(previous: object, pending: list[AnyMessage], target_tokens: int) -> list[AnyMessage]:
        seen.append(len(pending))
        return [UserMessage(content=f"did {len(pending)} things")]

    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    result = run_stage(stage, view, None, COUNTER, summarizer, config=cfg)
    assert result.changed and seen and all(n > 0 for n in seen)
    assert all("did" in message_text(b.messages[0]) for b in result.blocks)
