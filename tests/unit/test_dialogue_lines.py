"""Dialogue summaries spend their tokens on what was said: a speaker's sentences in a row
share one tagged line, a merge can still drop one of them, and a question is worth less
than a statement."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest

from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.extractive.extract import extract
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.summarize.sections import skeleton
from ctxcore.tokens import TiktokenCounter

TAGGED = re.compile(r"^- (?:user|assistant|tool \S+): \S")


@pytest.fixture(scope="module")
def model() -> ExtractiveModel:
    return ExtractiveModel(TiktokenCounter())


def summary(model: ExtractiveModel, source: Sequence[AnyMessage], target: int = 600) -> str:
    contract = OutputContract(
        kind="blocks",
        blocks=[ContractBlock(block_id="b", target_tokens=target, source=list(source))],
        sections=list(BLOCK_SECTIONS),
    )
    text = model.complete([], max_tokens=target * 2 + 200, contract=contract).text
    return str(json.loads(text)["blocks"][0]["summary"])


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ")]


def chat() -> list[AnyMessage]:
    return [
        UserMessage(
            content="[Session 2: 9:00 am on 3 March, 2024]\n"
            "Ann: I moved to Lisbon in March. Wow! I work at the Alfama bakery now."
        ),
        AssistantMessage(
            content="Bob: Lisbon suits you. My sister Clara opened a bookshop in Porto last week."
        ),
        UserMessage(content="Ann: Is the bookshop near the river? I should visit Porto soon."),
    ]


def test_a_speakers_sentences_share_one_line(model: ExtractiveModel) -> None:
    lines = lines_of(summary(model, chat()))
    assert all(TAGGED.match(line) for line in lines), lines
    # Sentences next to each other in the message: one line, one tag, one label.
    assert (
        "- assistant: Bob: Lisbon suits you. My sister Clara opened a bookshop in Porto last week." in lines
    )
    # "Wow!" says nothing and is no line: the sentences either side of it are not next to
    # each other any more, and the line marks the gap.
    assert "- user: Ann: I moved to Lisbon in March. … I work at the Alfama bakery now." in lines
    # Each message's run is its own line (the other speaker's message lies between).
    assert sum(line.startswith("- user: Ann: ") for line in lines) == 2, lines
    # The session's date line is no speaker's: it stays a line of its own.
    assert "- user: [Session 2: 9:00 am on 3 March, 2024]" in lines


def test_tool_output_lines_are_never_joined(model: ExtractiveModel) -> None:
    earlier = UserMessage(
        content=f"{ROUND_LEVEL_MEMORY_BLOCK}\n\nSummary:\n## Task state\n"
        "- tool bash: Result: 3 rows updated in the orders table\n"
        "- tool bash: Result: 5 rows updated in the invoices table\n"
        "- assistant: Note: the orders table has a trigger on update"
    )
    lines = lines_of(summary(model, [earlier, UserMessage(content="Check the update counts.")]))
    assert "- tool bash: Result: 3 rows updated in the orders table" in lines
    assert "- tool bash: Result: 5 rows updated in the invoices table" in lines


def test_a_merge_reads_each_sentence_of_a_joined_line_back(model: ExtractiveModel) -> None:
    block = summary(model, chat())
    earlier = UserMessage(content=f"{ROUND_LEVEL_MEMORY_BLOCK}\n\nSummary:\n{block}")
    later: list[AnyMessage] = [
        AssistantMessage(content="Bob: Clara sells rare maps and old atlases there."),
        UserMessage(content="Ann: I will bring my grandfather's sea charts from Madeira."),
    ]
    roomy = lines_of(summary(model, [earlier, *later], target=600))
    # With room for everything the joined lines come back as they were.
    for line in lines_of(block):
        assert line in roomy, (line, roomy)
    # Tight, the merge keeps single sentences of a joined line.
    tight = summary(model, [earlier, *later], target=110)
    sentences = {
        "I moved to Lisbon in March.",
        "I work at the Alfama bakery now.",
        "Lisbon suits you.",
        "My sister Clara opened a bookshop in Porto last week.",
        "Is the bookshop near the river?",
        "I should visit Porto soon.",
        "Clara sells rare maps and old atlases there.",
        "I will bring my grandfather's sea charts from Madeira.",
    }
    kept = []
    for line in lines_of(tight):
        rest = line.split(": ", 1)[1]
        if rest.startswith("[Session"):
            continue
        rest = rest.split(": ", 1)[1]
        pieces = [p for part in rest.split(" … ") for p in re.split(r"(?<=[.!?])\s+(?=[A-Z])", part)]
        # Whole sentences; the filler that ends the budget may be one's first words.
        assert all(any(s == p or s.startswith(p + " ") for s in sentences) for p in pieces), (line, tight)
        kept.extend(pieces)
    assert 0 < len(kept) < len(sentences), tight


def test_a_question_is_worth_less_than_a_statement(model: ExtractiveModel) -> None:
    source: list[AnyMessage] = [
        UserMessage(content="Ann: Did Clara move the piano to the Leeds studio?"),
        AssistantMessage(content="Bob: Clara moved the piano to the Leeds studio."),
    ]
    found = extract(source, context=[], with_paths=False)
    question, statement = found.items
    assert question.text.endswith("?") and statement.text.endswith(".")
    assert question.decay == pytest.approx(0.5 * statement.decay)
    # Room for one of the two: the answer, not the question.
    answer = "- assistant: Bob: Clara moved the piano to the Leeds studio."
    target = model.count(skeleton(BLOCK_SECTIONS)) + model.count(answer) + 2
    assert lines_of(summary(model, source, target=target)) == [answer]
