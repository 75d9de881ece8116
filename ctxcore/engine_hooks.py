"""Running processor hooks over a context: add, window, active compression, overflow recovery.

``ContextHooks`` extends ``ContextCore`` with the three operations of spec 3.3-3.5. Every
operation runs its processors under the context's processor lock, so two hooks of a
context never overlap; failures are collected per operation (``last_failures``) and
re-raised only with ``strict_processors``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal

from ctxcore.assemble import fit_to_budget
from ctxcore.engine_core import ContextCore, check_messages
from ctxcore.errors import BudgetExceeded, ConfigError, InvalidMessageError
from ctxcore.messages import AnyMessage, SystemMessage, messages_to_json
from ctxcore.pipeline import View, block_provenance
from ctxcore.processors.base import ContextProcessor
from ctxcore.processors.events import ContextEvent, ProcessorFailure
from ctxcore.processors.recall_tool import RECALL_TOOL_NAME, recall_tool_definition
from ctxcore.processors.reload_tool import RELOAD_TOOL_NAME, reload_tool_definition
from ctxcore.processors.rules import id_ranges
from ctxcore.processors.runner import CANCELLATION
from ctxcore.recall.auto import recall_query
from ctxcore.summarize.errors import is_context_overflow_error
from ctxcore.turns import anchors
from ctxcore.window import ContextWindow, apply_window_limits, compute_stats
from ctxcore.window_repair import served_context

__all__ = ["CompressResult", "ContextHooks"]

# Named after the public module: logging configured for ``ctxcore.engine`` keeps working.
logger = logging.getLogger("ctxcore.engine")

CompressResult = Literal["compressed", "noop", "busy"]


class ContextHooks(ContextCore):
    """``ContextCore`` plus the operations that run processors (see ``ModelContext``)."""

    def add_messages(self, messages: AnyMessage | Sequence[AnyMessage]) -> list[str]:
        """Log ``messages``, run the add hooks over them, append the result to the view.

        Returns the log ids assigned. System messages are rejected: they are sent with each
        window request, never stored. While an active compression runs, the messages are
        logged at once and join the view unprocessed when it finishes (spec 3.3 step 2).
        """
        batch = self._append_to_log(check_messages(messages))
        ids = [str(m.context_message_id) for m in batch]
        if not batch:
            return ids
        with self._data_lock:
            if self._compressing:
                self._deferred.extend(batch)
                return ids
        with self._locked():
            self._start_operation()
            pending = batch
            try:
                for name, processor in self.processors:
                    pending = self._run_add(name, processor, pending)
            finally:
                # Also on cancellation: the view must not lose messages the log has.
                with self._data_lock:
                    self._view.extend(pending)
                    limit = self.config.max_context_message_num
                    if limit is not None and len(self._view) > 2 * limit:
                        self._view = self._limit(self._view)
        self._raise_if_strict()
        return ids

    def _run_add(
        self, name: str, processor: ContextProcessor[Any], batch: list[AnyMessage]
    ) -> list[AnyMessage]:
        kwargs: dict[str, Any] = {"force": False, "phase": "add_messages"}
        try:
            triggered = processor.trigger_add_messages(self, batch, **kwargs)
        except CANCELLATION:
            raise
        except Exception as exc:
            self._ops.failures.append(ProcessorFailure(name, "add_messages", exc))
            logger.warning("trigger of processor %s failed", name, exc_info=True)
            return batch
        if not triggered:
            return batch

        def after(out: list[AnyMessage]) -> list[AnyMessage]:
            return [*self.get_messages(), *out]

        outcome = self._ops.run(
            name,
            "add_messages",
            "passive",
            [*self.get_messages(), *batch],
            partial(processor.on_add_messages, self, batch, **kwargs),
            after,
            model=processor.model_name(),
        )
        return outcome[1] if outcome is not None else batch

    def get_context_window(
        self,
        system_messages: Sequence[AnyMessage] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        window_size: int | None = None,
        dialogue_round: int | None = None,
        **kwargs: Any,
    ) -> ContextWindow:
        """The window to send: windowing, window hooks, protocol repairs, statistics.

        ``window_size`` (counting system messages) and ``dialogue_round`` override the
        config defaults; deviation from spec 2.4: neither ever drops an anchor. The repairs
        touch the served window only: tool and assistant messages before the first user
        message are dropped and interrupted tool calls answered (``served_context``); a
        window still breaking the protocol raises ``InvalidWindowError``.
        """
        for name, value in (("window_size", window_size), ("dialogue_round", dialogue_round)):
            if value is not None and value <= 0:
                raise ConfigError(f"get_context_window: {name} must be > 0, got {value}")
        system = list(system_messages or [])
        for i, message in enumerate(system):
            if not isinstance(message, SystemMessage):
                raise InvalidMessageError(i, "system_messages", "expected SystemMessage objects")
        size = window_size if window_size is not None else self.config.default_window_message_num
        rounds = dialogue_round if dialogue_round is not None else self.config.default_window_round_num
        with self._locked():
            self._start_operation()
            system, context = apply_window_limits(
                system, self.get_messages(), dialogue_round=rounds, window_size=size, detector=self.detector
            )
            window = ContextWindow(
                system_messages=system, context_messages=context, tools=[dict(t) for t in tools or []]
            )
            # ctxcore's own tool goes in before the processors, so every budget counts it.
            names = {t.get("function", {}).get("name") for t in window.tools}
            if self.config.enable_reload and RELOAD_TOOL_NAME not in names:
                window.tools.append(reload_tool_definition())
            if self.archive is not None and RECALL_TOOL_NAME not in names:
                window.tools.append(recall_tool_definition())
            for name, processor in self.processors:
                window = self._run_window(name, processor, window, kwargs)
            window.context_messages = served_context(window.context_messages, self.key)
            if any(p.guarantees_budget() for _, p in self.processors):
                window.context_messages = self._fit(window)
            if self.archive is not None and self.config.compression_recall_config.auto:
                window.context_messages = self._with_recall(window)
            window.statistic = compute_stats(
                window.system_messages,
                window.context_messages,
                window.tools,
                self.token_counter,
                self.detector,
            )
            self.last_window_access = self.clock()
        self._raise_if_strict()
        return window

    def _fit(self, window: ContextWindow) -> list[AnyMessage]:
        """The window's context messages within ``context_max`` (ctxcore's budget guarantee:
        served only, never stored); ``BudgetExceeded`` if system, tools and anchors alone
        do not fit.

        Every context message counts as tail here, memory blocks included: oldest content
        goes first, so a snapshot block after older raw steps outlives them.
        """
        counter = self.token_counter
        budget = self.context_max
        context = window.context_messages
        tools_tokens = counter.count_tools(window.tools)
        if counter.count_messages([*window.system_messages, *context]) + tools_tokens <= budget:
            return context
        # The fallback addresses messages by log id: messages written by processors get a
        # temporary one that sorts in place, removed again afterwards.
        ided: list[AnyMessage] = []
        previous, suffix, temporary = "", 0, set()
        for message in context:
            if message.context_message_id is None:
                suffix += 1
                message = message.model_copy(update={"context_message_id": f"{previous}~{suffix:04d}"})
                temporary.add(message.context_message_id)
            else:
                previous, suffix = message.context_message_id, 0
            ided.append(message)
        view = View(
            version=0,
            system=tuple(window.system_messages),
            tools=tuple(window.tools),
            tail=tuple(ided),
            detector=self.detector,
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
        """Auto-recall (served only): archived passages near the intent in the room left,
        right after the last summary block; nothing when no block is in the window."""
        context = window.context_messages
        at = max((i + 1 for i, m in enumerate(context) if block_provenance(m) is not None), default=0)
        if self.archive is None or at == 0:
            return context
        counter = self.token_counter
        used = counter.count_messages([*window.system_messages, *context]) + counter.count_tools(window.tools)
        found = anchors(context, self.detector)
        intent = context[found.intent] if found.intent is not None else None
        held = frozenset(m.context_message_id for m in context if m.context_message_id)
        recall_config = self.config.compression_recall_config
        message, _ = self.archive.recalled(
            recall_query(intent, context[at:], counter),
            self.context_max - used,
            held,
            recall_config.auto_max_ratio,
            self.context_max,
        )
        return context if message is None else [*context[:at], message, *context[at:]]

    def _run_window(
        self, name: str, processor: ContextProcessor[Any], window: ContextWindow, extra: Mapping[str, Any]
    ) -> ContextWindow:
        kwargs: dict[str, Any] = {**extra, "force": False, "phase": "get_context_window"}
        try:
            triggered = processor.trigger_get_context_window(self, window, **kwargs)
        except CANCELLATION:
            raise
        except Exception as exc:
            self._ops.failures.append(ProcessorFailure(name, "get_context_window", exc))
            logger.warning("window trigger of processor %s failed", name, exc_info=True)
            return window
        if not triggered:
            return window
        outcome = self._ops.run(
            name,
            "get_context_window",
            "passive",
            window.get_messages(),
            partial(processor.on_get_context_window, self, window, **kwargs),
            ContextWindow.get_messages,
            model=processor.model_name(),
        )
        return outcome[1] if outcome is not None else window

    # --- active compression --------------------------------------------------------------

    def compress_context(
        self,
        processor_types: Sequence[str] | None = None,
        compression_trigger: str = "manual",
        preserve_instruction: str | None = None,
    ) -> CompressResult:
        """Run offloaders, then compressors, over the whole view now (spec 3.4).

        Returns ``"busy"`` if a processor run holds the lock, ``"noop"`` if no selected
        processor changed anything, else ``"compressed"``. Views never run here.
        """
        if not self._processor_lock.acquire(blocking=False):
            self._ops.emit("skipped", "active_compress", "", compression_trigger, reason="busy")
            return "busy"
        try:
            with self._data_lock:
                self._compressing = True
            self._start_operation()
            result = self._compress(processor_types, compression_trigger, preserve_instruction)
        finally:
            with self._data_lock:
                self._compressing = False
                self._view.extend(self._deferred)
                self._deferred = []
            self._processor_lock.release()
        self._raise_if_strict()
        return result

    def _compress(
        self, processor_types: Sequence[str] | None, trigger: str, preserve_instruction: str | None
    ) -> CompressResult:
        allowed = set(processor_types) if processor_types is not None else None
        selected = [
            (name, p)
            for kind in ("offloader", "compressor")
            for name, p in self.processors
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
            view = self.get_messages()
            outcome = self._ops.run(
                name,
                "active_compress",
                trigger,
                view,
                partial(processor.on_compress, self, view, **kwargs),
                list,
                model=processor.model_name(),
            )
            if outcome is not None and outcome[0] is not None:
                self.set_messages(outcome[1])
                changed = True
        return "compressed" if changed else "noop"

    def recover_from_model_exception(self, exc: BaseException, *, stream_started: bool = False) -> bool:
        """After a model call failed: compress if it was a context overflow (spec 3.5).

        Returns True only if the compression changed the view, so a retry can help. False
        when output was already streamed (a retry would repeat it) or the error is not an
        overflow.
        """
        if stream_started or not is_context_overflow_error(exc):
            return False
        return self.compress_context(compression_trigger="model_context_overflow") == "compressed"

    # --- persistence ---------------------------------------------------------------------
