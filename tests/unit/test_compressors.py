"""The three LLM compressors through the engine, on every test conversation they apply to."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ctxcore import check_window, from_openai
from ctxcore.engine import ContextEngine, ContextEngineConfig
from ctxcore.errors import ConfigError
from ctxcore.eval.probes import WindowText, find_probes, score_probes
from ctxcore.markers import MEMORY_BLOCK_CURRENT, MEMORY_BLOCK_DIALOGUE, ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AnyMessage, SystemMessage, message_text
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from tests.datasets import conversations, swe_runs
from tests.pipeline_helpers import FailingModel

COUNTER = TiktokenCounter()


def split(conv: dict[str, Any]) -> tuple[list[AnyMessage], list[AnyMessage]]:
    msgs = from_openai(conv["messages"])
    return [m for m in msgs if isinstance(m, SystemMessage)], [
        m for m in msgs if not isinstance(m, SystemMessage)
    ]


def sample() -> list[dict[str, Any]]:
    return (
        list(conversations("agent_runs.jsonl"))
        + list(conversations("tau_bench.jsonl", every=3))
        + list(conversations("minisweagent.jsonl"))
        + list(conversations("dialogue_qa.jsonl"))
    )


def ctx_tools(ctx: Any) -> list[dict[str, Any]]:
    """The tools ctxcore adds to every window of ``ctx`` (the reload tool)."""
    return ctx.get_context_window().get_tools()


def assert_sound(out: list[AnyMessage], rest: list[AnyMessage], ctx: Any, cid: str) -> None:
    assert check_window(out) == [], cid
    found = anchors(rest)
    for i in found.indices():
        assert any(m.content == rest[i].content and m.context_message_id == f"{i + 1:012d}" for m in out), (
            cid,
            i,
        )
    assert [m.model_copy(update={"context_message_id": None}) for m in ctx.get_raw_messages()] == rest


def test_round_level_reaches_target_on_every_conversation() -> None:
    for n, conv in enumerate(sample()):
        system, rest = split(conv)
        total = COUNTER.count_messages([*system, *rest])
        floor = COUNTER.count_messages([*system, *[rest[i] for i in anchors(rest).indices()]]) + 500
        target = max(total // 2, floor)
        engine = ContextEngine(ContextEngineConfig(strict_processors=True))
        ctx = engine.create_context(
            f"rl{n}",
            processors=[
                (
                    "RoundLevelCompressor",
                    {
                        "trigger_total_tokens": target,
                        "target_total_tokens": target,
                        "keep_recent_messages": 4,
                        "model_client": ExtractiveModel(),
                    },
                )
            ],
            history_messages=rest,
        )
        window = ctx.get_context_window(system_messages=system)
        out = window.get_messages()
        assert COUNTER.count_messages(out) <= target, conv["id"]
        assert_sound(out, rest, ctx, conv["id"])
        if total > target:
            assert any(message_text(m).startswith(ROUND_LEVEL_MEMORY_BLOCK) for m in out), conv["id"]


@pytest.mark.parametrize(
    ("name", "tag", "applies"),
    [
        (
            "CurrentRoundCompressor",
            MEMORY_BLOCK_CURRENT,
            # Finished work after the latest request big enough that a snapshot pays off.
            lambda rest, a: a.intent is not None and COUNTER.count_messages(rest[a.intent + 1 :]) > 1500,
        ),
        (
            "DialogueCompressor",
            MEMORY_BLOCK_DIALOGUE,
            lambda rest, a: a.task is not None and a.intent is not None and a.intent > a.task + 2,
        ),
    ],
)
def test_snapshot_compressors_when_their_span_is_non_empty(name: str, tag: str, applies: Any) -> None:
    acted = 0
    for n, conv in enumerate(sample()):
        system, rest = split(conv)
        total = COUNTER.count_messages([*system, *rest])
        floor = COUNTER.count_messages([*system, *[rest[i] for i in anchors(rest).indices()]]) + 500
        engine = ContextEngine(
            # Half the conversation, or system + anchors with room: below that the budget
            # guarantee raises BudgetExceeded (tested apart).
            ContextEngineConfig(strict_processors=True, context_window_tokens=max(total // 2, floor))
        )
        ctx = engine.create_context(
            f"s{n}", processors=[(name, {"model_client": ExtractiveModel()})], history_messages=rest
        )
        result = ctx.compress_context()
        out = ctx.get_context_window(system_messages=system).get_messages()
        assert_sound(out, rest, ctx, conv["id"])
        if result == "compressed":
            acted += 1
            view = ctx.get_messages()
            assert any(message_text(m).startswith(tag) for m in view)
            # Served as is when it fits; else the budget guarantee cuts oldest first.
            if (
                COUNTER.count_messages([*system, *view]) + COUNTER.count_tools(ctx_tools(ctx))
                <= ctx.context_max
            ):
                assert any(message_text(m).startswith(tag) for m in out)
            assert COUNTER.count_messages(out) < total
        elif applies(rest, anchors(rest)) and name == "CurrentRoundCompressor":
            # A span of finished work exists: it must have been summarised.
            pytest.fail(f"{name} did nothing on {conv['id']}")
    assert acted > 0


def test_public_config_example_works() -> None:
    engine = ContextEngine(ContextEngineConfig(strict_processors=True))
    ctx = engine.create_context(
        "doc",
        processors=[
            (
                "RoundLevelCompressor",
                {
                    "trigger_total_tokens": 16000,
                    "target_total_tokens": 12000,
                    "keep_recent_messages": 4,
                    "model_client": ExtractiveModel(),
                },
            )
        ],
    )
    assert ctx is not None


@pytest.mark.parametrize(
    "config",
    [
        {"target_total_tokens": 100, "first_pass_target_tokens": 200},
        {"target_total_tokens": 1000, "first_pass_target_tokens": 10, "second_pass_target_tokens": 20},
        {"trigger_total_tokens": 100, "target_total_tokens": 200},
        {"truncate_head_ratio": 1.5},
        {"model_client": "gpt-4o"},
        {"model_client": ["gpt-4o"]},
        {"model_client": 3},
        {"model_client": object()},
        {"model_client": {"base_url": "http://x", "bogus": 1}},
        {"surprise": True},
    ],
)
def test_round_level_config_validation(config: dict[str, Any]) -> None:
    engine = ContextEngine(ContextEngineConfig())
    with pytest.raises(ConfigError, match="RoundLevelCompressor"):
        engine.create_context("bad", processors=[("RoundLevelCompressor", config)])


def test_model_failure_leaves_context_untouched() -> None:
    swe = split(next(conversations("minisweagent.jsonl")))[1]
    # A dialogue span lies between two real user messages: a run with several of them.
    chat = max((split(c)[1] for c in conversations("tau_bench.jsonl")), key=len)
    for name in ("CurrentRoundCompressor", "DialogueCompressor", "RoundLevelCompressor"):
        rest = chat if name == "DialogueCompressor" else swe
        model = FailingModel("authentication")
        cfg: dict[str, Any] = {"model_client": model}
        if name == "RoundLevelCompressor":
            cfg |= {"trigger_total_tokens": 5000, "target_total_tokens": 5000}
        engine = ContextEngine(ContextEngineConfig(context_window_tokens=8000))
        ctx = engine.create_context(f"f-{name}", processors=[(name, cfg)], history_messages=rest)
        before = ctx.get_messages()
        result = ctx.compress_context()
        assert result == "noop", name
        assert ctx.get_messages() == before
        assert ctx.last_failures and "authentication" in str(ctx.last_failures[0].error)
        assert model.calls >= 1


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", text.lower())).strip()


def _qa_texts(conv: dict[str, Any]) -> tuple[str, str, set[str]]:
    """The compressor's window and keep-newest truncation at a quarter of the chat's tokens
    (normalised text each), and the ``msg_id``s truncation kept."""
    system, rest = split(conv)
    budget = COUNTER.count_messages([*system, *rest]) // 4
    engine = ContextEngine(ContextEngineConfig(strict_processors=True))
    ctx = engine.create_context(
        "qa",
        processors=[
            (
                "RoundLevelCompressor",
                # The service's ratios: compaction triggers at 0.9 and targets 0.75 of the budget.
                {
                    "trigger_total_tokens": int(budget * 0.9),
                    "target_total_tokens": int(budget * 0.75),
                    "keep_recent_messages": 4,
                },
            )
        ],
        history_messages=rest,
    )
    window = ctx.get_context_window(system_messages=system).get_messages()
    assert COUNTER.count_messages(window) <= budget, conv["id"]
    kept: list[AnyMessage] = []
    used = COUNTER.count_messages(system)
    for m in reversed(rest):
        used += COUNTER.count_messages([m])
        if used > budget:
            break
        kept.insert(0, m)
    kept_ids = {m.metadata.get("extra", {}).get("msg_id") for m in kept}
    ours = _norm(" ".join(message_text(m) for m in window))
    return ours, _norm(" ".join(message_text(m) for m in [*system, *kept])), kept_ids


def test_quality_floor_on_the_dated_chats() -> None:
    """At a quarter of each chat's tokens, the compressor's window holds the answers of
    questions whose evidence truncation dropped at least twice as often as truncation does
    (measured: 0.57 vs 0.15 over the 4 chats), and another chat's answers (the control, a
    vocabulary dump would score there) no more often than truncation, within 0.05."""
    chats = list(conversations("dialogue_qa.jsonl"))
    hits = {"ours": 0, "theirs": 0, "ours_ctl": 0, "theirs_ctl": 0}
    asked = {"own": 0, "control": 0}
    for n, conv in enumerate(chats):
        ours, theirs, kept_ids = _qa_texts(conv)
        compacted = [
            _norm(str(q["answer"]))
            for q in conv["qa"]
            if q["category"] != "adversarial" and not all(e in kept_ids for e in q["evidence"])
        ]
        control = [
            _norm(str(q["answer"]))
            for q in chats[(n + 1) % len(chats)]["qa"]
            if q["category"] != "adversarial"
        ]
        asked["own"] += len(compacted)
        asked["control"] += len(control)
        hits["ours"] += sum(a in ours for a in compacted)
        hits["theirs"] += sum(a in theirs for a in compacted)
        hits["ours_ctl"] += sum(a in ours for a in control)
        hits["theirs_ctl"] += sum(a in theirs for a in control)
    ours, theirs = hits["ours"] / asked["own"], hits["theirs"] / asked["own"]
    assert ours >= 2 * theirs and ours >= 0.5, (ours, theirs)
    ours_ctl, theirs_ctl = hits["ours_ctl"] / asked["control"], hits["theirs_ctl"] / asked["control"]
    assert ours_ctl <= theirs_ctl + 0.05, (ours_ctl, theirs_ctl)


def test_swe_runs_at_16k_keep_task_and_last_exception() -> None:
    scores = []
    for n, conv in enumerate(swe_runs()):
        system, rest = split(conv)
        engine = ContextEngine(ContextEngineConfig(strict_processors=True))
        ctx = engine.create_context(
            f"swe{n}",
            processors=[
                (
                    "RoundLevelCompressor",
                    {"trigger_total_tokens": 16000, "target_total_tokens": 12000, "keep_recent_messages": 4},
                )
            ],
            history_messages=rest,
        )
        out = ctx.get_context_window(system_messages=system).get_messages()
        text = "\n".join(message_text(m) for m in out)
        task = rest[anchors(rest).task or 0]
        assert message_text(task) in text, conv["id"]
        probes = find_probes(rest)
        if probes.last_exception is not None:
            scores.append(score_probes(WindowText(out), probes)["last_exception"])
    # The eval's probe, computed from the raw run; the summariser keeps errors through its
    # own detector only. Measured: every run after the force-keep went, 11 of 12 with compaction
    # summarising only what it must (issue 12); at most one miss.
    assert len(scores) >= 10
    assert sum(scores) >= len(scores) - 1, scores
