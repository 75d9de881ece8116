"""What an agent's summary keeps through merge after merge: its first and newest failures,
the files it wrote, and no quoted code fragments."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.pipeline.view import block_message
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.extractive.features import is_error, scan
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.tokens import TiktokenCounter


@pytest.fixture(scope="module")
def model() -> ExtractiveModel:
    return ExtractiveModel(TiktokenCounter())


def bash(cid: str, command: str, output: str) -> list[AnyMessage]:
    call = ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))
    return [
        AssistantMessage(content=f"THOUGHT: running step {cid}.", tool_calls=[call]),
        ToolMessage(tool_call_id=cid, name="bash", content=output),
    ]


def summary(model: ExtractiveModel, source: Sequence[AnyMessage], target: int) -> str:
    contract = OutputContract(
        kind="blocks",
        sections=list(BLOCK_SECTIONS),
        blocks=[ContractBlock(block_id="b", target_tokens=target, source=list(source))],
    )
    text = model.complete([], max_tokens=target * 2 + 400, contract=contract).text
    return str(json.loads(text)["blocks"][0]["summary"])


def block(text: str, n: int) -> UserMessage:
    ids = f"{n:012d}"
    return block_message(
        text, block_id=f"L1-{ids}", first_id=ids, last_id=ids, level=1, scope="completed_react"
    )


def filler(prefix: str, count: int) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(count):
        out += bash(
            f"{prefix}{i}",
            f"grep -rn 'helper_{prefix}_{i}' src/module_{i}.py",
            f"src/module_{i}.py:{i}: def helper_{prefix}_{i}(value): return compute_{i}(value) + {i}",
        )
    return out


def first_half() -> list[AnyMessage]:
    return [
        *bash(
            "r1",
            "python reproduce.py",
            'Traceback (most recent call last):\n  File "/testbed/reproduce.py", line 3, in <module>\n'
            "    parse('2024-02-29')\nValueError: day is out of range for month",
        ),
        *bash("w1", "cat <<'EOF' > reproduce.py\nprint(parse('2024-02-29'))\nEOF", ""),
        *bash("w2", "sed -i 's/strptime/fromisoformat/' src/dates/parse.py", ""),
        *filler("a", 25),
    ]


def second_half() -> list[AnyMessage]:
    return [
        *filler("b", 25),
        *bash(
            "t1",
            "python -m pytest tests/test_parse.py -q",
            "FAILED tests/test_parse.py::test_leap - AssertionError: 28 != 29\n1 failed, 4 passed",
        ),
    ]


def test_first_and_newest_failures_survive_a_tight_merge(model: ExtractiveModel) -> None:
    one = summary(model, first_half(), 500)
    two = summary(model, second_half(), 500)
    merged = summary(model, [block(one, 1), block(two, 2)], 300)
    assert "ValueError: day is out of range for month" in merged
    assert "AssertionError: 28 != 29" in merged
    assert "reproduce.py" in merged and "src/dates/parse.py" in merged
    # A merge of that merge with 25 newer steps may let the first failure go: the rule that
    # kept it whatever competed did not pay on the development halves (bench/README, issue 33).


def test_an_assistant_talking_about_an_old_error_does_not_displace_the_newest(model: ExtractiveModel) -> None:
    one = summary(model, second_half(), 500)
    talk = [AssistantMessage(content="THOUGHT: Again, `ValueError: day is out of range` from before.")]
    merged = summary(model, [block(one, 1), *talk, *filler("d", 20)], 120)
    assert "AssertionError: 28 != 29" in merged


def test_an_assistant_sentence_after_quoted_code_is_kept(model: ExtractiveModel) -> None:
    # Fenced code is no longer left out of assistant text: that rule did not pay on both
    # development halves (bench/README, issue 33).
    quoted = AssistantMessage(
        content="THOUGHT: The signature is\n```python\n    def sel(self, indexers=None,\n"
        "            tolerance=None,\n            drop: bool = False,\n```\nso `method` clashes with a dimension name."
    )
    text = summary(model, [quoted, *bash("x", "ls", "a.py")], 300)
    assert "so `method` clashes with a dimension name." in text


def test_error_detection_ignores_parameters_and_traceback_headers() -> None:
    assert not is_error("def import_object(self, raiseerror: bool = False) -> bool:")
    assert is_error("error: cannot open file")
    assert is_error("ValueError: bad")
    lines = [
        line for line, _ in scan("Traceback (most recent call last):\n  File 'x.py', line 1\nKeyError: 'k'")
    ]
    assert lines[0].startswith("File") and "Traceback" not in " ".join(lines)


def test_a_long_call_is_never_cut_inside_its_command(model: ExtractiveModel) -> None:
    # The newest call is no longer kept whatever competes (it did not pay on both
    # development halves, bench/README issue 33c); a long one still competes whole.
    long = "python -c '" + " ".join(f"step_{i}()" for i in range(80)) + "'"
    text = summary(model, [*filler("h", 30), *bash("y", long, "ok")], 120)
    assert "step_79()" in text or "step_0()" not in text
