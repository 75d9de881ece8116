"""The embedded engine: ``ContextEngine`` -> ``ModelContext`` with a chain of processors.

A context keeps two lists:

* the **raw log**: every message ever added, append-only, each with its log id
  (``context_message_id``, a zero-padded per-context counter whose string order is append
  order). Compaction never changes it: ``get_raw_messages()``.
* the **view**: the current, possibly processed messages (``get_messages()``); processed
  copies keep the log id of their original, so anything can be traced back to the log.

Processors run under one lock per context, so two hooks of a context never overlap.
Deviations from the reference are listed in the docstrings of the methods concerned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any, Literal, TypeVar

from ctxcore.assemble import fit_to_budget
from ctxcore.counting import tolerant
from ctxcore.engine_async import AsyncModelContext
from ctxcore.engine_config import ContextEngineConfig, validate_config
from ctxcore.engine_state import ContextSnapshot, dump_snapshot, load_snapshot, offload_handles
from ctxcore.errors import (
    BudgetExceeded,
    ConfigError,
    CtxcoreError,
    InvalidMessageError,
    RecallDisabled,
    TruncateRefused,
)
from ctxcore.messages import AnyMessage, SystemMessage, messages_to_json
from ctxcore.pipeline import View, block_provenance
from ctxcore.processors import REGISTRY, ContextProcessor, ProcessorRegistry, register_processor
from ctxcore.processors.events import (
    CompressionStateEvent,
    ContextEvent,
    ProcessorFailure,
    StateReporter,
    Subscriber,
)
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS, RECALL_TOOL_NAME, recall_tool_definition
from ctxcore.processors.reload_tool import RELOAD_TOOL_NAME, reload_tool_definition
from ctxcore.processors.rules import RuleEnv, id_ranges
from ctxcore.processors.runner import CANCELLATION, OperationReporter
from ctxcore.recall.archive import ChunkingConfig, RecallAnswer
from ctxcore.recall.auto import recall_query
from ctxcore.recall.embedded import ContextArchive
from ctxcore.state.base import OffloadStore, parse_log_id
from ctxcore.state.filesystem import validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.summarize.errors import is_context_overflow_error
from ctxcore.tokens import EstimateCounter, TiktokenCounter, TokenCounter
from ctxcore.turns import UserDetector, anchors
from ctxcore.window import (
    ContextStats,
    ContextWindow,
    apply_window_limits,
    compute_stats,
    resolve_context_max,
)
from ctxcore.window_repair import served_context

__all__ = ["AsyncModelContext", "CompressResult", "ContextEngine", "ContextEngineConfig", "ModelContext"]

logger = logging.getLogger(__name__)

CompressResult = Literal["compressed", "noop", "busy"]
ProcessorSpec = tuple[str, Any] | ContextProcessor[Any]

LOCK_WARN_SECONDS = 120.0
_ID_WIDTH = 12
T = TypeVar("T")


def _check_messages(messages: Any, what: str = "messages") -> list[AnyMessage]:
    """A list of non-system message objects, or ``InvalidMessageError``."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        messages = [messages]
    out: list[AnyMessage] = []
    for i, message in enumerate(messages):
        if not isinstance(message, AnyMessage):
            raise InvalidMessageError(
                i, "message", f"expected a message object, got {type(message).__name__}"
            )
        if isinstance(message, SystemMessage):
            raise InvalidMessageError(
                i,
                "role",
                f"system messages are not stored in a context; pass them to get_context_window ({what})",
            )
        out.append(message)
    return out


class ModelContext:
    """One conversation's context inside an agent process (synchronous).

    Create it with ``ContextEngine.create_context``. Thread-safe: processor runs are
    serialised by a per-context lock; reads take a short data lock.

    Attributes:
        context_id, session_id: the ids it was created with.
        key: ``ConversationKey(session_id or "default", context_id)`` for offloads.
        token_counter: the counter every size in this context is measured with.
        offload_store: where offloaded originals go.
        context_max: the model's window in tokens (spec 2.6 resolution).
        clock: seconds source for the TTL pass (``ContextEngine(clock=...)``).
        last_window_access: clock value of the last ``get_context_window``.
        last_failures: processor failures of the most recent operation.
    """

    def __init__(
        self,
        *,
        context_id: str,
        session_id: str | None,
        config: ContextEngineConfig,
        processors: Sequence[tuple[str, ContextProcessor[Any]]],
        token_counter: TokenCounter,
        offload_store: OffloadStore,
        clock: Callable[[], float],
        detector: UserDetector,
        subscribers: list[Subscriber],
    ) -> None:
        self.context_id = context_id
        self.session_id = session_id
        self.key = ConversationKey(session_id or "default", context_id)
        self.config = config
        self.processors = list(processors)
        self.token_counter = token_counter
        self.offload_store = offload_store
        self.clock = clock
        self.detector = detector
        self.context_max = resolve_context_max(
            config.context_window_tokens, config.model_name, config.model_context_window_tokens
        )
        self.last_window_access: float | None = None
        self.last_failures: list[ProcessorFailure] = []
        # The log id the view had reached when it was last rewritten: provider usage reported
        # with replies up to it describes requests the view no longer makes.
        self.usage_fresh_after: str | None = None
        self._raw: list[AnyMessage] = []
        self._by_id: dict[str, AnyMessage] = {}
        self._log_seq = 0  # the highest log id assigned: never reused
        self._view: list[AnyMessage] = []
        self._derived: set[str] = set()
        self._derived_seq = 0
        # Adds that arrive while an active compression holds the processor lock.
        self._deferred: list[AnyMessage] = []
        self._compressing = False
        self._data_lock = threading.RLock()
        self._processor_lock = threading.Lock()
        self._states = StateReporter(subscribers)
        self._ops = OperationReporter(
            self._states, tolerant(token_counter), self.context_max, context_id, detector
        )
        recall_config = config.compression_recall_config
        # What the compressors fold is archived here when recall is on (spec 2.2).
        self.archive: ContextArchive | None = (
            ContextArchive(
                self.key,
                tolerant(token_counter),
                ChunkingConfig(
                    recall_config.chunk_size_tokens,
                    recall_config.chunk_overlap_tokens,
                    recall_config.auto_passage_tokens,
                ),
                offload_store,
            )
            if recall_config.enabled
            else None
        )

    # --- ids and the log ---------------------------------------------------------------

    def _append_to_log(self, messages: list[AnyMessage]) -> list[AnyMessage]:
        with self._data_lock:
            stamped = []
            for message in messages:
                self._log_seq += 1
                log_id = f"{self._log_seq:0{_ID_WIDTH}d}"
                copy = message.model_copy(update={"context_message_id": log_id})
                self._raw.append(copy)
                self._by_id[log_id] = copy
                stamped.append(copy)
            return stamped

    def _own_ids(self, messages: list[AnyMessage]) -> list[AnyMessage]:
        """Messages entering the view keep a log id of this context or get a derived one.

        A message that is not in the log (a summary a compressor wrote, say) gets
        ``<log id of the last logged message before it>+<seq>``: it sorts right after that
        message, and it is never taken for a log entry.
        """
        out = []
        previous = "0" * _ID_WIDTH
        for message in messages:
            log_id = message.context_message_id
            if log_id in self._by_id:
                previous = log_id
            elif log_id not in self._derived:
                self._derived_seq += 1
                log_id = f"{previous}+{self._derived_seq:06d}"
                self._derived.add(log_id)
                message = message.model_copy(update={"context_message_id": log_id})
            out.append(message)
        return out

    def _limit(self, messages: list[AnyMessage]) -> list[AnyMessage]:
        limit = self.config.max_context_message_num
        if limit is None or len(messages) <= limit:
            return list(messages)
        return apply_window_limits([], messages, window_size=limit, detector=self.detector)[1]

    # --- reads ---------------------------------------------------------------------------

    def get_messages(self) -> list[AnyMessage]:
        """The current view (at most ``max_context_message_num`` newest, anchors kept)."""
        with self._data_lock:
            return self._limit(self._view)

    def get_raw_messages(self) -> list[AnyMessage]:
        """The append-only log: every message as it was added, with its log id."""
        with self._data_lock:
            return list(self._raw)

    def raw_message(self, log_id: str) -> AnyMessage | None:
        """One logged message by its log id."""
        with self._data_lock:
            return self._by_id.get(log_id)

    def rule_env(self, new_ids: frozenset[str] | None = None) -> RuleEnv:
        """The environment rule processors run in for this context."""
        return RuleEnv(
            counter=self.token_counter,
            key=self.key,
            offloads=self.offload_store,
            detector=self.detector,
            originals=self._by_id,
            context_max=self.context_max,
            new_ids=new_ids,
        )

    def window_rule_env(self, window: ContextWindow) -> RuleEnv:
        """``rule_env`` for a window: its context messages may use the context's window size
        minus the window's system messages and tools (headroom-aware rules read that room)."""
        room = (
            self.context_max
            - self.token_counter.count_messages(window.system_messages)
            - self.token_counter.count_tools(window.tools)
        )
        return replace(self.rule_env(), tail_budget_tokens=room)

    def statistic(self) -> ContextStats:
        """Counts and exact tokens of the view (provider usage is not used: counts are exact)."""
        return compute_stats([], self.get_messages(), [], self.token_counter, self.detector)

    def recall(self, query: str, max_tokens: int = DEFAULT_RECALL_TOKENS) -> RecallAnswer:
        """Search what this context's compressors folded: at most two archived chunks within
        ``max_tokens`` (a miss says so). The window's ``recall_compressed_context`` tool
        calls this.

        Raises:
            RecallDisabled: ``compression_recall_config.enabled`` is off.
            InvalidMessageError: an empty query or ``max_tokens`` below 1.
        """
        if self.archive is None:
            raise RecallDisabled("compression_recall_config.enabled")
        if not query.strip():
            raise InvalidMessageError(-1, "query", "must name the words to look for")
        if max_tokens <= 0:
            raise InvalidMessageError(-1, "max_tokens", "must be a positive number of tokens")
        return self.archive.recall(query, max_tokens)

    def archive_folded(self, messages: Sequence[AnyMessage]) -> None:
        """Archive what a compressor is about to fold (their originals as logged); a no-op
        with recall off. Compressors call it after their benefit check."""
        if self.archive is None:
            return
        with self._data_lock:
            originals = [self._by_id[i] for m in messages if (i := m.context_message_id) in self._by_id]
        self.archive.fold(originals)

    def reload(self, handle: str) -> list[AnyMessage]:
        """The original messages stored under an offload handle ([] if unknown).

        Raises:
            InvalidKeyError: ``handle`` is not a well-formed handle.
        """
        found = self.offload_store.get(self.key, validate_handle(handle))
        return found if found is not None else []

    @property
    def compression_states(self) -> list[CompressionStateEvent]:
        """The last 100 compression-state events of this context, oldest first."""
        return list(self._states.history)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Receive this context's compression-state events; returns an unsubscribe function."""
        return self._states.subscribe(callback)

    # --- writes --------------------------------------------------------------------------

    def set_messages(self, messages: Sequence[AnyMessage]) -> None:
        """Replace the view (the log is untouched); messages foreign to the log get derived ids."""
        checked = _check_messages(messages, "set_messages")
        with self._data_lock:
            self._view = self._own_ids(checked)
            self.usage_fresh_after = f"{self._log_seq:0{_ID_WIDTH}d}"

    def pop_messages(self, count: int = 1) -> list[AnyMessage]:
        """Remove and return the newest ``count`` messages of the view (the log keeps them)."""
        if count < 0:
            raise ConfigError(f"pop_messages: count must be >= 0, got {count}")
        with self._data_lock:
            cut = max(len(self._view) - count, 0)
            popped, self._view = self._view[cut:], self._view[:cut]
            if popped:
                self.usage_fresh_after = f"{self._log_seq:0{_ID_WIDTH}d}"
            return popped

    def truncate_after(self, log_id: str, *, expected_last_id: str | None = None) -> list[str]:
        """Remove the logged messages above ``log_id`` from the log and the view; their ids.

        The log's one exception to append-only (an Agents SDK ``pop_item``): allowed only
        when those messages end the view exactly as logged, i.e. no processor folded,
        rewrote or offloaded them, and no operation holds the processor lock. Ids are never
        reused. Raises ``TruncateRefused`` with reason ``covered``, ``busy`` or ``moved``
        (the log does not end at ``expected_last_id``); nothing is removed then.
        """
        after = parse_log_id(log_id)
        if not self._processor_lock.acquire(blocking=False):
            raise TruncateRefused(
                "busy", f"context {self.key}: a processor run holds the lock; retry shortly"
            )
        try:
            with self._data_lock:
                last = self._raw[-1].context_message_id if self._raw else None
                if expected_last_id is not None and expected_last_id != last:
                    raise TruncateRefused(
                        "moved",
                        f"context {self.key}: the log ends at {last!r}, not {expected_last_id!r}",
                        last_id=last,
                    )
                cut = next(
                    (i for i, m in enumerate(self._raw) if parse_log_id(str(m.context_message_id)) > after),
                    len(self._raw),
                )
                removed = self._raw[cut:]
                if not removed:
                    return []
                if self._view[len(self._view) - len(removed) :] != removed or self._deferred:
                    raise TruncateRefused(
                        "covered",
                        f"context {self.key}: messages after {log_id} were compacted or rewritten by a "
                        "processor; only messages that end the view as logged can be removed",
                        last_id=last,
                    )
                del self._raw[cut:], self._view[len(self._view) - len(removed) :]
                ids = [str(m.context_message_id) for m in removed]
                for i in ids:
                    self._by_id.pop(i, None)
                return ids
        finally:
            self._processor_lock.release()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Never time out (a processor may legitimately be slow) but say so while waiting.
        waited = 0.0
        while not self._processor_lock.acquire(timeout=LOCK_WARN_SECONDS):
            waited += LOCK_WARN_SECONDS
            logger.warning("context %s: waiting %.0f s for the processor lock", self.key, waited)
        try:
            yield
        finally:
            self._processor_lock.release()

    def _start_operation(self) -> None:
        self._ops.failures = []
        self.last_failures = self._ops.failures

    def _raise_if_strict(self) -> None:
        if self.config.strict_processors and self.last_failures:
            raise self.last_failures[0].error

    def add_messages(self, messages: AnyMessage | Sequence[AnyMessage]) -> list[str]:
        """Log ``messages``, run the add hooks over them, append the result to the view.

        Returns the log ids assigned. System messages are rejected: they are sent with each
        window request, never stored. While an active compression runs, the messages are
        logged at once and join the view unprocessed when it finishes (spec 3.3 step 2).
        """
        batch = self._append_to_log(_check_messages(messages))
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

    def save_state(self) -> dict[str, Any]:
        """A JSON-ready snapshot: log, view, derived ids, TTL clock, processor states, and the
        originals the view's offload markers point to (so ``reload`` works after a restore)."""
        with self._data_lock:
            view = list(self._view)
            snapshot = ContextSnapshot(
                raw=list(self._raw),
                view=view,
                derived=sorted(self._derived),
                derived_seq=self._derived_seq,
                last_window_access=self.last_window_access,
                processors=[{"type": name, "state": p.save_state()} for name, p in self.processors],
                usage_fresh_after=self.usage_fresh_after,
                archive=self.archive.dump() if self.archive is not None else None,
                log_seq=self._log_seq,
            )
        for handle in offload_handles(view):
            found = self.offload_store.get(self.key, handle)
            if found is not None:
                snapshot.offloads[handle] = found
        return dump_snapshot(snapshot, self.context_id, self.session_id)

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``save_state`` returned (the processor chain must be the same).

        Saved offloads are written to this context's offload store (an existing handle is
        kept: handles are content hashes). Snapshots of format 1 (without offloads) load too.

        Raises:
            CtxcoreError: the snapshot is of another format or another processor chain.
        """
        snapshot = load_snapshot(state, [name for name, _ in self.processors])
        for handle, messages in snapshot.offloads.items():
            self.offload_store.put_if_absent(self.key, validate_handle(handle), messages)
        with self._data_lock:
            self._raw = snapshot.raw
            self._by_id = {str(m.context_message_id): m for m in snapshot.raw}
            self._view = snapshot.view
            self._derived = set(snapshot.derived)
            self._derived_seq = snapshot.derived_seq
            self.last_window_access = snapshot.last_window_access
            self.usage_fresh_after = snapshot.usage_fresh_after
            self._log_seq = snapshot.log_seq
        for (_, processor), entry in zip(self.processors, snapshot.processors, strict=True):
            processor.load_state(entry.get("state", {}))
        if self.archive is not None:
            self.archive.load(snapshot.archive)


class ContextEngine:
    """Creates and pools contexts; owns the offload store, the clock and the registry.

    Args:
        config: a ``ContextEngineConfig`` or a dict of its fields.
        offload_store: where offloaded originals go (default: a ``MemoryOffloadStore``).
        clock: seconds source for TTL decisions (default ``time.time``).
        registry: processor registry (default: the global one with the built-ins).
    """

    register_processor = staticmethod(register_processor)

    def __init__(
        self,
        config: ContextEngineConfig | Mapping[str, Any] | None = None,
        *,
        offload_store: OffloadStore | None = None,
        clock: Callable[[], float] = time.time,
        registry: ProcessorRegistry | None = None,
    ) -> None:
        self.config = validate_config(ContextEngineConfig, config, "ContextEngineConfig")
        self.offload_store: OffloadStore = (
            offload_store if offload_store is not None else MemoryOffloadStore()
        )
        self.clock = clock
        self.registry = registry if registry is not None else REGISTRY
        self.detector = UserDetector(
            extra_prefixes=self.config.internal_user_prefixes,
            patterns=self.config.internal_user_patterns,
            harness_structure=self.config.harness_structure,
        )
        self._contexts: dict[tuple[str, str], ModelContext] = {}
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._counter: TokenCounter | None = None

    def default_counter(self) -> TokenCounter:
        """The engine's shared counter: tiktoken for ``model_name`` unless disabled."""
        if self._counter is None:
            self._counter = (
                TiktokenCounter(self.config.model_name)
                if self.config.enable_tiktoken_counter
                else EstimateCounter()
            )
        return self._counter

    def _build_processors(self, specs: Sequence[ProcessorSpec]) -> list[tuple[str, ContextProcessor[Any]]]:
        built = []
        for spec in specs:
            if isinstance(spec, ContextProcessor):
                built.append((spec.processor_type(), spec))
                continue
            if not isinstance(spec, tuple) or len(spec) != 2 or not isinstance(spec[0], str):
                raise ConfigError(f"processors: expected (name, config) pairs, got {spec!r}")
            name, config = spec
            built.append((name, self.registry.create(name, config)))
        return built

    def create_context(
        self,
        context_id: str,
        session_id: str | None = None,
        processors: Sequence[ProcessorSpec] | None = None,
        history_messages: Sequence[AnyMessage] | None = None,
        token_counter: TokenCounter | None = None,
    ) -> ModelContext:
        """The context for (session, context id), created on first use.

        An existing context is returned as it is (its processors and history stay).
        ``history_messages`` are logged and put in the view without running processors.

        Raises:
            ConfigError: an unknown processor name or an invalid processor config.
            InvalidKeyError: an id that is not a safe identifier.
        """
        pool_key = (session_id or "default", context_id)
        with self._lock:
            existing = self._contexts.get(pool_key)
            if existing is not None:
                return existing
            context = ModelContext(
                context_id=context_id,
                session_id=session_id,
                config=self.config,
                processors=self._build_processors(processors or []),
                token_counter=token_counter or self.default_counter(),
                offload_store=self.offload_store,
                clock=self.clock,
                detector=self.detector,
                subscribers=self._subscribers,
            )
            if history_messages:
                context.set_messages(context._append_to_log(_check_messages(history_messages, "history")))
                context.usage_fresh_after = None  # the history as given: its usage still holds
            self._contexts[pool_key] = context
            return context

    def create_async_context(
        self, context_id: str, session_id: str | None = None, **kwargs: Any
    ) -> AsyncModelContext:
        """``create_context`` wrapped in an ``AsyncModelContext``."""
        return AsyncModelContext(self.create_context(context_id, session_id, **kwargs))

    def get_context(self, context_id: str, session_id: str | None = None) -> ModelContext | None:
        """The pooled context, or None."""
        with self._lock:
            return self._contexts.get((session_id or "default", context_id))

    def clear_context(self, context_id: str, session_id: str | None = None) -> None:
        """Forget a pooled context (its offloads stay in the store)."""
        with self._lock:
            self._contexts.pop((session_id or "default", context_id), None)

    def _require(self, context_id: str, session_id: str | None) -> ModelContext:
        context = self.get_context(context_id, session_id)
        if context is None:
            raise CtxcoreError(f"no context {context_id!r} in session {session_id or 'default'!r}")
        return context

    def compress_context(
        self, context_id: str, session_id: str | None = None, **kwargs: Any
    ) -> CompressResult:
        """``ModelContext.compress_context`` of a pooled context (missing -> ``CtxcoreError``)."""
        return self._require(context_id, session_id).compress_context(**kwargs)

    def recover_from_model_exception(
        self,
        exc: BaseException,
        context_id: str,
        session_id: str | None = None,
        *,
        stream_started: bool = False,
    ) -> bool:
        """``ModelContext.recover_from_model_exception`` of a pooled context."""
        return self._require(context_id, session_id).recover_from_model_exception(
            exc, stream_started=stream_started
        )

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Receive the compression-state events of every context; returns an unsubscribe."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe
