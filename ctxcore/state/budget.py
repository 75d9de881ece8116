"""A window's budget, checked once: ``BudgetTokens`` and ``check_budget``.

Where a window starts (``ContextService.get_window``) the budget a client sent becomes a
``BudgetTokens``: making one is the check. The window's path hands that value on (an ``int``
to everything that reads it), and a store's write of a budget (``StateStore.set_budget``)
takes it through ``check_budget``, which lets a ``BudgetTokens`` through as it is: the
budget is checked once on the window's path, while a caller handing a store a plain ``int``
still gets the check (``InvalidRequestError``) rather than a bad budget stored beside the
state. What is stored is the conversation's budget (``conversation_budget``): the room the
window left its messages, the budget less the system messages and tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from ctxcore.errors import BudgetExceeded, InvalidRequestError
from ctxcore.messages import AnyMessage
from ctxcore.tokens import TokenCounter

__all__ = [
    "MAX_BUDGET_TOKENS",
    "BudgetTokens",
    "check_budget",
    "conversation_budget",
    "result_cap_tokens",
    "trigger_tokens",
]

MAX_BUDGET_TOKENS = 1_000_000_000
"""The largest budget: it is stored beside the state (a BIGINT column on SQL backends), and
no model has a billion-token window."""


class BudgetTokens(int):
    """A whole number of tokens in 1..``MAX_BUDGET_TOKENS``: ``InvalidRequestError`` naming the
    field ``budget_tokens`` for anything else (``True`` included)."""

    __slots__ = ()

    def __new__(cls, budget_tokens: int) -> Self:
        if type(budget_tokens) not in (int, BudgetTokens) or not 0 < budget_tokens <= MAX_BUDGET_TOKENS:
            raise InvalidRequestError(
                "budget_tokens",
                f"must be a positive number of tokens up to {MAX_BUDGET_TOKENS:,}, got {budget_tokens!r}",
            )
        return super().__new__(cls, budget_tokens)


def check_budget(budget_tokens: int) -> BudgetTokens:
    """``budget_tokens`` as a ``BudgetTokens``: itself when it is one (checked when it was
    made), else checked now."""
    return budget_tokens if type(budget_tokens) is BudgetTokens else BudgetTokens(budget_tokens)


def conversation_budget(
    budget_tokens: int,
    system_messages: Sequence[AnyMessage],
    tools: Sequence[Mapping[str, Any]],
    counter: TokenCounter,
) -> BudgetTokens:
    """The budget a conversation's compactions work to: what a window of ``budget_tokens``
    leaves the conversation's messages once its system messages and tool definitions are
    counted; ``BudgetExceeded`` when they alone fill the budget.

    Workers compact a view that holds neither (they never see a request's system messages or
    tools), so the budget recorded for them is this room: with the request's whole budget a
    5,000-token system prompt at 16k let every compaction land at 0.8 of 16k of messages, a
    window over its budget each time (block text cut to fit, a compaction asked for on every
    window: 228 summariser calls against 94 on half A of the development runs,
    ``bench/README.md``, "System prompts and tools").
    """
    budget_tokens = check_budget(budget_tokens)
    system_tokens = counter.count_messages(list(system_messages)) if system_messages else 0
    tools_tokens = counter.count_tools(list(tools)) if tools else 0
    if system_tokens + tools_tokens >= budget_tokens:
        raise BudgetExceeded(budget_tokens, system_tokens, tools_tokens, 0)
    return BudgetTokens(budget_tokens - system_tokens - tools_tokens)


def trigger_tokens(budget_tokens: int, room: int, trigger_ratio: float) -> int:
    """The window size over which a compaction is due: the workers' view (the messages) over
    ``trigger_ratio`` of the ``room`` (``conversation_budget``), with the system messages and
    tools on top."""
    return budget_tokens - room + int(room * trigger_ratio)


def result_cap_tokens(room: int, max_result_ratio: float | None) -> int | None:
    """The most one tool result counts in a conversation's view: ``max_result_ratio`` of the
    ``room`` (the default chain's cap; None: no cap, results count whole). Compaction plans
    with it and the window's trigger compares with it, so both count a view the same way."""
    return max(int(room * max_result_ratio), 1) if max_result_ratio is not None else None
