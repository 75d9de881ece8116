"""``WindowLimit``: attach only the newest whole turns to a window.

A view processor: it shapes each served window and never changes the stored view. Turns
are kept or left out whole (so no tool call loses its result), the current turn is always
attached, and a left-out task anchor is put back at the head of the window. What is left
out is reported as log-id ranges and stays in the view and the log.
"""

from __future__ import annotations

from pydantic import PositiveInt

from ctxcore.messages import AnyMessage
from ctxcore.processors.base import ProcessorConfig
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import Rewrite, RuleEnv, RuleResult, anchor_indices, rounds

__all__ = ["WindowLimit", "WindowLimitConfig", "apply", "triggers"]


class WindowLimitConfig(ProcessorConfig):
    """Limits of ``WindowLimit`` (None: no limit).

    Attributes:
        max_attached_turns: at most this many newest turns.
        max_attached_messages: whole newest turns while their messages fit this count.
    """

    max_attached_turns: PositiveInt | None = None
    max_attached_messages: PositiveInt | None = None


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


def triggers(messages: list[AnyMessage], config: WindowLimitConfig, env: RuleEnv) -> bool:
    """True if some turn would be left out."""
    if config.max_attached_turns is None and config.max_attached_messages is None:
        return False
    return _first_kept(messages, config, env) > 0


def apply(
    messages: list[AnyMessage], config: WindowLimitConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Leave out the oldest whole turns beyond the limits; anchors stay."""
    if not triggers(messages, config, env):
        return RuleResult(messages)
    start = _first_kept(messages, config, env)
    pinned = anchor_indices(messages, env.detector)
    rewrite = Rewrite(messages)
    for i in range(start):
        if i not in pinned:
            rewrite.remove(i)
    return rewrite.result()


class WindowLimit(RuleProcessor[WindowLimitConfig]):
    """Attaches only the newest whole turns (current turn and anchors always)."""

    config_model = WindowLimitConfig
    kind = "view"
    functions = RuleFunctions(triggers, apply)
