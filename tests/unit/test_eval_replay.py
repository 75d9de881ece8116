"""The evaluation harness: scoring definitions, replay points and the policies' windows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctxcore.errors import ConfigError
from ctxcore.eval import EvalConfig
from ctxcore.eval.data import QAItem, conversation, groups, window_points
from ctxcore.eval.policies import POLICIES, make_policy
from ctxcore.eval.scoring import (
    anchors_verbatim,
    compacted_questions,
    content_words,
    evidence_texts,
    normalise,
    score_qa,
)
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    UserMessage,
    from_openai,
)
from ctxcore.turns import DEFAULT_DETECTOR
from tests.unit.eval_records import (
    COUNTER,
    chat_record,
    replay,
    setup_for,
    tool_record,
)
from workers.cli import EVAL_POLICIES

# --- scoring ---------------------------------------------------------------------------------


def test_normalisation_and_content_words() -> None:
    assert normalise("The Sunday-before, 25 May 2023!") == "the sunday before 25 may 2023"
    assert content_words("The week before 9 June") == {"week", "before", "9", "june"}
    # An answer made only of function words still has words to look for.
    assert content_words("It is") == {"it", "is"}


def test_qa_hits_recall_and_compacted_questions() -> None:
    history = from_openai(chat_record(12)["messages"])[1:]
    evidence = evidence_texts(history)
    questions = [
        QAItem(q["question"], q["answer"], tuple(q["evidence"]), q["category"]) for q in chat_record()["qa"]
    ]
    # Full history: every answerable question hits, none is compacted; the adversarial one is skipped.
    assert compacted_questions(history, questions, evidence) == frozenset()
    full = score_qa(history, questions[:2]).rates()
    assert full["questions"] == 2 and full["substring_hit_rate"] == 1.0 and full["answer_recall"] == 1.0
    assert full["compacted_questions"] == 0
    assert score_qa(history, questions).questions == 3
    # The evidence summarised away: compacted; a summary that keeps the words still recalls them.
    summary = [UserMessage(content="[memory] Lena lives in Lisbon now; a beagle."), *history[2:]]
    fixed = compacted_questions(summary, questions, evidence)
    assert fixed == {0}
    rates = score_qa(summary, questions[:2], fixed).rates()
    assert rates["compacted_questions"] == 1
    assert rates["compacted_substring_hit_rate"] == 1.0
    # The fixed set, not the window scored, decides what counts as compacted.
    assert score_qa(history, questions[:2], fixed).rates()["compacted_questions"] == 1
    # "2 hours 5 minutes" with only "2 hours" left: half its words, no hit.
    window = [UserMessage(content="it took 2 hours")]
    tally = score_qa(window, [questions[2]], compacted_questions(window, [questions[2]], evidence))
    assert tally.hits == 0 and tally.recall == pytest.approx(0.5)
    assert tally.compacted == 1


def test_substring_needs_word_boundaries() -> None:
    window = [UserMessage(content="we went to a party")]
    assert score_qa(window, [QAItem("q", "art")]).hits == 0
    assert score_qa(window, [QAItem("q", "a party")]).hits == 1


def test_anchors_verbatim() -> None:
    history: list[AnyMessage] = [
        UserMessage(content="task"),
        AssistantMessage(content="ok"),
        UserMessage(content="now this"),
    ]
    assert anchors_verbatim(history, history, DEFAULT_DETECTOR)
    assert not anchors_verbatim(history[1:], history, DEFAULT_DETECTOR)
    edited = [UserMessage(content="task (shortened)"), *history[1:]]
    assert not anchors_verbatim(edited, history, DEFAULT_DETECTOR)


# --- replay ----------------------------------------------------------------------------------


def test_groups_and_window_points() -> None:
    run = from_openai(tool_record(25)["messages"])[1:]
    units = groups(run)
    assert all(len(u) == 2 for u in units[1:-1])  # an assistant step and its result
    points = window_points(units, step_stride=10)
    assert points[0] == 0 and points[-1] == len(units) - 1
    assert len(points) == 2 + (len(units) - 2) // 10
    assert window_points(units) == list(range(len(units)))
    chat = from_openai(chat_record(5)["messages"])[1:]
    assert window_points(groups(chat), step_stride=10) == [0, 2, 4, 6, 8, 9]


def test_meta_is_never_read() -> None:
    class Guarded(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            assert key != "meta", "the harness read meta"
            return super().__getitem__(key)

        def get(self, key: str, default: Any = None) -> Any:
            assert key != "meta", "the harness read meta"
            return super().get(key, default)

    conv = conversation(Guarded(chat_record(3)))
    assert conv.id == "chat-1" and len(conv.system) == 1 and len(conv.qa) == 4


def test_truncate_reports_its_own_violations_and_lost_anchors() -> None:
    setup, messages = setup_for(tool_record(30), 1500)
    policy = make_policy("truncate", setup)
    for unit in groups(messages):
        policy.append(unit)
        window = policy.window().messages
        assert COUNTER.count_messages(window) <= 1500
    # Keeping the newest messages drops the task and can start on an orphan tool result.
    assert not anchors_verbatim(window, messages, DEFAULT_DETECTOR)
    result = replay(tool_record(30), ["truncate"], 1500)["truncate"]
    assert result.violations > 0 and result.anchor_windows < result.windows
    assert result.anchor_rate is not None and result.anchor_rate < 1


@pytest.mark.parametrize("record", [chat_record(40), tool_record(30)], ids=["chat", "tool-run"])
def test_full_serves_valid_windows_within_budget(record: dict[str, Any]) -> None:
    budget = 900 if "qa" in record else 2500
    result = replay(record, ["full"], budget)["full"]
    assert result.windows > 10
    assert result.violations == 0 and result.failed == 0 and result.stage_failures == 0
    assert result.anchor_windows == result.windows and result.budget_exceeded == 0
    assert result.over_budget_windows == 0 and result.peak_tokens <= budget
    # It compacted through the coordinator, and the summariser calls were counted.
    assert result.stages.get("l0_to_l1", 0) >= 1
    assert result.summariser_calls >= 1 and result.summariser_input_tokens > 0
    assert result.compression_ratio > 1.5


def test_full_keeps_more_of_the_old_facts_than_truncation() -> None:
    results = replay(chat_record(60), ["truncate", "full"], 900)
    scores = {name: r.qa.rates() for name, r in results.items() if r.qa is not None}
    # One fixed compacted set (full's), the same questions for both policies.
    assert scores["truncate"]["compacted_questions"] == scores["full"]["compacted_questions"] >= 2
    assert scores["full"]["compacted_answer_recall"] > scores["truncate"]["compacted_answer_recall"]


def test_asking_the_recall_tool_scores_the_fixed_set_on_the_window_plus_its_answer() -> None:
    # 700 tokens: at 900 the extractive summaries (without line features since issue 33)
    # keep every compacted answer of this record, and asking has nothing left to find.
    results = replay(chat_record(60), ["full", "full+recall"], 700)
    plain, recalling = results["full"], results["full+recall"]
    assert plain.qa_tool is None  # no tool, nothing asked
    assert recalling.qa is not None and recalling.qa_tool is not None
    window, asked = recalling.qa.rates(), recalling.qa_tool.rates()
    # The same fixed set; asking only adds text, so it can only find more.
    assert asked["compacted_questions"] == window["compacted_questions"] >= 2
    assert asked["compacted_answer_recall"] >= window["compacted_answer_recall"]
    assert asked["compacted_substring_hit_rate"] >= window["compacted_substring_hit_rate"]
    # The archive holds the old facts the window summarised: asking finds some of them.
    assert asked["compacted_answer_recall"] > window["compacted_answer_recall"]


def test_the_compacted_set_comes_from_full_even_when_it_is_not_listed() -> None:
    only = replay(chat_record(60), ["truncate"], 900)
    assert list(only) == ["truncate"]
    both = replay(chat_record(60), ["truncate", "full"], 900)
    assert only["truncate"].qa is not None and both["truncate"].qa is not None
    assert only["truncate"].qa.rates() == both["truncate"].qa.rates()


@pytest.mark.parametrize("policy", ["rules", "current_round", "dialogue", "round_level", "steps", "mask"])
def test_every_policy_replays_without_violations(policy: str) -> None:
    result = replay(tool_record(20), [policy], 3000)[policy]
    assert result.violations == 0
    assert result.anchor_windows == result.windows
    assert result.failures == [] and result.failed == 0


def test_policy_names_are_the_public_ones(tmp_path: Path) -> None:
    assert sorted(POLICIES) == sorted(
        [
            "truncate",
            "steps",
            "mask",
            "lossless",
            "rules",
            "current_round",
            "dialogue",
            "round_level",
            "full",
            "full+recall",
        ]
    )
    assert sorted(POLICIES) == sorted(EVAL_POLICIES)  # the CLI's choices, kept without the import
    setup, _ = setup_for(chat_record(1), 500)
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("nope", setup)
    with pytest.raises(ConfigError):
        EvalConfig(policies=["full"])
    with pytest.raises(ConfigError):
        EvalConfig(policies=["full"], budget=100, budget_ratio=0.5)
    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        EvalConfig(policies=["full", "nope"], budget=100)
    with pytest.raises(ConfigError, match="more than once: full"):
        EvalConfig(policies=["full", "mask", "full"], budget=100)
    with pytest.raises(ConfigError, match="reference row"):
        EvalConfig(policies=["full"], baseline="lossless", budget=100)
    with pytest.raises(ConfigError, match="does not exist"):
        EvalConfig(policies=["full"], budget=100, windows_out=tmp_path / "missing" / "w.jsonl")
    with pytest.raises(ConfigError, match="is a directory"):
        EvalConfig(policies=["full"], budget=100, windows_out=tmp_path)
    config = EvalConfig(policies=["full", "mask"], budget=100)
    assert config.run_policies == ["full", "mask", "steps"]
    assert EvalConfig(policies=["steps", "full"], budget=100).run_policies == ["steps", "full"]
    assert EvalConfig(policies=["full"], baseline=None, budget=100).run_policies == ["full"]
