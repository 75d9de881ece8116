"""Rule chains over plain message lists: the default chain and ``apply_rules``.

``apply_rules`` is what the distributed fast path calls on the raw log tail: no hooks, no
context, no clock, only the pure rule functions in order. Its result always passes
``check_window`` and keeps both anchors verbatim when its input did.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage
from ctxcore.processors.events import IdRange
from ctxcore.processors.offload_batch import DeferredOffloads
from ctxcore.processors.registry import ProcessorRegistry, builtin_registry
from ctxcore.processors.rule_processor import RuleProcessor
from ctxcore.processors.rules import RuleEnv
from ctxcore.state.base import OffloadStore
from ctxcore.state.keys import ConversationKey
from ctxcore.telemetry import current_span
from ctxcore.tokens import TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector
from ctxcore.window import DEFAULT_CONTEXT_MAX_TOKENS

__all__ = [
    "ChainResult",
    "RuleChain",
    "WindowRules",
    "apply_rules",
    "apply_rules_result",
    "build_rule_chain",
    "default_rule_chain",
]

RuleChain = Sequence[tuple[str, Any]]

logger = logging.getLogger(__name__)


DEFAULT_MAX_RESULT_RATIO = 0.25


def default_rule_chain(
    budget_tokens: int = DEFAULT_CONTEXT_MAX_TOKENS,
    *,
    max_result_ratio: float = DEFAULT_MAX_RESULT_RATIO,
) -> list[tuple[str, dict[str, Any]]]:
    """The default chain as (name, config) pairs, scaled to the window's budget (an engine's
    context passes its model's window): headroom first.

    ``ToolResultCap (newest step) -> ToolResultCap (older steps) -> CompactCompletedToolTurns
    -> WindowLimit -> ToolResultBudgetProcessor -> MicroCompactProcessor -> ToolResultCap``,
    all with ``act_only_over_budget``: while the messages fit ``RuleEnv.tail_budget_tokens``
    they are served verbatim, and once over, each rule works oldest first and stops as soon as
    they fit (an output of the newest step that could not fit even with every older result
    cleared cut to the room the older messages leave, no smaller than the cap; older results
    over ``max_result_ratio`` of the budget cut to their head and tail at the cap, the original
    offloaded; old answered turns reduced to request and answer, then left out whole, anchors
    kept; large results offloaded to a preview; results cleared one at a time; last, a
    newest-step result still over the cap cut to it). Only the caps touch the newest step.

    Old answered turns go before any result of the current request is previewed or cleared:
    with a user who speaks every few steps the current request's lookups are what the agent
    acts on, and clearing them while the older requests stayed whole held fewer of the
    next-step references than a plain truncation (tau-bench at lag 5: `rules` 0.558 -> 0.622,
    `full` 0.588 -> 0.619 against `steps`' 0.636; ``bench/README.md``, "Old turns before the
    current request's results"). A coding run is one turn, so neither turn rule acts there.

    Older results meet the cap before any preview because compaction plans every result at
    the cap: previewing an older 37k-token log to a few hundred tokens left the room between
    the two unused, windows 0.55-0.58 full at 16k after such an output (0.76 with the cap
    first; ``bench/README.md``, "Older outputs at the cap"). Pass the same budget to
    ``apply_rules(budget_tokens=...)`` and the room the messages have as
    ``tail_budget_tokens``; without it the chain does nothing.

    Raises:
        ConfigError: ``max_result_ratio`` outside (0, 1].
    """
    if not 0 < max_result_ratio <= 1:
        raise ConfigError(f"default_rule_chain: max_result_ratio must be in (0, 1], got {max_result_ratio}")
    m = budget_tokens
    large = max(m // 20, 2)
    cap = {"max_result_ratio": max_result_ratio, "act_only_over_budget": True}
    return [
        ("ToolResultCap", {**cap, "scope": "newest_step"}),
        ("ToolResultCap", {**cap, "scope": "older_steps"}),
        ("CompactCompletedToolTurns", {"act_only_over_budget": True}),
        ("WindowLimit", {"act_only_over_budget": True}),
        (
            "ToolResultBudgetProcessor",
            {
                "large_message_threshold": large,
                "trim_size": min(max(200, min(3000, m // 64)), large - 1),
                "act_only_over_budget": True,
            },
        ),
        ("MicroCompactProcessor", {"compactable_tool_names": ["*"], "act_only_over_budget": True}),
        ("ToolResultCap", cap),
    ]


def build_rule_chain(
    chain: RuleChain | Sequence[RuleProcessor[Any]], registry: ProcessorRegistry | None = None
) -> list[RuleProcessor[Any]]:
    """Instantiate (and validate) a chain of rule processors; built ones are kept as they are.

    Raises:
        ConfigError: an unknown name, an invalid config, or a processor that is not a rule.
    """
    built: list[RuleProcessor[Any]] = []
    for entry in chain:
        if isinstance(entry, RuleProcessor):
            built.append(entry)
            continue
        name, config = entry
        processor = (registry or builtin_registry()).create(name, config)
        if not isinstance(processor, RuleProcessor):
            raise ConfigError(f"{name}: not a rule processor; apply_rules runs rule processors only")
        built.append(processor)
    return built


class WindowRules:
    """The default chain for one window's budget: the one way the budget enters the chain
    (its thresholds and ``RuleEnv.context_max`` both come from ``budget_tokens``)."""

    def __init__(self, budget_tokens: int, *, max_result_ratio: float = DEFAULT_MAX_RESULT_RATIO) -> None:
        self.budget_tokens = budget_tokens
        self.max_result_ratio = max_result_ratio

    def apply(
        self,
        messages: Sequence[AnyMessage],
        tail_budget_tokens: int | None,
        chunk_tokens: int = 0,
        *,
        counter: TokenCounter,
        offloads: OffloadStore | None,
        key: ConversationKey,
        detector: UserDetector,
    ) -> list[AnyMessage]:
        """The tail after the chain, within ``tail_budget_tokens`` where the rules can bring it
        (an ``assemble.RuleFn`` once the keywords are bound)."""
        if tail_budget_tokens is None or counter.sum_messages(messages) <= tail_budget_tokens:
            # Every rule of the default chain is headroom-aware, idle while the tail fits its
            # room: the usual window builds no processor (a tenth of its time at tail 51).
            return list(messages)
        rules = build_rule_chain(
            default_rule_chain(self.budget_tokens, max_result_ratio=self.max_result_ratio)
        )
        return apply_rules_result(
            messages,
            rules,
            counter,
            offloads,
            key,
            budget_tokens=self.budget_tokens,
            detector=detector,
            tail_budget_tokens=tail_budget_tokens,
            chunk_tokens=chunk_tokens,
        ).messages


@dataclass(frozen=True)
class ChainResult:
    """What a chain did: the messages, and every span and handle its rules reported."""

    messages: list[AnyMessage]
    removed_ranges: tuple[IdRange, ...] = ()
    offloaded: tuple[str, ...] = ()
    changed: bool = False


def apply_rules_result(
    messages: Sequence[AnyMessage],
    chain: RuleChain | Sequence[RuleProcessor[Any]],
    counter: TokenCounter,
    offloads: OffloadStore | None,
    key: ConversationKey,
    *,
    budget_tokens: int = DEFAULT_CONTEXT_MAX_TOKENS,
    detector: UserDetector = DEFAULT_DETECTOR,
    originals: Mapping[str, AnyMessage] | None = None,
    tail_budget_tokens: int | None = None,
    chunk_tokens: int = 0,
) -> ChainResult:
    """Apply a chain in passive mode (as on every add), collecting what each rule reported.

    ``originals`` maps log ids to the messages as logged; by default the input messages
    are taken as the originals (the fast path passes raw log messages).
    ``budget_tokens`` is the window's (the rules' ``RuleEnv.context_max``);
    ``tail_budget_tokens`` is the room the messages have in the window (None: unknown,
    the reference behaviour; headroom-aware rules then do nothing).

    ``chunk_tokens`` (> 0): the rules free room in whole chunks (``RuleEnv.chunk_tokens``).
    """
    rules = build_rule_chain(chain)
    total = counter.sum_messages(messages)
    if all(r.idle_for(total, tail_budget_tokens) for r in rules):
        # The fast path's usual window: the tail fits, nothing to build an environment for.
        return ChainResult(list(messages))
    if originals is None:
        originals = {m.context_message_id: m for m in messages if m.context_message_id}
    env = RuleEnv(
        counter=counter,
        key=key,
        offloads=offloads,
        detector=detector,
        originals=originals,
        context_max=budget_tokens,
        tail_budget_tokens=tail_budget_tokens,
        chunk_tokens=chunk_tokens,
    )
    if offloads is None or isinstance(offloads, DeferredOffloads):
        return _run(messages, rules, env)
    deferred = DeferredOffloads(offloads)
    result = _run(messages, rules, replace(env, offloads=deferred))
    try:
        deferred.flush()
    except Exception:
        # Some offloads may be missing: run again writing one at a time, so a result whose
        # original could not be stored stays in the view as it was.
        logger.warning("batched offload for %s failed; offloading one at a time", key, exc_info=True)
        return _run(messages, rules, env)
    return result


def _run(messages: Sequence[AnyMessage], rules: Sequence[RuleProcessor[Any]], env: RuleEnv) -> ChainResult:
    current = list(messages)
    ranges: list[IdRange] = []
    handles: list[str] = []
    changed = False
    for rule in rules:
        if rule.idle_for(env.tail_tokens(current), env.tail_budget_tokens):
            continue  # it cannot act on these messages
        result = rule.rule(current, env)
        if result.changed:
            # The span being served (a window's), when telemetry is on: which rules acted.
            current_span().append("ctxcore.rules_applied", type(rule).__name__)
            changed = True
            current = result.messages
            ranges.extend(result.removed_ranges)
            handles.extend(result.offloaded)
    return ChainResult(current, tuple(ranges), tuple(dict.fromkeys(handles)), changed)


def apply_rules(
    messages: Sequence[AnyMessage],
    chain: RuleChain | Sequence[RuleProcessor[Any]],
    counter: TokenCounter,
    offloads: OffloadStore | None,
    key: ConversationKey,
    **kwargs: Any,
) -> list[AnyMessage]:
    """The messages after every rule of ``chain`` (see ``apply_rules_result``)."""
    return apply_rules_result(messages, chain, counter, offloads, key, **kwargs).messages
