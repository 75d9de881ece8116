"""ExtractiveModel: deterministic, within target, faithful to the contract, keeps what matters."""

from __future__ import annotations

import json
import re

import pytest

from ctxcore.markers import MEMORY_BLOCK_ROUND
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    from_openai,
)
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.tokens import EstimateCounter, TiktokenCounter
from tests.datasets import conversations

SECTIONS = [
    "Active Task",
    "Constraints and Preferences",
    "Completed Work",
    "Pending Tasks and Next Useful Step",
    "Key Facts, Decisions, Evidence, and Fixes",
    "Files, Code Areas, and Artifacts",
    "Blockers, Risks, and Verification",
    "Critical Context",
]
TASK = "Please fix the failing date parser in src/dates/parse.py so that 2024-02-29 is accepted."
PROMPT = [SystemMessage(content="You compress."), UserMessage(content="Summarise the work below.")]


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


@pytest.fixture(scope="module")
def model(counter: TiktokenCounter) -> ExtractiveModel:
    return ExtractiveModel(counter)


def call(cid: str, name: str, **args: object) -> AssistantMessage:
    return AssistantMessage(content="", tool_calls=[ToolCall(id=cid, name=name, arguments=json.dumps(args))])


def session(steps: int = 12) -> list[AnyMessage]:
    """A small coding session: a task, reads, an error, edits, a correction, a filler."""
    out: list[AnyMessage] = [UserMessage(content=TASK)]
    out += [
        call("c1", "read_file", path="src/dates/parse.py"),
        ToolMessage(tool_call_id="c1", content="def parse(s):\n    return datetime.strptime(s, '%Y-%m-%d')"),
        call("c2", "run_tests", target="tests/test_parse.py"),
        ToolMessage(
            tool_call_id="c2",
            content="collected 12 items\nFAILED tests/test_parse.py::test_leap - ValueError: day is out of range for month",
            metadata={"is_error": True},
        ),
        AssistantMessage(content="I decided to use calendar.isleap instead of a hand-written check."),
        call("c3", "edit_file", path="src/dates/parse.py", content="v1"),
        ToolMessage(tool_call_id="c3", content="wrote 14 lines"),
        UserMessage(content="Don't touch tests/test_parse.py, only change the parser."),
    ]
    for n in range(steps):
        out += [
            AssistantMessage(content=f"Looking around a bit more, step {n}, nothing special here at all."),
            call(f"f{n}", "list_dir", path="."),
            ToolMessage(tool_call_id=f"f{n}", content="README.md\nsrc\ntests"),
        ]
    out += [
        call("c4", "edit_file", path="src/dates/parse.py", content="v2"),
        ToolMessage(tool_call_id="c4", content="wrote 15 lines"),
        AssistantMessage(content="Next step: run the full suite and report to the user."),
    ]
    return out


def snapshot(source: list[AnyMessage], target: int, **kwargs: object) -> OutputContract:
    return OutputContract(
        kind="state_snapshot", sections=SECTIONS, source=source, target_tokens=target, **kwargs
    )  # type: ignore[arg-type]


def sections_of(text: str) -> dict[str, str]:
    assert text.startswith("<state_snapshot>\n") and text.endswith("</state_snapshot>")
    parts = re.split(r"^## (.+)$", text[len("<state_snapshot>\n") : -len("</state_snapshot>")], flags=re.M)
    return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts), 2)}


def test_snapshot_has_every_section_in_order(model: ExtractiveModel) -> None:
    text = model.complete(PROMPT, max_tokens=2000, contract=snapshot(session(), 600)).text
    found = sections_of(text)
    assert list(found) == SECTIONS
    assert all(body for body in found.values())


def test_keeps_task_verbatim_errors_paths_and_latest_file_state(model: ExtractiveModel) -> None:
    text = model.complete(PROMPT, max_tokens=2000, contract=snapshot(session(), 600)).text
    found = sections_of(text)
    assert TASK in found["Active Task"]
    assert "Don't touch tests/test_parse.py, only change the parser." in text
    assert "ValueError: day is out of range for month" in text
    assert "src/dates/parse.py" in found["Files, Code Areas, and Artifacts"]
    # Only the latest edit of the file is its state.
    assert '"v2"' in text and '"v1"' not in text
    assert "calendar.isleap" in text
    # The error lands in an error-like section, not among the requests.
    assert "day is out of range" in found["Blockers, Risks, and Verification"]
    assert "day is out of range" not in found["Active Task"]


def test_filler_is_dropped_first_under_pressure(model: ExtractiveModel) -> None:
    text = model.complete(PROMPT, max_tokens=2000, contract=snapshot(session(40), 260)).text
    assert text.count("nothing special here") <= 2
    for kept in (TASK, "day is out of range", "src/dates/parse.py <-", "Don't touch", "calendar.isleap"):
        assert kept in text


def test_deterministic(model: ExtractiveModel, counter: TiktokenCounter) -> None:
    contract = snapshot(session(), 300)
    first = model.complete(PROMPT, max_tokens=1000, contract=contract).text
    again = ExtractiveModel(TiktokenCounter()).complete(PROMPT, max_tokens=1000, contract=contract).text
    roundtrip = OutputContract.model_validate_json(contract.model_dump_json())
    assert first == again == model.complete(PROMPT, max_tokens=1000, contract=roundtrip).text


@pytest.mark.parametrize("target", [40, 80, 150, 300, 700, 2000])
def test_never_over_target(model: ExtractiveModel, counter: TiktokenCounter, target: int) -> None:
    result = model.complete(PROMPT, max_tokens=10_000, contract=snapshot(session(30), target))
    assert counter.count_text(result.text) <= target
    assert result.usage.output_tokens == counter.count_text(result.text)
    assert result.usage.input_tokens == counter.count_messages(PROMPT)
    # max_tokens caps the output as well.
    capped = model.complete(PROMPT, max_tokens=target // 2, contract=snapshot(session(30), target))
    assert counter.count_text(capped.text) <= target // 2


def test_fills_most_of_the_target(model: ExtractiveModel, counter: TiktokenCounter) -> None:
    text = model.complete(PROMPT, max_tokens=5000, contract=snapshot(session(60), 500)).text
    assert counter.count_text(text) >= 400


def test_long_task_is_shortened_head_and_tail(model: ExtractiveModel, counter: TiktokenCounter) -> None:
    task = "START of the task. " + "Some detail about the requirement. " * 300 + "END of the task."
    text = model.complete(PROMPT, max_tokens=5000, contract=snapshot([UserMessage(content=task)], 200)).text
    assert counter.count_text(text) <= 200
    assert "START of the task." in text and "END of the task." in text and "…" in text


def test_blocks_json_with_exact_ids_within_each_target(
    model: ExtractiveModel, counter: TiktokenCounter
) -> None:
    source = session(20)
    contract = OutputContract(
        kind="blocks",
        blocks=[
            # 75, not 60: every line now carries its source tag ("- tool run_tests: ").
            ContractBlock(block_id="blk-1", target_tokens=75, source=source[:9]),
            ContractBlock(block_id="blk-2", target_tokens=120, source=source[9:]),
            ContractBlock(block_id="blk-3", target_tokens=30, source=[]),
        ],
        query="leap year parsing",
    )
    text = model.complete(PROMPT, max_tokens=1000, contract=contract).text
    blocks = json.loads(text)["blocks"]
    assert [b["block_id"] for b in blocks] == ["blk-1", "blk-2", "blk-3"]
    assert set(blocks[0]) == {"block_id", "summary"}
    for block, target in zip(blocks, (75, 120, 30), strict=True):
        assert counter.count_text(block["summary"]) <= target
    assert "src/dates/parse.py" in blocks[0]["summary"]
    assert "v2" in blocks[1]["summary"]
    assert blocks[2]["summary"] == ""


def test_blocks_respect_max_tokens_overall(model: ExtractiveModel, counter: TiktokenCounter) -> None:
    source = session(30)
    contract = OutputContract(
        kind="blocks",
        blocks=[ContractBlock(block_id=f"b{i}", target_tokens=400, source=source[i::3]) for i in range(3)],
    )
    text = model.complete(PROMPT, max_tokens=300, contract=contract).text
    assert counter.count_text(text) <= 300
    assert [b["block_id"] for b in json.loads(text)["blocks"]] == ["b0", "b1", "b2"]


def test_without_contract_excerpts_the_last_user_message(
    model: ExtractiveModel, counter: TiktokenCounter
) -> None:
    long = "alpha " * 500 + "omega"
    text = model.complete([UserMessage(content="first"), UserMessage(content=long)], max_tokens=50).text
    assert counter.count_text(text) <= 50 and text.startswith("alpha") and text.endswith("omega")
    assert model.complete([UserMessage(content="short")], max_tokens=50).text == "short"
    assert model.complete([SystemMessage(content="x")], max_tokens=50).text == ""


def test_earlier_summaries_are_mined_not_their_boilerplate(model: ExtractiveModel) -> None:
    block = (
        f"{MEMORY_BLOCK_ROUND}\n<meaning>An earlier checkpoint, not a new request.</meaning>\n"
        "<conflict_policy>Newer messages win.</conflict_policy>\n<summary>\n<state_snapshot>\n"
        "## Active Task\n- Migrate billing to Postgres 16 by 2024-07-01\n"
        "## Blockers, Risks, and Verification\n- psycopg.OperationalError: connection refused on db-7\n"
        "## Critical Context\n(none)\n</state_snapshot>\n</summary>\n</memory_block_round>"
    )
    source: list[AnyMessage] = [
        UserMessage(content=block),
        AssistantMessage(content="Continuing the migration."),
    ]
    text = model.complete(PROMPT, max_tokens=500, contract=snapshot(source, 200)).text
    assert "Migrate billing to Postgres 16 by 2024-07-01" in text
    assert "connection refused on db-7" in text
    assert "Newer messages win" not in text and "<meaning>" not in text


def test_the_query_does_not_steer_the_extractive_choice(counter: TiktokenCounter) -> None:
    # Words shared with the request were a hand weight of the line features; it did not
    # pay on the development halves and went (bench/README, issue 33). LLM prompts carry
    # the query and the user's instruction.
    model = ExtractiveModel(counter)
    facts: list[AnyMessage] = [UserMessage(content="Collect facts.")]
    facts += [
        AssistantMessage(content=f"Fact {i}: the {w} server runs version {i}.{i}.")
        for i, w in enumerate(["orange", "purple", "yellow", "silver", "crimson", "indigo"])
    ]
    plain = model.complete(PROMPT, max_tokens=500, contract=snapshot(facts, 125)).text
    steered = model.complete(
        PROMPT, max_tokens=500, contract=snapshot(facts, 125, query="what about orange?")
    ).text
    assert steered == plain


def test_any_counter_works() -> None:
    result = ExtractiveModel(EstimateCounter()).complete(
        PROMPT, max_tokens=500, contract=snapshot(session(), 120)
    )
    assert len(result.text) // 4 <= 120


@pytest.mark.slow
def test_real_conversations_stay_within_target(model: ExtractiveModel, counter: TiktokenCounter) -> None:
    for record in conversations(every=25):
        messages = from_openai(
            [
                {
                    **m,
                    "tool_calls": [
                        {"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in m["tool_calls"]
                    ],
                }
                if m.get("tool_calls")
                else m
                for m in record["messages"]
            ]
        )
        target = max(counter.count_messages(messages) // 10, 50)
        text = model.complete(PROMPT, max_tokens=target, contract=snapshot(messages, target)).text
        assert counter.count_text(text) <= target
        assert list(sections_of(text)) == SECTIONS
