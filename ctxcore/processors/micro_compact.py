"""``MicroCompactProcessor`` (spec 4.13): clear old results of chatty tools.

Per tool, all but the newest ``keep_recent_per_tool`` results become the cleared marker,
followed by an offload marker so the original stays reloadable (the reference cleared
them without a way back). A result another processor already offloaded keeps its existing
marker and is not written again. ``compactable_tool_names`` entries are ``fnmatch``
patterns, so ``"*"`` makes every tool compactable.

With ``act_only_over_budget`` (set by the default chain; ctxcore's own mode) the per-tool
count and the trigger are unused: results are cleared one at a time, oldest first across
tools, only while the messages are over ``RuleEnv.tail_budget_tokens``, never in the
newest step.
"""

from __future__ import annotations

import fnmatch
from collections import defaultdict

from pydantic import NonNegativeInt, PositiveInt

from ctxcore.markers import CLEARED_TOOL_RESULT
from ctxcore.messages import AnyMessage, ToolMessage, message_text, replace_content
from ctxcore.processors.base import HeadroomConfig
from ctxcore.processors.offload import find_offload_markers
from ctxcore.processors.rule_processor import RuleFunctions, RuleProcessor
from ctxcore.processors.rules import (
    HeadroomBudget,
    Rewrite,
    RuleEnv,
    RuleResult,
    tool_calls_of_results,
    tool_name,
)
from ctxcore.turns import newest_step_start, steps

__all__ = ["MicroCompactConfig", "MicroCompactProcessor", "apply", "triggers"]


class MicroCompactConfig(HeadroomConfig):
    """Settings of ``MicroCompactProcessor``.

    Attributes:
        trigger_threshold: act once a tool has more than ``trigger_threshold +
            keep_recent_per_tool`` uncleared results.
        compactable_tool_names: tool names (``fnmatch`` patterns) whose results may be cleared.
        keep_recent_per_tool: newest results of each tool left untouched.
        cleared_marker: the text that replaces a cleared result.
        act_only_over_budget: headroom-aware mode (see the module docstring).
    """

    trigger_threshold: PositiveInt = 5
    compactable_tool_names: tuple[str, ...] = ("grep", "glob", "read_file", "web_search", "web_fetch")
    keep_recent_per_tool: NonNegativeInt = 15
    cleared_marker: str = CLEARED_TOOL_RESULT


def _by_tool(messages: list[AnyMessage], config: MicroCompactConfig) -> dict[str, list[int]]:
    calls = tool_calls_of_results(messages)
    found: dict[str, list[int]] = defaultdict(list)
    for i, message in enumerate(messages):
        if not isinstance(message, ToolMessage):
            continue
        name = tool_name(message, calls.get(i))
        if any(fnmatch.fnmatchcase(name, p) for p in config.compactable_tool_names):
            found[name].append(i)
    return found


def _cleared(message: AnyMessage, config: MicroCompactConfig) -> bool:
    return message_text(message).startswith(config.cleared_marker)


def _to_clear(messages: list[AnyMessage], config: MicroCompactConfig, force: bool) -> list[int]:
    limit = config.keep_recent_per_tool + (0 if force else config.trigger_threshold)
    out: list[int] = []
    for results in _by_tool(messages, config).values():
        old = results[: len(results) - config.keep_recent_per_tool]
        uncleared = [i for i in old if not _cleared(messages[i], config)]
        live = len(uncleared) + len(results) - len(old)
        if uncleared and live > limit:
            out.extend(uncleared)
    return sorted(out)


def _round_complete(messages: list[AnyMessage]) -> bool:
    """No tool call in flight. Unlike the reference, trailing user messages (a new request)
    do not count as an open round: nothing is waiting for a result there."""
    found = steps(messages)
    return bool(found) and (found[-1].complete or found[-1].assistant is None)


def _headroom_candidates(messages: list[AnyMessage], config: MicroCompactConfig, env: RuleEnv) -> list[int]:
    if not HeadroomBudget(messages, env).over:
        return []
    newest = newest_step_start(messages)
    found = (i for results in _by_tool(messages, config).values() for i in results)
    return sorted(i for i in found if i < newest and not _cleared(messages[i], config))


def triggers(messages: list[AnyMessage], config: MicroCompactConfig, env: RuleEnv) -> bool:
    """True if no tool call is in flight and some tool is over its threshold (headroom
    mode: the messages are over the tail budget and an older result can be cleared)."""
    if config.act_only_over_budget:
        return bool(_headroom_candidates(messages, config, env))
    return _round_complete(messages) and bool(_to_clear(messages, config, force=False))


def _clear(rewrite: Rewrite, i: int, config: MicroCompactConfig, env: RuleEnv) -> None:
    message = rewrite.current(i)
    existing = find_offload_markers(message_text(message))
    if existing:
        # Already offloaded by another processor: point at that copy, write nothing.
        text = "\n".join([config.cleared_marker, *existing])
        rewrite.replace(i, replace_content(message, text))
        return
    rewrite.offload_replace(i, env, lambda marker: f"{config.cleared_marker}\n{marker}")


def apply(
    messages: list[AnyMessage], config: MicroCompactConfig, env: RuleEnv, *, force: bool = False
) -> RuleResult:
    """Clear old results of compactable tools (``force``: ignore the trigger threshold).
    Headroom mode: the oldest results first, one at a time, while over the tail budget."""
    rewrite = Rewrite(messages)
    if config.act_only_over_budget:
        HeadroomBudget(messages, env).rewrite_oldest_first(
            rewrite, _headroom_candidates(messages, config, env), lambda i: _clear(rewrite, i, config, env)
        )
        return rewrite.result()
    if not force and not _round_complete(messages):
        return RuleResult(messages)
    for i in _to_clear(messages, config, force):
        _clear(rewrite, i, config, env)
    return rewrite.result()


class MicroCompactProcessor(RuleProcessor[MicroCompactConfig]):
    """Clears all but the newest results of each compactable tool."""

    config_model = MicroCompactConfig
    kind = "compressor"
    functions = RuleFunctions(triggers, apply)
