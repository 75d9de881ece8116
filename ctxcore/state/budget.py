"""A window's budget, checked once: ``BudgetTokens`` and ``check_budget``.

Where a window starts (``ContextService.get_window``) the budget a client sent becomes a
``BudgetTokens``: making one is the check. The window's path hands that value on (an ``int``
to everything that reads it), and a store's write of a budget (``StateStore.set_budget``)
takes it through ``check_budget``, which lets a ``BudgetTokens`` through as it is: the
budget is checked once on the window's path, while a caller handing a store a plain ``int``
still gets the check (``InvalidRequestError``) rather than a bad budget stored beside the
state.
"""

from __future__ import annotations

from typing import Self

from ctxcore.errors import InvalidRequestError

__all__ = ["MAX_BUDGET_TOKENS", "BudgetTokens", "check_budget"]

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
