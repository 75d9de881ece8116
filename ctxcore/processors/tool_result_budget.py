"""``ToolResultBudgetProcessor`` (spec 4.11): a token budget for tool results per turn.

While the tool results of one turn add up to more than ``tokens_threshold`` tokens, the
largest offloadable one is replaced by a ``<persisted-output>`` placeholder. Sizes are
tokens (the counter's); the preview length ``trim_size`` is characters.

With ``act_only_over_budget`` (set by the default chain; ctxcore's own mode) the turn
budget is unused: results over ``large_message_threshold`` are offloaded oldest first,
across turns, only while the messages are over ``RuleEnv.tail_budget_tokens``, and never
in the newest step; a result whose preview alone would bring them under goes before older
ones that would not.

Not carried over from the reference: ``offload_message_type`` (only tool results are ever
handled), ``offload_file_prefix`` (offloads are named by content handle) and the
compatibility-only ``messages_threshold`` / ``messages_to_keep``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from pydantic import PositiveInt, model_validator

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, ToolMessage, message_text, replace_content
from ctxcore.processors.base import HeadroomConfig
from ctxcore.processors.offload import has_offload_marker, offload_marker
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import (
    HeadroomBudget,
    Rewrite,
    RuleEnv,
    RuleResult,
    rounds,
    tool_calls_of_results,
    tool_name,
)
from ctxcore.turns import newest_step_start

__all__ = [
    "ToolResultBudgetConfig",
    "ToolResultBudgetProcessor",
    "apply",
    "persisted_output",
    "triggers",
]


class ToolResultBudgetConfig(HeadroomConfig):
    """Budget of ``ToolResultBudgetProcessor``.

    Attributes:
        tokens_threshold: tokens of tool results one turn may hold.
        large_message_threshold: only results above this many tokens are offloaded.
        trim_size: **characters** of preview kept in the placeholder.
        tool_name_allowlist: tools whose results are never offloaded.
        act_only_over_budget: headroom-aware mode (see the module docstring).
    """

    tokens_threshold: PositiveInt = 50000
    large_message_threshold: PositiveInt = 10000
    trim_size: PositiveInt = 3000
    tool_name_allowlist: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _trim_below_large(self) -> ToolResultBudgetConfig:
        if self.trim_size >= self.large_message_threshold:
            raise ConfigError(
                f"trim_size ({self.trim_size}) must be smaller than large_message_threshold "
                f"({self.large_message_threshold})"
            )
        return self


def persisted_output(content: str, marker: str, trim_size: int) -> str:
    """The ``<persisted-output>`` placeholder: size, marker, a preview of ``trim_size`` chars."""
    preview = content[:trim_size]
    more = "\n..." if len(content) > trim_size else ""
    return (
        f"<persisted-output>\nOutput too large ({len(content.encode())} bytes).\n{marker}\n"
        f"Preview (first {len(preview)} chars):\n{preview}{more}\n</persisted-output>"
    )


def _offloadable(
    messages: list[AnyMessage], indices: Iterable[int], config: ToolResultBudgetConfig, env: RuleEnv
) -> list[int]:
    calls = tool_calls_of_results(messages)
    allow = set(config.tool_name_allowlist or ())
    return [
        i
        for i in indices
        if isinstance(messages[i], ToolMessage)
        and not has_offload_marker(messages[i])
        and tool_name(messages[i], calls.get(i)) not in allow
        and env.tokens(messages[i]) > config.large_message_threshold
    ]


def _plan(
    messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv
) -> list[tuple[int, list[int]]]:
    """Per round over budget: (its tool-result tokens, its candidates largest first)."""
    plans = []
    for span in rounds(messages, env.detector):
        results = [i for i in span if isinstance(messages[i], ToolMessage)]
        total = sum(env.tokens(messages[i]) for i in results)
        if total <= config.tokens_threshold:
            continue
        candidates = _offloadable(messages, results, config, env)
        if candidates:
            plans.append((total, sorted(candidates, key=lambda i: (-env.tokens(messages[i]), i))))
    return plans


def _headroom_candidates(
    messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv
) -> list[int]:
    if not HeadroomBudget(messages, env).over:
        return []
    return _offloadable(messages, range(newest_step_start(messages)), config, env)


# A marker as long as any the offload store writes: previews are sized with it before one is.
_SIZING_MARKER = offload_marker("0" * 16, "in_memory")


def _next_to_offload(
    messages: list[AnyMessage], pending: list[int], over: int, config: ToolResultBudgetConfig, env: RuleEnv
) -> int:
    """The oldest pending result whose preview alone frees ``over`` tokens, else the oldest.

    Oldest first alone previewed two 660-token file views before the 20k-token log after
    them that was the whole excess, and served 1.2k tokens of a 6.7k room (``bench/README.md``,
    "The newest output"): one result that suffices goes instead of several that do not."""
    for i in pending:
        preview = persisted_output(message_text(messages[i]), _SIZING_MARKER, config.trim_size)
        if env.tokens(messages[i]) - env.tokens(replace_content(messages[i], preview)) >= over:
            return i
    return pending[0]


def triggers(messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv) -> bool:
    """True if some turn is over budget and has a result that could be offloaded (headroom
    mode: the messages are over the tail budget and an older result is large)."""
    if config.act_only_over_budget:
        return bool(_headroom_candidates(messages, config, env))
    return bool(_plan(messages, config, env))


def _render(content: str, trim_size: int) -> Callable[[str], str]:
    return partial(persisted_output, content, trim_size=trim_size)


def apply(
    messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Offload the largest results of each over-budget turn until it fits (``force`` is moot:
    the budget is the rule). Headroom mode: oldest large results first, while over."""
    rewrite = Rewrite(messages)
    if config.act_only_over_budget:
        budget = HeadroomBudget(messages, env)
        pending = _headroom_candidates(messages, config, env)
        while pending and budget.over:
            i = _next_to_offload(messages, pending, budget.total - (budget.limit or 0), config, env)
            pending.remove(i)
            rewrite.offload_replace(i, env, _render(message_text(messages[i]), config.trim_size))
            budget.saved(messages[i], rewrite.current(i))
        return rewrite.result()
    for total, candidates in _plan(messages, config, env):
        for i in candidates:
            if total <= config.tokens_threshold:
                break
            before = env.tokens(messages[i])
            if rewrite.offload_replace(i, env, _render(message_text(messages[i]), config.trim_size)):
                total -= before - env.tokens(rewrite.current(i))
    return rewrite.result()


class ToolResultBudgetProcessor(RuleProcessor[ToolResultBudgetConfig]):
    """Keeps each turn's tool results under a token budget by offloading the largest."""

    config_model = ToolResultBudgetConfig
    kind = "offloader"
    functions = RuleFunctions(triggers, apply)
