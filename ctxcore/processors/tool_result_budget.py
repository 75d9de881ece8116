"""``ToolResultBudgetProcessor`` (spec 4.11): a token budget for tool results per turn.

While the tool results of one turn add up to more than ``tokens_threshold`` tokens, the
largest offloadable one is replaced by a ``<persisted-output>`` placeholder. Sizes are
tokens (the counter's); the preview length ``trim_size`` is characters.

Not carried over from the reference: ``offload_message_type`` (only tool results are ever
handled), ``offload_file_prefix`` (offloads are named by content handle) and the
compatibility-only ``messages_threshold`` / ``messages_to_keep``.
"""

from __future__ import annotations

from functools import partial

from pydantic import PositiveInt, model_validator

from ctxcore.messages import AnyMessage, ToolMessage
from ctxcore.processors.base import ProcessorConfig, register_processor
from ctxcore.processors.offload import has_offload_marker
from ctxcore.processors.rule_processor import RuleProcessor
from ctxcore.processors.rules import Rewrite, RuleEnv, RuleResult, rounds, tool_calls_of_results, tool_name

__all__ = [
    "ToolResultBudgetConfig",
    "ToolResultBudgetProcessor",
    "apply",
    "persisted_output",
    "triggers",
]


class ToolResultBudgetConfig(ProcessorConfig):
    """Budget of ``ToolResultBudgetProcessor``.

    Attributes:
        tokens_threshold: tokens of tool results one turn may hold.
        large_message_threshold: only results above this many tokens are offloaded.
        trim_size: **characters** of preview kept in the placeholder.
        tool_name_allowlist: tools whose results are never offloaded.
    """

    tokens_threshold: PositiveInt = 50000
    large_message_threshold: PositiveInt = 10000
    trim_size: PositiveInt = 3000
    tool_name_allowlist: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _trim_below_large(self) -> ToolResultBudgetConfig:
        if self.trim_size >= self.large_message_threshold:
            raise ValueError(
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


def _plan(
    messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv
) -> list[tuple[int, list[int]]]:
    """Per round over budget: (its tool-result tokens, its candidates largest first)."""
    calls = tool_calls_of_results(messages)
    allow = set(config.tool_name_allowlist or ())
    plans = []
    for span in rounds(messages, env.detector):
        results = [i for i in span if isinstance(messages[i], ToolMessage)]
        total = sum(env.tokens(messages[i]) for i in results)
        if total <= config.tokens_threshold:
            continue
        candidates = [
            i
            for i in results
            if isinstance(messages[i].content, str)
            and not has_offload_marker(messages[i])
            and tool_name(messages[i], calls.get(i)) not in allow
            and env.tokens(messages[i]) > config.large_message_threshold
        ]
        if candidates:
            plans.append((total, sorted(candidates, key=lambda i: (-env.tokens(messages[i]), i))))
    return plans


def triggers(messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv) -> bool:
    """True if some turn is over budget and has a result that could be offloaded."""
    return bool(_plan(messages, config, env))


def apply(
    messages: list[AnyMessage], config: ToolResultBudgetConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Offload the largest results of each over-budget turn until it fits (``force`` is moot:
    the budget is the rule)."""
    rewrite = Rewrite(messages)
    for total, candidates in _plan(messages, config, env):
        for i in candidates:
            if total <= config.tokens_threshold:
                break
            before = env.tokens(messages[i])
            render = partial(persisted_output, str(messages[i].content), trim_size=config.trim_size)
            if rewrite.offload_replace(i, env, render):
                total -= before - env.tokens(rewrite.current(i))
    return rewrite.result()


@register_processor
class ToolResultBudgetProcessor(RuleProcessor[ToolResultBudgetConfig]):
    """Keeps each turn's tool results under a token budget by offloading the largest."""

    config_model = ToolResultBudgetConfig
    kind = "offloader"

    def triggers(self, messages: list[AnyMessage], env: RuleEnv) -> bool:
        """See ``triggers``."""
        return triggers(messages, self.config, env)

    def rule(self, messages: list[AnyMessage], env: RuleEnv, *, force: bool = False) -> RuleResult:
        """See ``apply``."""
        return apply(messages, self.config, env, force=force)
