"""Context policies the harness replays a conversation through, one instance per conversation.

The baselines (``truncate``, ``steps``, ``mask``, ``lossless``) live in ``baselines``. Here:

* ``rules``: the default rule chain on the whole log, served by ``assemble_window`` (whose
  deterministic fallback leaves out the oldest steps when the rules are not enough).
* ``full``: what the distributed service runs, with the service's settings (``Settings()``
  defaults unless told otherwise). Every window comes from ``assemble_window`` with the
  configured rule chain on the raw tail after the cursor; when the view is over the trigger
  the compaction pipeline runs, stage by stage through a ``Coordinator`` on memory stores,
  exactly as the workers loop ``plan`` / ``run_stage``: before the window is served, or
  ``lag`` windows later (a worker that lags; the windows between are served as the fast
  path serves them).
* ``round_level``, ``current_round``, ``dialogue``: the embedded LLM compressors through a
  ``ContextEngine`` (no rule chain), triggered at 0.9 of the budget (their own default).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ctxcore.assemble import RuleFn, assemble_window
from ctxcore.coordinator import Coordinator
from ctxcore.engine import ContextEngine, ContextEngineConfig
from ctxcore.errors import ConfigError
from ctxcore.eval.baselines import LosslessPolicy, MaskPolicy, StepsPolicy, TruncatePolicy
from ctxcore.eval.policy_base import (
    EMBEDDED_TRIGGER_RATIO,
    CountingModel,
    Policy,
    PolicySetup,
    PolicyWindow,
    conversation_key,
)
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage
from ctxcore.pipeline.fitting import CallLimits
from ctxcore.pipeline.sizing import unservable_tokens
from ctxcore.processors.chain import apply_rules, build_rule_chain, default_rule_chain
from ctxcore.processors.current_round import CurrentRoundCompressor
from ctxcore.processors.dialogue import DialogueCompressor
from ctxcore.processors.recall_tool import (
    DEFAULT_RECALL_TOKENS,
    RECALL_TOOL_NAME,
    recall_answer_text,
    recall_tool_definition,
)
from ctxcore.processors.round_level import RoundLevelCompressor
from ctxcore.recall.archive import ChunkingConfig, recall
from ctxcore.recall.auto import AutoRecall
from ctxcore.recall.cache import IndexCache
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.state.budget import BudgetTokens, conversation_budget, result_cap_tokens, trigger_tokens
from ctxcore.state.memory import MemoryMessageLog, MemoryOffloadStore, MemoryStateStore

__all__ = [
    "POLICIES",
    "CountingModel",
    "Policy",
    "PolicySetup",
    "PolicyWindow",
    "make_policy",
]

MAX_STAGES = 32


def _rule_fn(setup: PolicySetup, key: ConversationKey, offloads: MemoryOffloadStore) -> RuleFn | None:
    # As ``ContextService`` builds it from ``engine.rule_chain`` and ``engine.max_result_ratio``.
    engine = setup.settings.engine
    if engine.rule_chain == "none":
        return None
    chain = build_rule_chain(default_rule_chain(setup.budget, max_result_ratio=engine.max_result_ratio))

    def rules(messages: Sequence[AnyMessage], tail_budget_tokens: int | None, chunk: int) -> list[AnyMessage]:
        return apply_rules(
            messages,
            chain,
            setup.counter,
            offloads,
            key,
            budget_tokens=setup.budget,
            detector=setup.detector,
            tail_budget_tokens=tail_budget_tokens,
            chunk_tokens=chunk,
        )

    return rules


class RulesPolicy(Policy):
    """The default rule chain over the whole log, served by ``assemble_window``."""

    name = "rules"

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        self.key = conversation_key(setup.conversation_id)
        self.log = MemoryMessageLog()
        self.rules = _rule_fn(setup, self.key, MemoryOffloadStore())

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Log the messages."""
        self.log.append(self.key, list(messages))

    def window(self) -> PolicyWindow:
        """Rules on the whole log; the fallback shapes what still does not fit."""
        s = self.setup
        result = assemble_window(
            CompressionState(),
            self.log.read_after(self.key, None),
            s.budget,
            list(s.system),
            list(s.tools),
            self.rules,
            s.counter,
            detector=s.detector,
        )
        return PolicyWindow(result.messages, list(s.tools), fallback=result.fallback_applied)


class FullPolicy(Policy):
    """The service: rules on the tail of every window, pipeline stages when over trigger."""

    name = "full"

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        self.key = conversation_key(setup.conversation_id)
        self.log = MemoryMessageLog()
        self.states = MemoryStateStore()
        self.rules = _rule_fn(setup, self.key, MemoryOffloadStore())
        self.coordinator = Coordinator(
            self.states,
            self.log,
            setup.counter,
            lambda _key: setup.model,
            trigger_ratio=setup.trigger_ratio,
            target_ratio=setup.target_ratio,
            default_budget=setup.budget,
            keep_recent_messages=setup.keep_recent_messages,
            detector=setup.detector,
            max_result_ratio=setup.settings.engine.result_cap_ratio,
            call_limits_for=lambda _key: CallLimits.of(setup.settings.model),
        )
        # The window at which the pending compaction was asked for (``setup.lag`` > 0).
        self.windows = 0
        self.pending: int | None = None

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """Log the messages (as ``ContextService.append`` does after validation)."""
        self.log.append(self.key, list(messages))

    def compact(self) -> tuple[list[str], list[str]]:
        """Run stages until the view is within target or no stage helps, as the workers do.

        Returns the stages that changed the state and the failures (``kind: error``).
        """
        coord = self.coordinator
        exhausted: list[str] = []
        done: list[str] = []
        failures: list[str] = []
        for _ in range(MAX_STAGES):
            stage = coord.plan(self.key, exhausted=exhausted)
            if stage is None:
                break
            result = coord.run_stage(self.key, stage)
            if result.outcome == "compressed":
                done.append(stage.kind)
            elif result.outcome == "conflict":
                continue
            else:
                if result.outcome in ("failed", "rejected"):
                    failures.append(f"{stage.kind}: {result.error_kind}: {result.error}")
                exhausted.append(stage.kind)
        return done, failures

    def maybe_compact(
        self, tools: Sequence[Mapping[str, Any]], room: BudgetTokens
    ) -> tuple[list[str], list[str]]:
        """Record the conversation's budget (``room``, as ``ContextService.get_window`` does);
        land a pending compaction that is due, and ask for one when the view is over the
        trigger (landing at once without lag, ``setup.lag`` windows later with it: the windows
        between are served from the state as it is, as the fast path serves them while a
        worker lags). One job at a time, as the scheduler coalesces."""
        s = self.setup
        self.windows += 1
        self.states.set_budget(self.key, room)
        if self.pending is not None:
            if self.windows - self.pending < s.lag:
                return [], []
            self.pending = None
            return self.compact()
        view = self.coordinator.view(self.key, system=list(s.system), tools=[dict(t) for t in tools])
        # As the service's trigger counts it: a result no window could serve whole at the cap.
        cap = result_cap_tokens(room, self.coordinator.max_result_ratio)
        due = view.tokens(s.counter) - unservable_tokens(view.tail, room, cap, s.counter)
        if due <= trigger_tokens(s.budget, room, s.trigger_ratio):
            return [], []
        if s.lag == 0:
            return self.compact()
        self.pending = self.windows
        return [], []

    def served_tools(self) -> list[dict[str, Any]]:
        """The tools each window carries (and counts)."""
        return [dict(t) for t in self.setup.tools]

    def auto_recall(self, state: CompressionState) -> AutoRecall | None:
        """What auto-recall searches in ``state``'s archive (None: recall is off)."""
        return None

    def window(self) -> PolicyWindow:
        """Compact when due (``maybe_compact``), then serve."""
        s = self.setup
        tools = self.served_tools()
        room = conversation_budget(s.budget, s.system, tools, s.counter)
        stages, failures = self.maybe_compact(tools, room)
        state = self.states.load(self.key) or CompressionState()
        pinned = [m for m in (self.log.get(self.key, i) for i in state.pinned) if m is not None]
        result = assemble_window(
            state,
            self.log.read_after(self.key, state.covered_until),
            s.budget,
            list(s.system),
            tools,
            self.rules,
            s.counter,
            pinned=pinned,
            detector=s.detector,
            rule_chunk_tokens=s.settings.service.chunk_tokens(room),
            auto_recall=self.auto_recall(state),
        )
        return PolicyWindow(
            result.messages, list(tools), result.fallback_applied, stages, failures, recall=result.recall
        )


class FullRecallPolicy(FullPolicy):
    """``full`` with recall on: stages archive what they fold, windows carry the recall tool
    and spend their leftover room on archived passages near the intent (auto-recall)."""

    name = "full+recall"
    offers_recall = True

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        recall = setup.settings.recall
        chunking = ChunkingConfig(
            recall.chunk_size_tokens, recall.chunk_overlap_tokens, recall.auto_passage_tokens
        )
        self.coordinator.recall_for = lambda _key: chunking
        self.indexes = IndexCache(size=4)

    def served_tools(self) -> list[dict[str, Any]]:
        """``full``'s tools and the recall tool."""
        return [*super().served_tools(), recall_tool_definition()]

    def auto_recall(self, state: CompressionState) -> AutoRecall | None:
        """Auto-recall over the state's archive, once there is one."""
        index = self.indexes.get(self.key, state.archive_version, lambda: self.states.load_archive(self.key))
        return AutoRecall(index, self.setup.settings.recall.auto_max_ratio) if index is not None else None

    def tool_recall(self, question: str) -> list[AnyMessage]:
        """The agent's call of ``recall_compressed_context`` with ``question`` and its result."""
        state = self.states.load(self.key) or CompressionState()
        index = self.indexes.get(self.key, state.archive_version, lambda: self.states.load_archive(self.key))
        answer = recall(index, question, DEFAULT_RECALL_TOKENS, self.setup.counter)
        call = ToolCall(id="eval-recall", name=RECALL_TOOL_NAME, arguments=json.dumps({"query": question}))
        return [
            AssistantMessage(content="", tool_calls=[call]),
            ToolMessage(tool_call_id=call.id, content=recall_answer_text(answer)),
        ]


class EnginePolicy(Policy):
    """One embedded LLM compressor in a ``ContextEngine`` context (no rule chain)."""

    processor: ClassVar[str] = ""

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        self.engine = ContextEngine(
            ContextEngineConfig(
                context_window_tokens=setup.budget,
                internal_user_prefixes=tuple(setup.detector.extra_prefixes),
                internal_user_patterns=tuple(setup.detector.patterns),
                harness_structure=setup.detector.harness_structure,
            )
        )
        self.context = self.engine.create_context(
            conversation_key(setup.conversation_id).conversation_id,
            processors=[(self.processor, self.processor_config())],
            token_counter=setup.counter,
        )

    def processor_config(self) -> dict[str, Any]:
        """The processor's config: the shared trigger, the summariser and its context."""
        return {
            "trigger_context_ratio": EMBEDDED_TRIGGER_RATIO,
            "model_client": self.setup.model,
            "model_context_window_tokens": self.setup.settings.model.context_window_tokens,
        }

    def append(self, messages: Sequence[AnyMessage]) -> None:
        """``ModelContext.add_messages``."""
        self.context.add_messages(list(messages))

    def window(self) -> PolicyWindow:
        """``ModelContext.get_context_window`` with the conversation's system messages and tools."""
        s = self.setup
        window = self.context.get_context_window(system_messages=list(s.system), tools=list(s.tools))
        failures = [f"{f.processor}: {f.error!r}" for f in self.context.last_failures]
        return PolicyWindow(window.get_messages(), list(window.get_tools()), failures=failures)


class RoundLevelPolicy(EnginePolicy):
    """``RoundLevelCompressor`` with the service's trigger, target and keep-recent."""

    name = "round_level"
    processor = RoundLevelCompressor.__name__

    def processor_config(self) -> dict[str, Any]:
        """Target 0.75 of the budget, keep the same recent messages as the service."""
        return {
            **super().processor_config(),
            "target_total_tokens": max(int(self.setup.budget * self.setup.target_ratio), 1),
            "keep_recent_messages": self.setup.keep_recent_messages,
        }


class CurrentRoundPolicy(EnginePolicy):
    """``CurrentRoundCompressor``: the work since the latest request becomes a snapshot."""

    name = "current_round"
    processor = CurrentRoundCompressor.__name__


class DialoguePolicy(EnginePolicy):
    """``DialogueCompressor``: the history between the anchors becomes a snapshot."""

    name = "dialogue"
    processor = DialogueCompressor.__name__


POLICIES: dict[str, type[Policy]] = {
    p.name: p
    for p in (
        TruncatePolicy,
        StepsPolicy,
        MaskPolicy,
        LosslessPolicy,
        RulesPolicy,
        CurrentRoundPolicy,
        DialoguePolicy,
        RoundLevelPolicy,
        FullPolicy,
        FullRecallPolicy,
    )
}


def make_policy(name: str, setup: PolicySetup) -> Policy:
    """The policy called ``name`` (see ``POLICIES``)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choices: {', '.join(POLICIES)}") from None
    return factory(setup)
