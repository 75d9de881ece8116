"""``ToolResultWindowProcessor`` (spec 4.12): only the newest K results of chosen tools stay.

One window across all listed tools (matched by name suffix). Older results are persisted
like ``ToolResultBudgetProcessor`` does, or, when shorter than ``min_offload_chars``,
compacted in place to a ``<windowed-output>`` preview without an offload: their full text
stays in the log under their own log id, which the event reports. Unlike the reference,
the config is validated.
"""

from __future__ import annotations

from functools import partial

from pydantic import NonNegativeInt, PositiveInt

from ctxcore.messages import AnyMessage, ToolMessage, message_text, replace_content
from ctxcore.processors.base import ProcessorConfig
from ctxcore.processors.offload import has_offload_marker
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import Rewrite, RuleEnv, RuleResult, tool_calls_of_results, tool_name
from ctxcore.processors.tool_result_budget import persisted_output

__all__ = ["ToolResultWindowConfig", "ToolResultWindowProcessor", "apply", "triggers"]

MANAGED_KEY = "tool_result_window_managed"


class ToolResultWindowConfig(ProcessorConfig):
    """Window of ``ToolResultWindowProcessor``.

    Attributes:
        tool_names: tool name suffixes in the window (empty: the processor does nothing).
        keep_last_k: newest matching results left untouched.
        trim_size: **characters** of preview in a persisted placeholder.
        min_offload_chars: results shorter than this many **characters** are compacted in
            place instead of persisted (0: always persist).
        small_result_trim_size: **characters** kept by an in-place compaction.
    """

    tool_names: tuple[str, ...] = ()
    keep_last_k: PositiveInt = 3
    trim_size: PositiveInt = 3000
    min_offload_chars: NonNegativeInt = 0
    small_result_trim_size: PositiveInt = 800


def _handled(message: AnyMessage) -> bool:
    return message.metadata.get(MANAGED_KEY) is True or has_offload_marker(message)


def _older(messages: list[AnyMessage], config: ToolResultWindowConfig) -> list[int]:
    """Matching results outside the newest K that are not handled yet."""
    if not config.tool_names:
        return []
    calls = tool_calls_of_results(messages)
    matches = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, ToolMessage) and tool_name(m, calls.get(i)).endswith(config.tool_names)
    ]
    return [i for i in matches[: -config.keep_last_k] if not _handled(messages[i])]


def triggers(messages: list[AnyMessage], config: ToolResultWindowConfig, env: RuleEnv) -> bool:
    """True if a matching result older than the newest K is still unhandled."""
    return bool(_older(messages, config))


def apply(
    messages: list[AnyMessage], config: ToolResultWindowConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Persist or compact every unhandled matching result outside the newest K."""
    rewrite = Rewrite(messages)
    for i in _older(messages, config):
        message = messages[i]
        content = message_text(message)
        if config.min_offload_chars and len(content) < config.min_offload_chars:
            limit = config.small_result_trim_size
            if len(content) > limit:
                compacted = f"<windowed-output>\n{content[:limit]}\n...\n</windowed-output>"
                rewrite.replace(i, replace_content(message, compacted, **{MANAGED_KEY: True}), cut=True)
            else:
                rewrite.replace(i, replace_content(message, content, **{MANAGED_KEY: True}))
            continue
        rewrite.offload_replace(
            i,
            env,
            partial(persisted_output, content, trim_size=config.trim_size),
            **{MANAGED_KEY: True},
        )
    return rewrite.result()


class ToolResultWindowProcessor(RuleProcessor[ToolResultWindowConfig]):
    """Keeps the newest ``keep_last_k`` results of the listed tools; older ones are persisted."""

    config_model = ToolResultWindowConfig
    kind = "offloader"
    functions = RuleFunctions(triggers, apply)
