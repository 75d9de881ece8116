"""``WindowLimit``: attach only the newest whole turns to a window.

A view processor: it shapes each served window and never changes the stored view. Turns
are kept or left out whole (so no tool call loses its result), the current turn is always
attached, and a left-out task anchor is put back at the head of the window. What is left
out is reported as log-id ranges and stays in the view and the log.

With ``act_only_over_budget`` (set by the default chain; the count limits are refused beside
it) the oldest answered turns are left out, one at a time, only while the messages are over
``RuleEnv.tail_budget_tokens``; the current turn, the turn the newest step closes, a turn
without its answer and failed or cancelled turns stay (as for ``CompactCompletedToolTurns``),
and so do the anchors. In a chat whose user speaks every few steps (tau-bench) the current
request's lookups are what the agent acts on; without this rule a lagging worker's windows
kept every older request and its answer and previewed or cleared those lookups instead.
"""

from __future__ import annotations

from pydantic import PositiveInt, model_validator

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage
from ctxcore.processors.base import HeadroomConfig
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import HeadroomBudget, Rewrite, RuleEnv, RuleResult, anchor_indices, rounds
from ctxcore.turns import Turn, settled_older_turns

__all__ = ["WindowLimit", "WindowLimitConfig", "apply", "triggers"]


class WindowLimitConfig(HeadroomConfig):
    """Limits of ``WindowLimit`` (None: no limit).

    Attributes:
        max_attached_turns: at most this many newest turns.
        max_attached_messages: whole newest turns while their messages fit this count.
        act_only_over_budget: headroom-aware mode (see the module docstring).
    """

    max_attached_turns: PositiveInt | None = None
    max_attached_messages: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_mode(self) -> WindowLimitConfig:
        if self.act_only_over_budget and (
            self.max_attached_turns is not None or self.max_attached_messages is not None
        ):
            raise ConfigError(
                "WindowLimit: act_only_over_budget leaves out turns by the window's room and "
                "ignores max_attached_turns / max_attached_messages; set one or the other"
            )
        return self


def _first_kept(messages: list[AnyMessage], config: WindowLimitConfig, env: RuleEnv) -> int:
    """Index where the attached suffix of whole turns starts."""
    units = rounds(messages, env.detector)
    if not units:
        return 0
    kept = 1  # the current turn (or the only unit) is always attached
    count = len(units[-1])
    while kept < len(units):
        candidate = units[-kept - 1]
        if config.max_attached_turns is not None and kept >= config.max_attached_turns:
            break
        if config.max_attached_messages is not None and count + len(candidate) > config.max_attached_messages:
            break
        kept += 1
        count += len(candidate)
    return units[-kept].start


def _answered(messages: list[AnyMessage], env: RuleEnv) -> list[Turn]:
    """The turns the headroom mode may leave out, oldest first."""
    if not HeadroomBudget(messages, env).over:
        return []
    return settled_older_turns(messages, env.detector)


def triggers(messages: list[AnyMessage], config: WindowLimitConfig, env: RuleEnv) -> bool:
    """True if some turn would be left out."""
    if config.act_only_over_budget:
        return bool(_answered(messages, env))
    if config.max_attached_turns is None and config.max_attached_messages is None:
        return False
    return _first_kept(messages, config, env) > 0


def apply(
    messages: list[AnyMessage], config: WindowLimitConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Leave out the oldest whole turns beyond the limits (headroom mode: while over the
    tail budget); anchors stay."""
    if config.act_only_over_budget:
        return _leave_out_while_over(messages, env)
    if not triggers(messages, config, env):
        return RuleResult(messages)
    start = _first_kept(messages, config, env)
    pinned = anchor_indices(messages, env.detector)
    rewrite = Rewrite(messages)
    for i in range(start):
        if i not in pinned:
            rewrite.remove(i)
    return rewrite.result()


def _leave_out_while_over(messages: list[AnyMessage], env: RuleEnv) -> RuleResult:
    rewrite = Rewrite(messages)
    budget = HeadroomBudget(messages, env)
    if not budget.over:
        return rewrite.result()
    pinned = anchor_indices(messages, env.detector)
    for turn in settled_older_turns(messages, env.detector):
        if not budget.over:
            break
        for i in range(turn.start, turn.end):
            if i not in pinned:
                rewrite.remove(i)
                budget.saved(messages[i], None)
    return rewrite.result()


class WindowLimit(RuleProcessor[WindowLimitConfig]):
    """Attaches only the newest whole turns (current turn and anchors always)."""

    config_model = WindowLimitConfig
    kind = "view"
    functions = RuleFunctions(triggers, apply)
