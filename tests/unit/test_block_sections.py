"""Pipeline blocks have the BLOCK_SECTIONS, in order, whatever wrote them (issue 16)."""

from __future__ import annotations

import json
import logging
import re

import pytest

from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, message_text
from ctxcore.pipeline import PipelineConfig, View, compress_until_target, plan_next_stage, run_stage
from ctxcore.pipeline.truncate import truncate_blocks
from ctxcore.pipeline.view import block_message
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.prompts import (
    BLOCK_SECTIONS,
    CURRENT_SECTIONS,
    ROUND_LEVEL_OUTPUT_CONTRACT,
)
from ctxcore.summarize.sections import conform_sections
from ctxcore.summarize.strategies import model as model_strategy
from ctxcore.tokens import TiktokenCounter
from tests.datasets import conversations
from tests.pipeline_helpers import ScriptedModel, logged

COUNTER = TiktokenCounter()
HEADING = re.compile(r"^## (.+)$", re.MULTILINE)


def summary_of(message: AnyMessage) -> str:
    return message_text(message).split("\nSummary:\n", 1)[1]


def assert_sectioned(summary: str) -> None:
    assert HEADING.findall(summary) == list(BLOCK_SECTIONS), summary
    for body in re.split(r"^## .+$", summary, flags=re.MULTILINE)[1:]:
        assert body.strip(), summary  # "(none)" at least


def test_the_prompt_asks_for_the_sections_and_the_tags() -> None:
    for title in BLOCK_SECTIONS:
        assert f'"## {title}"' in ROUND_LEVEL_OUTPUT_CONTRACT
    assert "(none)" in ROUND_LEVEL_OUTPUT_CONTRACT and '"- tool <name>: "' in ROUND_LEVEL_OUTPUT_CONTRACT


def test_extractive_blocks_have_every_section_in_order() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    _, rest = logged(conv["messages"])
    contract = OutputContract(
        kind="blocks",
        sections=list(BLOCK_SECTIONS),
        blocks=[
            ContractBlock(block_id="a", target_tokens=400, source=rest[1:30]),
            ContractBlock(block_id="b", target_tokens=300, source=rest[30:60]),
        ],
    )
    text = ExtractiveModel(COUNTER).complete([], max_tokens=2000, contract=contract).text
    blocks = json.loads(text)["blocks"]
    for block, target in zip(blocks, (400, 300), strict=True):
        assert_sectioned(block["summary"])
        assert COUNTER.count_text(block["summary"]) <= target
        assert "(none)" in block["summary"] or all(
            b.strip() for b in re.split(r"^## .+$", block["summary"], flags=re.MULTILINE)[1:]
        )


def test_pipeline_l1_and_merge_blocks_are_sectioned_and_merges_keep_sections() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    system, rest = logged(conv["messages"])
    view = View(version=0, system=tuple(system), tail=tuple(rest))
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 6)
    run = compress_until_target(view, cfg, ExtractiveModel(COUNTER), COUNTER)
    kinds = {r.stage.kind for r in run.results if r.changed}
    assert "l0_to_l1" in kinds and "recursive_merge" in kinds
    assert run.view.blocks and max(b.level for b in run.view.blocks) >= 2
    for block in run.view.blocks:
        assert_sectioned(summary_of(block.messages[0]))


def _block(text: str, first: str, last: str) -> SummaryBlock:
    message = block_message(
        text, block_id=f"L1-{first}-{last}", first_id=first, last_id=last, level=1, scope="s"
    )
    return SummaryBlock(
        block_id=f"L1-{first}-{last}",
        messages=[message.model_copy(update={"context_message_id": first})],
        first_id=first,
        last_id=last,
        level=1,
        tokens_before=5000,
        tokens_after=200,
    )


def test_a_merge_rebuilds_each_section_from_the_same_section() -> None:
    a = (
        "## Task state\n- user: make the parser accept leap days\n## Files and changes\n"
        '- tool edit_file: src/parse.py <- path="src/parse.py" -> wrote 14 lines\n'
        "## Errors and fixes tried\n- tool run_tests: ValueError: day is out of range for month\n"
        "## Decisions\n- assistant: use calendar.isleap instead of a hand-written check\n"
        "## Next steps\n- assistant: rerun the full test suite afterwards"
    )
    b = (
        "## Task state\n- tool bash: python -m pytest -q -> 3 failed, 40 passed\n## Files and changes\n(none)\n"
        "## Errors and fixes tried\n- tool bash: AssertionError: expected 29 got 28 in test_feb\n"
        "## Decisions\n(none)\n## Next steps\n- assistant: look at the February branch of parse()"
    )
    blocks = (_block(a, "000000000002", "000000000040"), _block(b, "000000000041", "000000000080"))
    view = View(version=3, blocks=blocks, covered_until="000000000080")
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) - 40)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "recursive_merge"
    result = run_stage(stage, view, ExtractiveModel(COUNTER), COUNTER, config=cfg)
    assert result.changed and len(result.blocks) == 1 and result.blocks[0].level == 2
    merged = summary_of(result.blocks[0].messages[0])
    assert_sectioned(merged)
    sections = dict(
        zip(HEADING.findall(merged), re.split(r"^## .+$", merged, flags=re.MULTILINE)[1:], strict=True)
    )
    assert "ValueError: day is out of range" in sections["Errors and fixes tried"]
    assert "AssertionError: expected 29 got 28" in sections["Errors and fixes tried"]
    assert "src/parse.py <- " in sections["Files and changes"]
    assert "calendar.isleap" in sections["Decisions"]
    # Rebuilt, not pasted: each heading once.
    assert merged.count("## Task state") == 1


def test_a_reply_missing_headings_is_accepted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    conv = next(conversations("minisweagent.jsonl"))
    system, rest = logged(conv["messages"])
    view = View(version=0, system=tuple(system), tail=tuple(rest))
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 3)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1"
    ids = [b for b in stage.block_ids] or None
    assert ids is None
    reply = "## Decisions\n- assistant: kept the old API\nno tag and no heading on this line"
    model = ScriptedModel(json.dumps({"blocks": [{"block_id": "block_1", "summary": reply}]}))
    with caplog.at_level(logging.WARNING, logger="ctxcore.summarize.sections"):
        result = run_stage(stage, view, model, COUNTER, config=cfg)
    contract = model.calls[0]
    assert contract is not None and contract.sections == list(BLOCK_SECTIONS)
    assert result.changed
    summary = summary_of(result.blocks[0].messages[0])
    assert_sectioned(summary)
    assert "- assistant: kept the old API\nno tag and no heading on this line" in summary
    assert "'Task state'" in caplog.text and "'Next steps'" in caplog.text


def test_conform_sections_keeps_everything_the_model_wrote() -> None:
    text = "preamble line\n### next steps\n- user: go on\n## Task State:\n- assistant: working"
    out = conform_sections(text, BLOCK_SECTIONS)
    assert out.splitlines()[0] == "preamble line"
    assert HEADING.findall(out) == list(BLOCK_SECTIONS)
    assert "## Task state\n- assistant: working" in out and "## Next steps\n- user: go on" in out
    assert conform_sections("anything", ()) == "anything"


def test_the_l1_strategy_asks_for_sections() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    _, rest = logged(conv["messages"])
    scripted = ScriptedModel('{"blocks": [{"block_id": "summary", "summary": "- user: only a line"}]}')
    out = model_strategy(scripted)([], rest[1:20], 300)
    assert out is not None and scripted.calls[0] is not None
    assert scripted.calls[0].sections == list(BLOCK_SECTIONS)
    assert_sectioned(message_text(out[0]))


def test_snapshots_keep_their_own_sections() -> None:
    conv = next(conversations("minisweagent.jsonl"))
    _, rest = logged(conv["messages"])
    contract = OutputContract(
        kind="state_snapshot", sections=list(CURRENT_SECTIONS), source=rest[1:40], target_tokens=800
    )
    text = ExtractiveModel(COUNTER).complete([], max_tokens=1000, contract=contract).text
    assert HEADING.findall(text) == list(CURRENT_SECTIONS)
    assert ROUND_LEVEL_MEMORY_BLOCK not in text


def test_hard_truncate_keeps_sections_and_whole_lines() -> None:
    lines = "\n".join(f"- tool bash: step {n} printed value_{n} and more words" for n in range(60))
    a = f"## Task state\n{lines}\n## Files and changes\n(none)\n## Errors and fixes tried\n- tool bash: ValueError: x"
    b = "## Task state\n- user: keep going\n## Next steps\n- assistant: run the tests"
    blocks = (_block(a, "000000000002", "000000000040"), _block(b, "000000000041", "000000000080"))
    view = View(version=3, blocks=blocks, covered_until="000000000080")
    target = view.tokens(COUNTER) // 3
    out = truncate_blocks(view, PipelineConfig(target_tokens=target), COUNTER, target)
    assert len(out) == 1
    summary = summary_of(out[0].messages[0])
    assert_sectioned(summary)
    body = [line for line in summary.splitlines() if line and not line.startswith("## ")]
    allowed = set(a.splitlines()) | set(b.splitlines()) | {"(none)", "...[TRUNCATED]..."}
    assert set(body) <= allowed, set(body) - allowed
    assert "- tool bash: ValueError: x" in body and "- assistant: run the tests" in body
    lines_only = [line for line in body if line != "(none)"]
    assert len(lines_only) == len(set(lines_only))
