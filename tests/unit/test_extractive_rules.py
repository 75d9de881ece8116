"""Every rule of the extractive summariser can be switched off for an ablation, and the
product's default is every rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.extractive.rules import ALL_RULES, Rules, names, without
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.tokens import TiktokenCounter

SED = "sed -i '1261s/old_name/new_name/;1722s/a_b/c_d/;3342s/x1/y1/;700d;708d' django/db/models/base.py"


def bash(cid: str, command: str) -> AssistantMessage:
    return AssistantMessage(
        content="", tool_calls=[ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))]
    )


def out(cid: str, text: str) -> ToolMessage:
    return ToolMessage(tool_call_id=cid, name="bash", content=text)


SOURCE: list[AnyMessage] = [
    UserMessage(content="Fix the failing lookup in the models."),
    bash("c1", "python -m pytest tests/test_models.py"),
    out("c1", "E   KeyError: 'related_name'\nFAILED tests/test_models.py::test_lookup"),
    bash("c2", "nl -ba django/db/models/fields.py | sed -n 100,140p"),
    out("c2", "   120  def get_foreign_related_value(self, instance):"),
    bash("c3", SED),
    out("c3", ""),
    bash("c4", "python -m pytest tests/test_models.py"),
    out("c4", "E   ValueError: bad value in django/db/models/base.py line 1722\nFAILED (errors=1)"),
]


def summary(rules: Rules, target: int = 400) -> str:
    contract = OutputContract(
        kind="blocks",
        blocks=[ContractBlock(block_id="b1", target_tokens=target, source=SOURCE)],
        sections=list(BLOCK_SECTIONS),
    )
    model = ExtractiveModel(TiktokenCounter(), rules=rules)
    text = model.complete([UserMessage(content="x")], max_tokens=target * 2, contract=contract).text
    return str(json.loads(text)["blocks"][0]["summary"])


@pytest.fixture(scope="module")
def every_rule() -> str:
    return summary(ALL_RULES)


def test_the_default_is_every_rule() -> None:
    assert ExtractiveModel(TiktokenCounter()).rules == ALL_RULES
    assert all(getattr(ALL_RULES, name) for name in names())
    assert without() == ALL_RULES


def test_an_unknown_rule_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="category_priors"):
        without("no_such_rule")


def test_the_rules_that_did_not_pay_are_gone(every_rule: str) -> None:
    # Measured and removed (bench/README, issue 33).
    assert "files looked at:" not in every_rule and "files written:" not in every_rule
    gone = ("first_failure", "newest_failure", "files_written", "files_looked_at", "line_features")
    later = ("newest_call", "diminishing", "recency")  # issue 33c
    for name in (*gone, "known_discount", "file_share", "output_facts", "code_dropped", *later):
        assert name not in names()


def test_a_command_is_cut_at_a_line_without_the_commands_whole_rule() -> None:
    long = "sed -i '" + ";".join(f"{n}s/a{n}/b{n}/" for n in range(100, 160)) + "' django/db/models/base.py"
    source: list[AnyMessage] = [UserMessage(content="Rename."), bash("c1", long), out("c1", "")]
    contract = OutputContract(
        kind="blocks",
        blocks=[ContractBlock(block_id="b1", target_tokens=900, source=source)],
        sections=list(BLOCK_SECTIONS),
    )
    for rules, whole in ((ALL_RULES, True), (without("commands_whole"), False)):
        model = ExtractiveModel(TiktokenCounter(), rules=rules)
        text = json.loads(model.complete([], max_tokens=1800, contract=contract).text)["blocks"][0]["summary"]
        assert ("159s/a159/b159/" in text) is whole


@pytest.mark.parametrize("name", names())
def test_each_rule_switched_off_still_summarises_within_the_target(name: str) -> None:
    text = summary(without(name), target=120)
    assert text.startswith("## ")
    assert TiktokenCounter().count_text(text) <= 120


def test_a_line_is_worth_the_same_under_every_hash_seed() -> None:
    """A line's words are a set, iterated in the string hash's order: its worth is summed
    exactly, so which line wins a tie does not change from one process to the next."""
    script = (
        "from ctxcore.summarize.extractive.items import Item\n"
        "from ctxcore.summarize.extractive.select import Budgeter, Selection\n"
        "from ctxcore.tokens import EstimateCounter\n"
        "idf = {'alpha': 1e16, 'beta': 1.0, 'gamma': -1e16, 'delta': 1.0}\n"
        "item = Item((0, 0), 'chat', 'alpha beta gamma delta', 0.0, 'k', words=frozenset(idf))\n"
        "print(repr(Selection(idf, frozenset(), Budgeter(EstimateCounter())).value(item)))\n"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in range(8)
    }
    assert seen == {"2.0"}
