"""``workers.holds``: which windows re-arm a held conversation, and what a job's end leaves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.pipeline.sizing import ViewSizes
from ctxcore.status import Hold
from ctxcore.tokens import TiktokenCounter
from workers.holds import hold_after_job, rearmed

AT = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
COUNTER = TiktokenCounter()


def hold(reason: str = "no_progress", **kw: object) -> Hold:
    fields: dict[str, object] = {"why": "w", "budget_tokens": 1000, "last_id": "000000000010"}
    fields.update(kw)
    return Hold(reason, at=AT, **fields)  # type: ignore[arg-type]


def msg(cls: type, log_id: str, words: int) -> AnyMessage:
    message: AnyMessage = cls(content="word " * words)
    return message.model_copy(update={"context_message_id": log_id})


def check(h: Hold, tail: list[AnyMessage], *, budget: int = 1000, after: float = 1.0, **kw: object) -> bool:
    args: dict[str, object] = {"elided": [], "cap_tokens": None}
    args.update(kw)
    return rearmed(
        h,
        budget_tokens=budget,
        tail=tail,
        counter=COUNTER,
        backoff_seconds=600,
        now=AT + timedelta(seconds=after),
        **args,  # type: ignore[arg-type]
    )


def test_no_progress_needs_a_step_and_five_percent_of_the_budget() -> None:
    old = [msg(UserMessage, "000000000009", 400), msg(AssistantMessage, "000000000010", 400)]
    assert not check(hold(), old)
    assert not check(hold(), [*old, msg(UserMessage, "000000000011", 200)])  # no step
    assert not check(hold(), [*old, msg(AssistantMessage, "000000000011", 10)])  # a step, < 5%
    assert check(
        hold(), [*old, msg(UserMessage, "000000000011", 30), msg(AssistantMessage, "000000000012", 30)]
    )


def test_a_new_budget_the_backoff_or_an_unread_newer_range_re_arm_it() -> None:
    assert check(hold(), [], budget=1200)
    assert check(hold("newest_step"), [], budget=900)
    # A system prompt carrying the time moves the conversation's budget by a few tokens per
    # window: no new budget, no new job.
    assert not check(hold(), [], budget=1003)
    assert not check(hold("newest_step"), [], budget=996)
    assert check(hold(), [], after=600)
    assert not check(hold(), [], after=599)
    assert check(hold(), [], elided=[("000000000011", "000000000400")])
    assert not check(hold(), [], elided=[("000000000001", "000000000005")])


def test_newest_step_re_arms_on_any_new_step() -> None:
    assert check(hold("newest_step"), [msg(AssistantMessage, "000000000011", 1)])
    assert not check(hold("newest_step"), [msg(UserMessage, "000000000011", 100)])


def test_budget_exhausted_waits_for_the_next_utc_day_or_a_raised_cap_only() -> None:
    spent = hold("budget_exhausted", cap_tokens=5000, day="2026-12-02")
    assert not check(
        spent, [msg(AssistantMessage, "000000000099", 500)], budget=9000, cap_tokens=5000, after=4000
    )
    assert check(spent, [], cap_tokens=6000)
    assert check(spent, [], cap_tokens=None)
    assert check(spent, [], cap_tokens=5000, after=14 * 3600)  # 2026-12-03 UTC


def test_a_job_ending_within_target_leaves_no_hold_and_the_newest_step_is_told_apart() -> None:
    within = ViewSizes(view_tokens=700, target_tokens=800, budget_tokens=1000, held_tokens=100, last_id="9")
    assert hold_after_job(within, ran=["l0_to_l1"]) is None
    newest = ViewSizes(view_tokens=1500, target_tokens=800, budget_tokens=1000, held_tokens=900, last_id="9")
    got = hold_after_job(newest, ran=["l0_to_l1"])
    assert got is not None and got.reason == "newest_step" and not got.pauses
    futile = ViewSizes(view_tokens=1500, target_tokens=800, budget_tokens=1000, held_tokens=300, last_id="9")
    got = hold_after_job(futile, ran=[])
    assert got is not None and got.reason == "no_progress" and got.pauses
    assert "no stage had anything to summarise" in got.why and got.held_tokens == 300
