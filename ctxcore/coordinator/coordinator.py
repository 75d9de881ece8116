"""``Coordinator``: loads a conversation's state, plans and runs one stage, saves with CAS.

The package docstring (``ctxcore.coordinator``) says which outcomes a call can have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ctxcore.coordinator.results import CoordinatorResult, TriggerInput, failed_result
from ctxcore.coordinator.saving import save_result
from ctxcore.counting import tolerant
from ctxcore.errors import ConfigError, CursorNotFoundError, ModelError
from ctxcore.messages import AnyMessage
from ctxcore.pipeline import PipelineConfig, Stage, StageResult, View, plan_next_stage, run_stage
from ctxcore.pipeline.fitted_client import FittedClient
from ctxcore.pipeline.fitting import CallLimits
from ctxcore.pipeline.sizing import ViewSizes, held_tokens, message_tokens, served_tokens
from ctxcore.pipeline.targets import build_targets, eligible_raw
from ctxcore.recall.archive import ChunkingConfig
from ctxcore.state import CompressionState, ConversationKey, MessageLog, StateStore
from ctxcore.state.budget import result_cap_tokens
from ctxcore.state.undecodable import is_undecodable, without_undecodable
from ctxcore.summarize.blocks import Summarizer
from ctxcore.summarize.model import ModelClient
from ctxcore.summarize.strategies import model as model_strategy
from ctxcore.tokens import TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector, turns

__all__ = ["DEFAULT_BUDGET", "Coordinator"]

DEFAULT_BUDGET = 128_000


class Coordinator:
    """Runs compaction stages for conversations and saves their state with CAS.

    ``model_for(key)`` resolves each tenant's model; each call builds its ``PipelineConfig``
    from the conversation's budget as the last window recorded it (``get_budget``: the room
    left beside the window's system messages and tools, which a view here never holds; else
    ``default_budget``) times ``target_ratio``.
    """

    def __init__(
        self,
        state_store: StateStore,
        log: MessageLog,
        counter: TokenCounter,
        model_for: Callable[[ConversationKey], ModelClient],
        summarizer: Summarizer | None = None,
        trigger: Callable[[TriggerInput], bool] | None = None,
        trigger_ratio: float = 1.0,
        target_ratio: float = 0.8,
        default_budget: int = DEFAULT_BUDGET,
        *,
        keep_recent_messages: int = 4,
        detector: UserDetector | None = None,
        max_result_ratio: float | None = None,
        recall_for: Callable[[ConversationKey], ChunkingConfig | None] | None = None,
        call_limits_for: Callable[[ConversationKey], CallLimits] | None = None,
    ) -> None:
        if not 0 < target_ratio <= trigger_ratio <= 1:
            raise ConfigError(
                f"Coordinator: need 0 < target_ratio ({target_ratio}) <= trigger_ratio ({trigger_ratio}) <= 1"
            )
        self.state_store = state_store
        self.log = log
        self.counter = tolerant(counter)
        self.model_for = model_for
        self.summarizer = summarizer
        self.trigger = trigger
        self.trigger_ratio = trigger_ratio
        self.target_ratio = target_ratio
        self.default_budget = default_budget
        self.keep_recent_messages = keep_recent_messages
        self.detector = detector or DEFAULT_DETECTOR
        # The served window's per-result cap (the default chain's ToolResultCap), as a share
        # of the budget; compaction does not make room for what the cap cuts anyway.
        self.max_result_ratio = max_result_ratio
        # Recall on for a conversation: what each stage folds is archived with its state.
        self.recall_for = recall_for
        # Each tenant's summariser context and output cap: its calls are fitted to them.
        self.call_limits_for = call_limits_for

    # --- reading ----------------------------------------------------------------------

    def budget(self, key: ConversationKey) -> int:
        """The conversation's budget: the last one a client asked for, else the default."""
        return self.state_store.get_budget(key) or self.default_budget

    def pipeline_config(self, key: ConversationKey, budget: int | None = None) -> PipelineConfig:
        """Pipeline targets for ``key`` derived from its budget."""
        b = budget or self.budget(key)
        cap = result_cap_tokens(b, self.max_result_ratio)
        limits = self.call_limits_for(key) if self.call_limits_for is not None else CallLimits()
        return PipelineConfig(
            target_tokens=max(int(b * self.target_ratio), 1),
            keep_recent_messages=self.keep_recent_messages,
            result_cap_tokens=cap,
            ceiling_tokens=b,
            context_window_tokens=limits.context_window_tokens,
            max_output_tokens=limits.max_output_tokens,
        )

    def load(self, key: ConversationKey) -> CompressionState:
        """The saved state, or an empty version-0 state."""
        return self.state_store.load(key) or CompressionState()

    def view(
        self,
        key: ConversationKey,
        state: CompressionState | None = None,
        *,
        system: Sequence[AnyMessage] = (),
        tools: Sequence[dict[str, object]] = (),
    ) -> View:
        """The view of ``state`` (loaded when None): its blocks, pinned anchors and the log after the cursor."""
        state = state if state is not None else self.load(key)
        if state.covered_until is not None and self.log.get(key, state.covered_until) is None:
            raise CursorNotFoundError(
                f"{key}: the compaction cursor {state.covered_until!r} is not in the log; inspect the state "
                "history and roll back, or delete the conversation"
            )
        pinned = []
        for log_id in state.pinned:
            message = self.log.get(key, log_id)
            if message is None:
                raise CursorNotFoundError(f"{key}: pinned message {log_id!r} is missing from the log")
            if not is_undecodable(message):
                pinned.append(message)
        # An entry that no longer decodes (and the results answering it) is left out: a
        # block folding its range covers it, as it covers everything in its range.
        tail, _ = without_undecodable(self.log.read_after(key, state.covered_until))
        return View.from_state(state, tail, pinned, system=system, tools=tools, detector=self.detector)

    def plan(self, key: ConversationKey, *, exhausted: Sequence[str] = ()) -> Stage | None:
        """The next stage for ``key``, or None when it is within target."""
        view = self.view(key)
        return plan_next_stage(view, self.pipeline_config(key), self.counter, exhausted=exhausted)

    def sizes(self, key: ConversationKey) -> ViewSizes:
        """The view of ``key`` against its target (what ends a job that could not reach it)."""
        state = self.load(key)
        view = self.view(key, state)
        budget = self.budget(key)
        config = self.pipeline_config(key, budget)
        last = view.tail[-1].context_message_id if view.tail else state.covered_until
        return ViewSizes(
            view_tokens=served_tokens(view, config, self.counter),
            target_tokens=config.target_tokens,
            budget_tokens=budget,
            held_tokens=held_tokens(view, config, self.counter),
            last_id=last,
        )

    # --- writing ----------------------------------------------------------------------

    def run_stage(self, key: ConversationKey, stage: Stage) -> CoordinatorResult:
        """Run one planned stage and save its result with compare-and-swap."""
        state = self.load(key)
        if state.version != stage.based_on_version:
            view = self.view(key, state)
            return CoordinatorResult(
                view,
                state,
                "conflict",
                detail=f"state is at version {state.version}, stage was planned on {stage.based_on_version}",
            )
        view = self.view(key, state)
        config = self.pipeline_config(key)
        before = view.tokens(self.counter)
        try:
            result = run_stage(stage, view, self.model_for(key), self.counter, self.summarizer, config=config)
        except ModelError as exc:
            return failed_result(view, state, stage, exc, before)
        return self._save(key, view, state, stage, result)

    def compress(self, key: ConversationKey) -> CoordinatorResult:
        """The incremental API: summarise the pending whole steps after the cursor into new L1 blocks.

        Runs only when there are pending steps and the trigger says so (default: the view is
        over ``trigger_ratio`` of the budget). The summarizer (default: ``model`` on
        ``model_for(key)``) sees earlier blocks as context and makes one block per run of
        steps between anchors (of half the summariser's context at most, with one); anchors
        stay pinned. The default summarizer's calls fit that context (``FittedClient``).
        """
        state = self.load(key)
        view = self.view(key, state)
        budget = self.budget(key)
        pending = eligible_raw(view, self.keep_recent_messages)
        window = view.tokens(self.counter)
        if not pending:
            return CoordinatorResult(
                view, state, "skipped", detail="nothing pending", tokens_before=window, tokens_after=window
            )
        inp = TriggerInput(
            pending_messages=pending,
            blocks=list(state.blocks),
            estimated_pending_tokens=message_tokens(self.counter, pending),
            pending_turn_count=len(turns(pending, self.detector)),
            state=state,
            window_tokens=window,
            budget_tokens=budget,
        )
        triggered = (
            self.trigger(inp) if self.trigger is not None else window >= int(budget * self.trigger_ratio)
        )
        if not triggered:
            return CoordinatorResult(
                view, state, "skipped", detail="trigger not met", tokens_before=window, tokens_after=window
            )
        limits = self.call_limits_for(key) if self.call_limits_for is not None else CallLimits()
        window_limit = limits.context_window_tokens
        # Half the context: the rest holds the instruction, earlier summaries and the output;
        # a long run is split across calls rather than trimmed to its head and tail.
        config = PipelineConfig(
            target_tokens=max(int(budget * self.target_ratio), 1),
            keep_recent_messages=self.keep_recent_messages,
            l1_source_tokens=10**12 if window_limit is None else max(window_limit // 2, 1),
            summarise_all_pending=True,
            context_window_tokens=window_limit,
            max_output_tokens=limits.max_output_tokens,
        )
        targets = build_targets("l0_to_l1", view, config, self.counter)
        raw_ids = [m.context_message_id for t in targets for m in t.raw if m.context_message_id]
        if not raw_ids:
            return CoordinatorResult(
                view,
                state,
                "skipped",
                detail="only anchors pending",
                tokens_before=window,
                tokens_after=window,
            )
        stage = Stage(
            kind="l0_to_l1",
            based_on_version=state.version,
            target_tokens=config.target_tokens,
            first_id=min(raw_ids),
            last_id=max(raw_ids),
        )
        summarizer = self.summarizer or model_strategy(
            FittedClient(self.model_for(key), limits, self.counter, "l0_to_l1")
        )
        try:
            result = run_stage(stage, view, None, self.counter, summarizer, config=config)
        except ModelError as exc:
            return failed_result(view, state, stage, exc, window)
        return self._save(key, view, state, stage, result)

    def _save(
        self, key: ConversationKey, view: View, state: CompressionState, stage: Stage, result: StageResult
    ) -> CoordinatorResult:
        chunking = self.recall_for(key) if self.recall_for is not None else None
        return save_result(self.state_store, key, view, state, stage, result, chunking, self.counter)
