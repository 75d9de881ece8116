"""The context model: ``ContextCore`` holds one conversation's log and view.

A context keeps two lists:

* the **raw log**: every message ever added, append-only, each with its log id
  (``context_message_id``, a zero-padded per-context counter whose string order is append
  order). Compaction never changes it: ``get_raw_messages()``.
* the **view**: the current, possibly processed messages (``get_messages()``); processed
  copies keep the log id of their original, so anything can be traced back to the log.

This module owns the data, its locks, the reads and the direct writes; running processor
hooks over it is ``engine_hooks.ContextHooks`` and ``engine_context.ModelContext`` adds
persistence. Deviations from the reference are listed in the docstrings of the methods concerned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ctxcore.contract import check_messages_contract
from ctxcore.counting import tolerant
from ctxcore.engine_config import DEFAULT_DEBUG_DIR, ContextEngineConfig
from ctxcore.errors import ConfigError, InvalidMessageError, RecallDisabled, TruncateRefused
from ctxcore.messages import AnyMessage, SystemMessage
from ctxcore.processors.base import ContextProcessor
from ctxcore.processors.events import CompressionStateEvent, ProcessorFailure, StateReporter, Subscriber
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS
from ctxcore.processors.rules import RuleEnv
from ctxcore.processors.runner import OperationReporter
from ctxcore.protocol import append_violation
from ctxcore.recall.archive import ChunkingConfig, RecallAnswer
from ctxcore.recall.embedded import ContextArchive
from ctxcore.state.base import OffloadStore, parse_log_id
from ctxcore.state.filesystem import validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector
from ctxcore.window import (
    ContextStats,
    ContextWindow,
    apply_window_limits,
    compute_stats,
    resolve_context_max,
)

__all__ = ["LOCK_WARN_SECONDS", "ContextCore", "check_messages"]

# Named after the public module: logging configured for ``ctxcore.engine`` keeps working.
logger = logging.getLogger("ctxcore.engine")

LOCK_WARN_SECONDS = 120.0
ID_WIDTH = 12


def check_messages(messages: Any, what: str = "messages") -> list[AnyMessage]:
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


class ContextCore:
    """The data of one conversation's context: the log, the view, their ids and locks.

    The base of ``ModelContext`` (create one with ``ContextEngine.create_context``).
    Thread-safe: processor runs are serialised by a per-context lock; reads take a short
    data lock.

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
        api_keys: Mapping[str, str] | None = None,
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
        self.debug_dir = (
            (config.context_debug_dir or DEFAULT_DEBUG_DIR) if config.enable_context_debug else None
        )
        # Only the keys this context's processors name (``model_client.api_key_env``).
        self._api_keys = dict(api_keys or {})
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
        """Log ``messages`` after checking the message contract and the protocol against
        the view's last step; ``InvalidMessageError`` stores nothing."""
        check_messages_contract(messages)
        with self._data_lock:
            # Deviation from the reference, which accepts a tool result that answers no call
            # and trims orphans only at the head of a window: an orphan further in made every
            # later get_context_window raise InvalidWindowError, so the context was lost.
            # Rejected here, as the HTTP append does, the context stays usable.
            current = [*self._view, *self._deferred]
            start = next((i for i in range(len(current) - 1, -1, -1) if current[i].role != "tool"), 0)
            found = append_violation(current[start:], messages)
            if found is not None:
                at, violation = found
                raise InvalidMessageError(at, violation.rule, violation.detail)
            stamped = []
            for message in messages:
                self._log_seq += 1
                log_id = f"{self._log_seq:0{ID_WIDTH}d}"
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
        previous = "0" * ID_WIDTH
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

    def api_key(self, env_name: str) -> str | None:
        """The value of environment variable ``env_name`` as the engine read it at start-up,
        if one of this context's processors names it (None otherwise)."""
        return self._api_keys.get(env_name)

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
        checked = check_messages(messages, "set_messages")
        with self._data_lock:
            self._view = self._own_ids(checked)
            self.usage_fresh_after = f"{self._log_seq:0{ID_WIDTH}d}"

    def pop_messages(self, count: int = 1) -> list[AnyMessage]:
        """Remove and return the newest ``count`` messages of the view (the log keeps them)."""
        if count < 0:
            raise ConfigError(f"pop_messages: count must be >= 0, got {count}")
        with self._data_lock:
            cut = max(len(self._view) - count, 0)
            popped, self._view = self._view[cut:], self._view[:cut]
            if popped:
                self.usage_fresh_after = f"{self._log_seq:0{ID_WIDTH}d}"
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
