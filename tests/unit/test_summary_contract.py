"""The summary contract: what a block keeps of the steps it replaces (line numbers, the agent's
plan, open items, code lines of the working set), asked of an LLM by the prompt, followed by the
extractive model and checked by the stage before it saves a block (``pipeline/verify.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, message_text
from ctxcore.pipeline import PipelineConfig, StageResult, View, plan_next_stage, run_stage
from ctxcore.summarize import Completion, ExtractiveModel, ModelClient, OutputContract, Usage
from ctxcore.summarize.prompts import CONTENT_RULE, ROUND_LEVEL_OUTPUT_CONTRACT
from ctxcore.tokens import TiktokenCounter

COUNTER = TiktokenCounter()
PLAN = (
    "THOUGHT: My plan:\n"
    "1. Change `parse_date` in src/dates/parse.py at line 42 to accept leap days.\n"
    "2. Run tests/test_parse.py again."
)
EDIT = "sed -i '42s/%Y-%m-%d/%G-%m-%d/;57s/strict=True/strict=False/' src/dates/parse.py"
CODE = (
    "    40\tdef parse_date(text: str) -> date:\n"
    "    41\t    # the only entry point\n"
    "    42\t    return datetime.strptime(text, '%Y-%m-%d').date()"
)


def bash(cid: str, command: str, text: str = "") -> AssistantMessage:
    return AssistantMessage(
        content=text, tool_calls=[ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))]
    )


def out(cid: str, text: str) -> ToolMessage:
    return ToolMessage(tool_call_id=cid, name="bash", content=text)


def run() -> list[AnyMessage]:
    msgs: list[AnyMessage] = [UserMessage(content="Fix the date parser so that 2024-02-29 is accepted.")]
    msgs += [bash("c1", "nl -ba src/dates/parse.py | sed -n '40,42p'", PLAN), out("c1", CODE)]
    msgs += [
        bash("c2", EDIT, "THOUGHT: Next, I still need to update the docs in docs/dates.rst."),
        out("c2", "<returncode>0</returncode>"),
    ]
    for k in range(12):
        msgs += [
            bash(f"f{k}", f"grep -rn helper_{k} src/other_{k}.py", f"THOUGHT: looking at helper {k}."),
            out(f"f{k}", f"src/other_{k}.py:{k + 3}: def helper_{k}(value): return value + {k} " * 6),
        ]
    # The newest steps: the agent is back at parse_date in src/dates/parse.py.
    msgs += [
        bash("r1", "nl -ba src/dates/parse.py | sed -n '40,45p'", "THOUGHT: check `parse_date` once more."),
        out("r1", CODE),
    ]
    return [m.model_copy(update={"context_message_id": f"{i:012d}"}) for i, m in enumerate(msgs, 1)]


class Recording:
    """A model that records its prompt and contract and answers with a fixed block summary."""

    name = "recording"

    def __init__(self, summary: str) -> None:
        self.summary = summary
        self.prompts: list[str] = []
        self.contracts: list[OutputContract | None] = []

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.prompts.append(message_text(messages[-1]))
        self.contracts.append(contract)
        assert contract is not None
        blocks = [{"block_id": b.block_id, "summary": self.summary} for b in contract.blocks]
        return Completion(json.dumps({"blocks": blocks}), Usage(10, 5, 15))


def staged(model: ModelClient, keep_recent: int = 2) -> tuple[View, StageResult]:
    view = View(version=0, tail=tuple(run()))
    cfg = PipelineConfig(
        target_tokens=view.tokens(COUNTER) // 2, keep_recent_messages=keep_recent, l1_source_tokens=10**6
    )
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    return view, run_stage(stage, view, model, COUNTER, config=cfg)


def test_the_prompt_asks_for_line_numbers_the_plan_open_items_and_working_set_code() -> None:
    assert CONTENT_RULE in ROUND_LEVEL_OUTPUT_CONTRACT
    asked_for = (
        "line number",
        "plan",
        "open items",
        "code lines",
        "working set",
        "bare list",
        "whole",
        "field name",
    )
    for asked in asked_for:
        assert asked in CONTENT_RULE, asked


def test_a_stage_sends_the_rule_with_the_newest_messages_as_protected_context() -> None:
    model = Recording("## Task state\n- user: Fix the date parser.\n## Files and changes\n(none)")
    staged(model)
    assert model.prompts and CONTENT_RULE in model.prompts[0]
    # The working set the rule names is what the protected recent context acts on.
    protected = model.prompts[0].split("[Protected Recent Context]", 1)[1]
    assert "nl -ba src/dates/parse.py | sed -n '40,45p'" in protected


def test_the_extractive_model_follows_the_same_contract() -> None:
    _, result = staged(ExtractiveModel(COUNTER))
    assert result.changed
    text = "\n".join(message_text(m) for b in result.blocks for m in b.messages)
    assert EDIT in text  # the edit whole, both line numbers (a cut one is a bare-token line)
    assert "40 def parse_date(text: str) -> date:" in text  # a code line of the working set
    summary_lines = [ln[2:] for ln in text.splitlines() if ln.startswith("- ")]
    bare = [
        ln for ln in summary_lines if not re.search(r"(?:^|\s)[a-z]{3,}(?=$|[\s.,;:])", ln.split(": ", 1)[-1])
    ]
    assert bare == [], bare


def test_an_llm_summary_that_drops_the_working_set_gets_its_lines_back_recorded() -> None:
    model = Recording("## Task state\n- user: Fix the date parser.\n## Files and changes\n(none)")
    _, result = staged(model)
    assert result.changed and result.restored_lines >= 1 and result.kept_raw == 0
    assert "lines restored" in result.detail
    text = "\n".join(message_text(m) for b in result.blocks for m in b.messages)
    assert "parse_date" in text and "src/dates/parse.py" in text


def test_an_llm_summary_with_no_room_for_the_working_set_leaves_the_steps_raw() -> None:
    # Nothing in the reply may go to make room (the user's line only): the target stays raw.
    filler = "\n".join(f"- user: requirement {k} stays as the user wrote it." for k in range(400))
    model = Recording(f"## Task state\n{filler}\n## Files and changes\n(none)")
    view, result = staged(model)
    assert result.kept_raw >= 1 and result.restored_lines == 0
    assert not result.changed and result.blocks == list(view.blocks)
