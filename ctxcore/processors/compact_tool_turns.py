"""``CompactCompletedToolTurns``: an old finished tool turn shrinks to request + answer.

A view processor: every completed turn older than the newest ``keep_recent_turns`` that
used tools is served as its user message(s) and its final assistant reply; the tool steps
in between are left out (whole steps, so the window stays protocol-valid) and reported
as log-id ranges. The current turn, failed turns (a result with ``metadata.is_error``)
and cancelled turns (``metadata.cancelled``) are never touched: their details are what
the model still needs.

With ``act_only_over_budget`` (set by the default chain; ctxcore's own mode) the turns are
compacted oldest first, a step at a time, only while the messages are over
``RuleEnv.tail_budget_tokens``; ``keep_recent_turns`` is unused (the current turn never is,
nor the turn the newest step closes: a request with no reply yet answers that turn).
"""

from __future__ import annotations

from pydantic import NonNegativeInt

from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.processors.base import HeadroomConfig
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import HeadroomBudget, Rewrite, RuleEnv, RuleResult
from ctxcore.turns import Turn, settled_older_turns, steps, turns

__all__ = ["CompactCompletedToolTurns", "CompactCompletedToolTurnsConfig", "apply", "triggers"]


class CompactCompletedToolTurnsConfig(HeadroomConfig):
    """Settings of ``CompactCompletedToolTurns``.

    Attributes:
        keep_recent_turns: newest turns served in full (the current turn always is).
        act_only_over_budget: headroom-aware mode (see the module docstring).
    """

    keep_recent_turns: NonNegativeInt = 2


def _uses_tools(messages: list[AnyMessage], turn: Turn) -> bool:
    return any(isinstance(m, AssistantMessage) and m.tool_calls for m in messages[turn.start : turn.end])


def _candidates(
    messages: list[AnyMessage], config: CompactCompletedToolTurnsConfig, env: RuleEnv
) -> list[Turn]:
    """The turns that may be compacted, oldest first, whatever the room."""
    if config.act_only_over_budget:
        return [t for t in settled_older_turns(messages, env.detector) if _uses_tools(messages, t)]
    found = turns(messages, env.detector)
    # The current (last) turn is never compacted, even with keep_recent_turns=0.
    older = found[: max(len(found) - max(config.keep_recent_turns, 1), 0)]
    return [t for t in older if t.complete and not t.failed and not t.cancelled and _uses_tools(messages, t)]


def triggers(messages: list[AnyMessage], config: CompactCompletedToolTurnsConfig, env: RuleEnv) -> bool:
    """True if an older completed tool turn exists (headroom mode: and the room is exceeded)."""
    if config.act_only_over_budget and not HeadroomBudget(messages, env).over:
        return False
    return bool(_candidates(messages, config, env))


def apply(
    messages: list[AnyMessage],
    config: CompactCompletedToolTurnsConfig,
    env: RuleEnv,
    *,
    force: bool = False,
) -> RuleResult:
    """Serve each older completed tool turn as its user messages + final reply (headroom
    mode: the oldest steps of the oldest turns first, one step at a time, while over the
    tail budget)."""
    rewrite = Rewrite(messages)
    budget = HeadroomBudget(messages, env)
    # Headroom mode checks the room before each step (none is taken while the messages fit).
    for turn in _candidates(messages, config, env):
        # Step by step, not the turn at once: one lookup-heavy turn of a chat (tau-bench,
        # sixteen messages) left a lagging worker's window at 0.36 of its budget.
        for step in steps(messages[turn.start : turn.end]):
            if config.act_only_over_budget and not budget.over:
                return rewrite.result()
            for i in range(turn.start + step.start, turn.start + step.end):
                if i != turn.final and not isinstance(messages[i], UserMessage):
                    rewrite.remove(i)
                    budget.saved(messages[i], None)
    return rewrite.result()


class CompactCompletedToolTurns(RuleProcessor[CompactCompletedToolTurnsConfig]):
    """Serves older completed tool turns as request + final answer."""

    config_model = CompactCompletedToolTurnsConfig
    kind = "view"
    functions = RuleFunctions(triggers, apply)
