"""``HookRunner``: runs a context's processors over it: add, window, active compression.

The three operations of spec 3.3-3.5 (``ModelContext`` has a runner and calls it). Every
operation runs its processors under the context's processor lock (the store's), so two
hooks of a context never overlap; failures are collected per operation (``failures``) and
re-raised only with ``strict_processors``. The processors see the context through
``processors.base.ProcessorContext``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

from ctxcore.assemble import fit_to_budget
from ctxcore.counting import tolerant
from ctxcore.engine.config import ContextEngineConfig
from ctxcore.engine.store import ContextStore, logger
from ctxcore.errors import BudgetExceeded, ConfigError, InvalidMessageError
from ctxcore.messages import AnyMessage, SystemMessage, messages_to_json
from ctxcore.pipeline import View, block_provenance
from ctxcore.pipeline.view import with_sortable_ids
from ctxcore.processors.base import ContextProcessor, ProcessorContext
from ctxcore.processors.events import ContextEvent, Phase, ProcessorFailure, StateReporter, Subscriber
from ctxcore.processors.recall_tool import RECALL_TOOL_NAME, recall_tool_definition
from ctxcore.processors.reload_tool import RELOAD_TOOL_NAME, reload_tool_definition
from ctxcore.processors.rules import id_ranges
from ctxcore.processors.runner import CANCELLATION, OperationReporter
from ctxcore.recall.auto import recall_position, recall_query
from ctxcore.turns import anchors
from ctxcore.window import ContextWindow, apply_window_limits, compute_stats
from ctxcore.window_repair import served_context

__all__ = ["CompressResult", "HookRunner"]

CompressResult = Literal["compressed", "noop", "busy"]


class HookRunner:
    """Runs the processors of one context (``ctx``, whose log and view are ``store``).

    Attributes:
        states: the context's compression-state events and their subscribers.
        failures: processor failures of the most recent operation.
    """

    def __init__(
        self,
        ctx: ProcessorContext,
        store: ContextStore,
        processors: list[tuple[str, ContextProcessor[Any]]],
        config: ContextEngineConfig,
        subscribers: list[Subscriber],
        context_id: str,
    ) -> None:
        self._ctx = ctx
        self._store = store
        self._processors = processors
        self._config = config
        self.states = StateReporter(subscribers)
        self._ops = OperationReporter(
            self.states, tolerant(ctx.token_counter), ctx.context_max, context_id, ctx.detector
        )
        self.failures: list[ProcessorFailure] = []

    @contextmanager
    def _operation(self) -> Iterator[None]:
        """One operation: under the processor lock, its failures collected afresh and, with
        ``strict_processors``, the first re-raised once the lock is released."""
        with self._store.locked():
            self._ops.failures = self.failures = []
            yield
        if self._config.strict_processors and self.failures:
            raise self.failures[0].error

    def _triggered(self, name: str, phase: Phase, trigger: Callable[[], bool]) -> bool:
        """Whether a processor's trigger fires; a trigger that raises is a failure of the
        operation (logged), and the processor is skipped."""
        try:
            return trigger()
        except CANCELLATION:
            raise
        except Exception as exc:
            self.failures.append(ProcessorFailure(name, phase, exc))
            logger.warning("%s trigger of processor %s failed", phase, name, exc_info=True)
            return False

    def add(self, batch: list[AnyMessage]) -> None:
        """Run the add hooks over a logged batch and append the result to the view (see
        ``ModelContext.add_messages``); deferred while an active compression runs."""
        if self._store.defer(batch):
            return
        with self._operation():
            pending = batch
            try:
                for name, processor in self._processors:
                    pending = self._run_add(name, processor, pending)
            finally:
                # Also on cancellation: the view must not lose messages the log has.
                self._store.extend_view(pending)

    def _run_add(
        self, name: str, processor: ContextProcessor[Any], batch: list[AnyMessage]
    ) -> list[AnyMessage]:
        kwargs: dict[str, Any] = {"force": False, "phase": "add_messages"}
        trigger = partial(processor.trigger_add_messages, self._ctx, batch, **kwargs)
        if not self._triggered(name, "add_messages", trigger):
            return batch

        def after(out: list[AnyMessage]) -> list[AnyMessage]:
            return [*self._store.messages(), *out]

        outcome = self._ops.run(
            name,
            "add_messages",
            "passive",
            [*self._store.messages(), *batch],
            partial(processor.on_add_messages, self._ctx, batch, **kwargs),
            after,
            model=processor.model_name(),
        )
        return outcome[1] if outcome is not None else batch

    def window(
        self,
        system_messages: Sequence[AnyMessage] | None,
        tools: Sequence[Mapping[str, Any]] | None,
        window_size: int | None,
        dialogue_round: int | None,
        kwargs: Mapping[str, Any],
    ) -> ContextWindow:
        """The window to send (see ``ModelContext.get_context_window``)."""
        for name, value in (("window_size", window_size), ("dialogue_round", dialogue_round)):
            if value is not None and value <= 0:
                raise ConfigError(f"get_context_window: {name} must be > 0, got {value}")
        system = list(system_messages or [])
        for i, message in enumerate(system):
            if not isinstance(message, SystemMessage):
                raise InvalidMessageError(i, "system_messages", "expected SystemMessage objects")
        size = window_size if window_size is not None else self._config.default_window_message_num
        rounds = dialogue_round if dialogue_round is not None else self._config.default_window_round_num
        with self._operation():
            system, context = apply_window_limits(
                system,
                self._store.messages(),
                dialogue_round=rounds,
                window_size=size,
                detector=self._ctx.detector,
            )
            window = ContextWindow(
                system_messages=system, context_messages=context, tools=[dict(t) for t in tools or []]
            )
            # ctxcore's own tool goes in before the processors, so every budget counts it.
            names = {t.get("function", {}).get("name") for t in window.tools}
            if self._config.enable_reload and RELOAD_TOOL_NAME not in names:
                window.tools.append(reload_tool_definition())
            if self._ctx.archive is not None and RECALL_TOOL_NAME not in names:
                window.tools.append(recall_tool_definition())
            for name, processor in self._processors:
                window = self._run_window(name, processor, window, kwargs)
            window.context_messages = served_context(window.context_messages, self._ctx.key)
            if any(p.guarantees_budget() for _, p in self._processors):
                window.context_messages = self._fit(window)
            if self._ctx.archive is not None and self._config.compression_recall_config.auto:
                window.context_messages = self._with_recall(window)
            window.statistic = compute_stats(
                window.system_messages,
                window.context_messages,
                window.tools,
                self._ctx.token_counter,
                self._ctx.detector,
            )
            self._store.last_window_access = self._ctx.clock()
        return window

    def _fit(self, window: ContextWindow) -> list[AnyMessage]:
        """The window's context messages within ``context_max`` (ctxcore's budget guarantee:
        served only, never stored); ``BudgetExceeded`` if system, tools and anchors alone
        do not fit.

        Every context message counts as tail here, memory blocks included: oldest content
        goes first, so a snapshot block after older raw steps outlives them.
        """
        counter = self._ctx.token_counter
        budget = self._ctx.context_max
        context = window.context_messages
        tools_tokens = counter.count_tools(window.tools)
        if counter.count_messages([*window.system_messages, *context]) + tools_tokens <= budget:
            return context
        # The fallback addresses messages by log id: messages written by processors get a
        # temporary one that sorts in place, removed again afterwards.
        ided = with_sortable_ids(context)
        temporary = {
            m.context_message_id for m, o in zip(ided, context, strict=True) if o.context_message_id is None
        }
        view = View(
            version=0,
            system=tuple(window.system_messages),
            tools=tuple(window.tools),
            tail=tuple(ided),
            detector=self._ctx.detector,
        )
        anchor_ids = view.anchor_id_set()
        anchor_msgs = [m for m in ided if m.context_message_id in anchor_ids]
        if counter.count_messages([*window.system_messages, *anchor_msgs]) + tools_tokens > budget:
            raise BudgetExceeded(
                budget,
                counter.count_messages(window.system_messages),
                tools_tokens,
                counter.count_messages(anchor_msgs),
            )
        fitted, _ = fit_to_budget(view, budget, counter, anchor_ids=anchor_ids)
        served = fitted.context_messages()
        # What the fallback left out or cut, as log-id ranges in a state event: recoverable
        # from the log like any other processor's removals.
        kept = {(m.context_message_id, messages_to_json([m])) for m in served}
        lost = [i for i, m in enumerate(ided) if (m.context_message_id, messages_to_json([m])) not in kept]
        self._ops.emit(
            "completed",
            "get_context_window",
            "budget_fallback",
            "budget",
            event=ContextEvent(
                event_type="budget_fallback",
                messages_to_modify=lost,
                removed_ranges=list(id_ranges(context, lost)),
            ),
        )
        return [
            m.model_copy(update={"context_message_id": None}) if m.context_message_id in temporary else m
            for m in served
        ]

    def _with_recall(self, window: ContextWindow) -> list[AnyMessage]:
        """Auto-recall (served only): archived passages near the intent in the room left, at
        the end of the window (``recall_position``); nothing when no block is in the window."""
        context = window.context_messages
        blocks = max((i + 1 for i, m in enumerate(context) if block_provenance(m) is not None), default=0)
        if self._ctx.archive is None or blocks == 0:
            return context
        counter = self._ctx.token_counter
        used = counter.count_messages([*window.system_messages, *context]) + counter.count_tools(window.tools)
        found = anchors(context, self._ctx.detector)
        intent = context[found.intent] if found.intent is not None else None
        held = frozenset(m.context_message_id for m in context if m.context_message_id)
        recall_config = self._config.compression_recall_config
        message, _ = self._ctx.archive.recalled(
            recall_query(intent, context[blocks:], counter),
            self._ctx.context_max - used,
            held,
            recall_config.auto_max_ratio,
            self._ctx.context_max,
        )
        at = recall_position(context)
        return context if message is None else [*context[:at], message, *context[at:]]

    def _run_window(
        self, name: str, processor: ContextProcessor[Any], window: ContextWindow, extra: Mapping[str, Any]
    ) -> ContextWindow:
        kwargs: dict[str, Any] = {**extra, "force": False, "phase": "get_context_window"}
        trigger = partial(processor.trigger_get_context_window, self._ctx, window, **kwargs)
        if not self._triggered(name, "get_context_window", trigger):
            return window
        outcome = self._ops.run(
            name,
            "get_context_window",
            "passive",
            window.get_messages(),
            partial(processor.on_get_context_window, self._ctx, window, **kwargs),
            ContextWindow.get_messages,
            model=processor.model_name(),
        )
        return outcome[1] if outcome is not None else window

    # --- active compression --------------------------------------------------------------

    def compress(
        self, processor_types: Sequence[str] | None, trigger: str, preserve_instruction: str | None
    ) -> CompressResult:
        """Run offloaders, then compressors, over the whole view now (see
        ``ModelContext.compress_context``)."""
        if not self._store.processor_lock.acquire(blocking=False):
            self._ops.emit("skipped", "active_compress", "", trigger, reason="busy")
            return "busy"
        try:
            with self._store.compressing():
                self._ops.failures = self.failures = []
                result = self._compress(processor_types, trigger, preserve_instruction)
        finally:
            self._store.processor_lock.release()
        if self._config.strict_processors and self.failures:
            raise self.failures[0].error
        return result

    def _compress(
        self, processor_types: Sequence[str] | None, trigger: str, preserve_instruction: str | None
    ) -> CompressResult:
        allowed = set(processor_types) if processor_types is not None else None
        selected = [
            (name, p)
            for kind in ("offloader", "compressor")
            for name, p in self._processors
            if p.kind == kind and (allowed is None or name in allowed or p.processor_type() in allowed)
        ]
        if not selected:
            self._ops.emit("skipped", "active_compress", "", trigger, reason="no_matching_processor")
            return "noop"
        kwargs: dict[str, Any] = {
            "force": True,
            "phase": "active_compress",
            "compression_trigger": trigger,
            "preserve_instruction": preserve_instruction,
        }
        changed = False
        for name, processor in selected:
            view = self._store.messages()
            outcome = self._ops.run(
                name,
                "active_compress",
                trigger,
                view,
                partial(processor.on_compress, self._ctx, view, **kwargs),
                list,
                model=processor.model_name(),
            )
            if outcome is not None and outcome[0] is not None:
                self._ctx.set_messages(outcome[1])
                changed = True
        return "compressed" if changed else "noop"
