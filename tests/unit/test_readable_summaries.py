"""Readable summary lines (issue 16): a source tag on every line, no broken lines, no repeats."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest

from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, from_openai
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.extractive.features import clip, head_words, tail_words
from ctxcore.tokens import TiktokenCounter
from tests.datasets import swe_runs

TAGGED = re.compile(r"^- (?:user|assistant|tool \S+): \S")
WORD = re.compile(r"\w+")


@pytest.fixture(scope="module")
def model() -> ExtractiveModel:
    return ExtractiveModel(TiktokenCounter())


def call(cid: str, name: str, **args: object) -> AssistantMessage:
    return AssistantMessage(content="", tool_calls=[ToolCall(id=cid, name=name, arguments=json.dumps(args))])


def summary(model: ExtractiveModel, source: Sequence[AnyMessage], target: int = 400) -> str:
    contract = OutputContract(
        kind="blocks", blocks=[ContractBlock(block_id="b", target_tokens=target, source=list(source))]
    )
    text = model.complete([], max_tokens=target * 2 + 200, contract=contract).text
    return str(json.loads(text)["blocks"][0]["summary"])


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def vocabulary(source: Sequence[AnyMessage]) -> set[str]:
    # The summariser's own markers for a call without output: no cut.
    words: set[str] = {"no", "result", "empty", "cancelled"}
    for message in source:
        words.update(WORD.findall(message.text))
        if isinstance(message, AssistantMessage):
            for c in message.tool_calls:
                words.update(WORD.findall(f"{c.name} {c.arguments}"))
                # Decoded too: a script's lines follow a newline the JSON text escapes.
                try:
                    decoded = json.loads(c.arguments)
                except ValueError:
                    continue
                if isinstance(decoded, dict):
                    words.update(WORD.findall(" ".join(str(v) for v in decoded.values())))
    return words


def cuts(text: str, words: set[str]) -> list[str]:
    """Lines whose last word, or the word before an ellipsis, is not a word of the source."""
    bad = []
    for line in lines_of(text):
        ends = [m.group(0) for m in re.finditer(r"\w+(?=\W*…)", line)]
        last = WORD.findall(line)
        if last:
            ends.append(last[-1])
        if any(w not in words for w in ends):
            bad.append(line)
    return bad


def session() -> list[AnyMessage]:
    return [
        UserMessage(content="Please fix the parser in src/parse.py so that leap days parse."),
        AssistantMessage(content="I will read the parser first because the bug is probably there."),
        call("c1", "read_file", path="src/parse.py"),
        ToolMessage(tool_call_id="c1", content="def parse(s):\n    return strptime(s)"),
        call("c2", "run_tests", target="tests/test_parse.py"),
        ToolMessage(tool_call_id="c2", content="FAILED tests/test_parse.py::test_leap - ValueError: day"),
        AssistantMessage(content="The fix is to use calendar.isleap in the parser."),
        call("c3", "bash", command="cd /testbed && python -m pytest -q"),
    ]


def test_every_line_says_who_wrote_it(model: ExtractiveModel) -> None:
    text = summary(model, session())
    lines = lines_of(text)
    assert lines and all(TAGGED.match(line) for line in lines), text
    assert any(line.startswith("- user: Please fix the parser") for line in lines)
    assert any(line.startswith("- assistant: The fix is") for line in lines)
    # A call with its result is tagged by the tool whose output it shows ...
    assert any(line.startswith("- tool run_tests: ") and "FAILED" in line for line in lines)
    # ... a call still waiting for its result by the assistant that made it.
    assert any(line.startswith("- assistant: bash(") for line in lines)


def test_a_line_of_an_earlier_block_keeps_its_tag(model: ExtractiveModel) -> None:
    earlier = UserMessage(
        content=f"{ROUND_LEVEL_MEMORY_BLOCK}\nprocessor: RoundLevelCompressor\n\nSummary:\n"
        "- tool grep: src/parse.py:12: return strptime(s) matched the date format\n"
        "- user: keep the public API unchanged for the callers\n"
        "an untagged line from a model that wrote no tags at all"
    )
    text = summary(model, [earlier, *session()[1:4]])
    assert "- tool grep: src/parse.py:12: return strptime(s) matched the date format" in text
    assert "- user: keep the public API unchanged for the callers" in text
    # A model reply without tags is accepted: its line stays, untagged.
    assert "- an untagged line from a model that wrote no tags at all" in text


def test_no_line_twice_in_a_block(model: ExtractiveModel) -> None:
    earlier = UserMessage(
        content=f"{ROUND_LEVEL_MEMORY_BLOCK}\n\nSummary:\n"
        "- assistant: The fix is to use   calendar.isleap in the parser.\n"
        "- user: The fix is to use calendar.isleap in the parser."
    )
    text = summary(model, [earlier, *session()[1:]])
    keys = [" ".join(line.split(": ", 1)[1].split()).casefold() for line in lines_of(text)]
    assert len(keys) == len(set(keys)), text


def test_whitespace_and_wordless_sources_give_no_line(model: ExtractiveModel) -> None:
    noise = "\x00\x01\ufffd\ufffd\x7f ~~ ### --- *** \t \u2028"
    source: list[AnyMessage] = [
        UserMessage(content="Report what the tool printed."),
        call("c1", "cat_blob", path="blob.bin"),
        ToolMessage(tool_call_id="c1", content=f"{noise}\n   \n{noise}"),
        AssistantMessage(content="   \n\t\n" + noise),
    ]
    text = summary(model, source)
    for line in lines_of(text):
        assert re.search(r"[^\W_]{2,}|\d", line.split(": ", 1)[-1]), line
    assert "\ufffd" not in text and "~~" not in text


def test_clipping_keeps_whole_words() -> None:
    text = "alpha beta gamma delta epsilon"
    assert clip(text, 14) == "alpha beta"
    assert clip(text, 14, mark=True) == "alpha beta …"
    assert head_words(text, 13) == "alpha beta"
    assert tail_words(text, 15) == "delta epsilon"
    blob = "f" * 500
    # A token longer than the limit is kept whole (when it fits a line) or dropped.
    assert clip(f"{blob} tail", 100) == ""
    path = "/very/long/" + "d" * 150 + "/file.py"
    assert clip(f"{path} was read", 100) == path


def test_shortened_lines_cut_between_words(model: ExtractiveModel) -> None:
    long_task = "Please " + " ".join(f"requirement{n} applies to module_{n}" for n in range(200))
    source: list[AnyMessage] = [
        UserMessage(content=long_task),
        call("c1", "bash", command="cat " + " ".join(f"dir{n}/file{n}.py" for n in range(80))),
        ToolMessage(
            tool_call_id="c1", content="\n".join(f"line {n} of the output of cat" for n in range(50))
        ),
        UserMessage(content="And then " + " ".join(f"step{n} after step{n - 1}" for n in range(150))),
    ]
    text = summary(model, source, target=150)
    assert "…" in text
    assert cuts(text, vocabulary(source)) == []
    assert all(TAGGED.match(line) for line in lines_of(text))


def test_dev_runs_tagged_whole_and_unique(model: ExtractiveModel) -> None:
    """On real agent runs every block line is tagged, uncut and unique."""
    for run in list(swe_runs())[:4]:
        messages = from_openai(run["messages"])
        for start in range(1, len(messages) - 30, 45):
            source = messages[start : start + 40]
            text = summary(model, source, target=500)
            lines = lines_of(text)
            assert all(TAGGED.match(line) for line in lines), text
            keys = [" ".join(line.split(": ", 1)[1].split()).casefold() for line in lines]
            assert len(keys) == len(set(keys)), text
            assert cuts(text, vocabulary(source)) == [], text
