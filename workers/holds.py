"""Holds: when a conversation's compaction cannot progress, windows stop starting jobs.

A job that ends over its target without having saved anything is *futile*: running it again
on the same view spends the same summariser calls for the same nothing. ``hold_after_job``
turns the end of such a job into a ``Hold`` kept in the conversation's compaction hash
(``workers.failures``), read with every window; ``rearmed`` says when a window may start a
job again:

- ``no_progress`` (status ``paused``): the log grew by at least one step and 5% of the
  budget since the hold, or the conversation's budget changed by more than 5%, or
  ``worker.no_progress_backoff_seconds`` passed;
- ``newest_step`` (status ``idle``): the newest step and the anchors, which no stage
  summarises, are over the target by themselves; a new step (which makes the old newest one
  summarisable) or a budget change of more than 5% re-arms it, as does the backoff;
- ``budget_exhausted`` (status ``paused``): the tenant's summariser tokens of the UTC day are
  spent; the next UTC day or a raised cap re-arms it (the stage checks again anyway).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from ctxcore.errors import ErrorKind
from ctxcore.messages import AnyMessage, AssistantMessage
from ctxcore.pipeline.sizing import ViewSizes
from ctxcore.status import CompactionStatus, Hold
from ctxcore.tokens import TokenCounter
from workers import spend
from workers.failures import FailureRecord
from workers.spend import SummariserBudgetExhausted

__all__ = ["GROWTH_SHARE", "budget_hold", "hold_after_job", "hold_at_job_end", "rearmed", "status_of"]

GROWTH_SHARE = 0.05
"""The share of the budget the log must grow by (besides a step) to re-arm ``no_progress``."""


def hold_after_job(
    sizes: ViewSizes, *, ran: Sequence[str], detail: str = "", now: datetime | None = None
) -> Hold | None:
    """The hold a job that saved nothing leaves (None when the view is within its target).

    ``ran`` are the stage kinds that ran and saved nothing (empty: planning found none).
    """
    if not sizes.over_target:
        return None
    at = now or spend.utc_now()
    common = {
        "at": at,
        "view_tokens": sizes.view_tokens,
        "target_tokens": sizes.target_tokens,
        "budget_tokens": sizes.budget_tokens,
        "held_tokens": sizes.held_tokens,
        "last_id": sizes.last_id,
    }
    if sizes.held_by_newest_step:
        why = (
            f"the view ({sizes.view_tokens} tokens) is over its target ({sizes.target_tokens}) by what "
            f"is never summarised: the newest step and the anchors ({sizes.held_tokens} tokens)"
        )
        return Hold("newest_step", why=why, **common)  # type: ignore[arg-type]
    if ran:
        why = f"stages {', '.join(ran)} ran and saved nothing" + (f" (last: {detail})" if detail else "")
    else:
        why = "no stage had anything to summarise"
    why += (
        f"; the view ({sizes.view_tokens} tokens) stays over its target ({sizes.target_tokens}), of "
        f"which {sizes.held_tokens} are the newest step and the anchors"
    )
    return Hold("no_progress", why=why, **common)  # type: ignore[arg-type]


def budget_hold(sizes: ViewSizes, refused: SummariserBudgetExhausted) -> Hold:
    """The hold of a stage refused by the tenant's summariser cap (status ``paused``)."""
    return Hold(
        "budget_exhausted",
        at=spend.utc_now(),
        why=str(refused),
        view_tokens=sizes.view_tokens,
        target_tokens=sizes.target_tokens,
        budget_tokens=sizes.budget_tokens,
        held_tokens=sizes.held_tokens,
        last_id=sizes.last_id,
        used_tokens=refused.used,
        cap_tokens=refused.cap,
        needed_tokens=refused.needed,
        day=refused.day,
    )


def hold_at_job_end(
    record: FailureRecord, sizes: Callable[[], ViewSizes], *, ran: Sequence[str], detail: str, planned: bool
) -> Hold | None:
    """The hold a finishing job leaves: the one a stage of it recorded (the tenant's cap),
    else, when planning ended a job (``planned``) that saved nothing and failed at most with
    rejected results, ``hold_after_job`` on the view's ``sizes()``."""
    if record.run_held:
        return record.hold
    error = record.detail.last_error
    only_rejected = not record.run_failed or (error is not None and error.kind == ErrorKind.INVALID_SUMMARY)
    if planned and not record.run_saved and only_rejected:
        return hold_after_job(sizes(), ran=ran, detail=detail)
    return None


def rearmed(
    hold: Hold,
    *,
    budget_tokens: int,
    tail: Sequence[AnyMessage],
    elided: Sequence[tuple[str, str]],
    counter: TokenCounter,
    backoff_seconds: float,
    cap_tokens: int | None,
    now: datetime | None = None,
) -> bool:
    """True when a window may start a job despite ``hold`` (see the module docstring).

    ``tail`` is the raw tail the window read (log order), ``elided`` the ranges it left
    unread (the newest messages are always read), ``cap_tokens`` the tenant's summariser cap
    now (None: no cap).
    """
    if hold.reason == "budget_exhausted":
        return _lapsed(hold, backoff_seconds, cap_tokens, now)
    # The conversation's budget is the window's less its system messages and tools, so a
    # system prompt that carries the time moves it by a few tokens from window to window: only
    # a change of more than GROWTH_SHARE of it is a new budget (else every window would start
    # the futile job again).
    moved = abs(budget_tokens - hold.budget_tokens) > GROWTH_SHARE * hold.budget_tokens
    if moved or _lapsed(hold, backoff_seconds, cap_tokens, now):
        return True
    last = hold.last_id or ""
    if any(hi > last for _, hi in elided):
        return True  # more grew than a window reads: surely a step and 5% of the budget
    new = [
        m
        for m in tail
        if m.context_message_id
        and m.context_message_id > last
        and not m.context_message_id.endswith("~elided")
    ]
    if not any(isinstance(m, AssistantMessage) for m in new):
        return False
    if hold.reason == "newest_step":
        return True
    return counter.count_messages(new) >= GROWTH_SHARE * hold.budget_tokens


def _lapsed(hold: Hold, backoff_seconds: float, cap_tokens: int | None, now: datetime | None) -> bool:
    """The hold re-armed by time or settings alone: the next UTC day or a raised cap
    (``budget_exhausted``), else the backoff."""
    at = now or spend.utc_now()
    if hold.reason == "budget_exhausted":
        raised = cap_tokens is None or cap_tokens > (hold.cap_tokens or 0)
        return spend.utc_day(at) != hold.day or raised
    return at - hold.at >= timedelta(seconds=backoff_seconds)


def status_of(
    record: FailureRecord, *, backoff_seconds: float, cap_tokens: int | None, now: datetime | None = None
) -> CompactionStatus:
    """The status a reader without a window shows (``GET .../state``, ``ctxcore inspect``):
    ``paused`` while a pausing hold has not lapsed (a window may still re-arm it earlier, by
    the log's growth or a new budget), else ``failing`` or the scheduler's status."""
    hold = record.hold
    if hold is not None and hold.pauses and not _lapsed(hold, backoff_seconds, cap_tokens, now):
        return "paused"
    return "failing" if record.failing else record.scheduler_status
