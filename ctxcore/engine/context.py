"""``ModelContext``: one conversation's context inside an agent process.

A context is composed, not layered: it has a ``store.ContextStore`` (the log, the view,
their ids and locks) and a ``hooks.HookRunner`` (running its processors: add, window,
compress). This class holds what the processors see of it
(``processors.base.ProcessorContext``), reads and writes through the store, runs
operations through the runner, and saves and loads snapshots (the format is ``snapshot``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ctxcore.counting import tolerant
from ctxcore.engine.config import DEFAULT_DEBUG_DIR, ContextEngineConfig
from ctxcore.engine.hooks import CompressResult, HookRunner
from ctxcore.engine.snapshot import dump_snapshot, load_snapshot, offload_handles
from ctxcore.engine.store import ContextStore, check_messages
from ctxcore.errors import InvalidMessageError, RecallDisabled
from ctxcore.messages import AnyMessage
from ctxcore.processors.base import ContextProcessor
from ctxcore.processors.events import CompressionStateEvent, ProcessorFailure, Subscriber
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS
from ctxcore.processors.rules import RuleEnv
from ctxcore.recall.archive import ChunkingConfig, RecallAnswer
from ctxcore.recall.embedded import ContextArchive
from ctxcore.state.base import OffloadStore
from ctxcore.state.filesystem import validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.summarize.errors import is_context_overflow_error
from ctxcore.tokens import TokenCounter
from ctxcore.turns import UserDetector
from ctxcore.window import ContextStats, ContextWindow, compute_stats, resolve_context_max

__all__ = ["ModelContext"]


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
        api_keys: Mapping[str, str] | None = None,
        history_messages: Sequence[AnyMessage] = (),
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
                offload_store.files(),
            )
            if recall_config.enabled
            else None
        )
        self._store = ContextStore(self.key, detector, config.max_context_message_num)
        self._hooks = HookRunner(self, self._store, self.processors, config, subscribers, context_id)
        if history_messages:
            # Logged and put in the view as given, without processors: its usage still holds.
            self._store.set_view(
                self._store.append(check_messages(history_messages, "history")), rewrite=False
            )

    @property
    def last_window_access(self) -> float | None:
        """Clock value of the last ``get_context_window`` (None before the first)."""
        return self._store.last_window_access

    @property
    def usage_fresh_after(self) -> str | None:
        """The log id the view had reached when it was last rewritten: provider usage
        reported with replies up to it describes requests the view no longer makes."""
        return self._store.usage_fresh_after

    @property
    def last_failures(self) -> list[ProcessorFailure]:
        """Processor failures of the most recent operation."""
        return self._hooks.failures

    # --- reads ---------------------------------------------------------------------------

    def get_messages(self) -> list[AnyMessage]:
        """The current view (at most ``max_context_message_num`` newest, anchors kept)."""
        return self._store.messages()

    def get_raw_messages(self) -> list[AnyMessage]:
        """The append-only log: every message as it was added, with its log id."""
        return self._store.raw_messages()

    def raw_message(self, log_id: str) -> AnyMessage | None:
        """One logged message by its log id."""
        return self._store.raw_message(log_id)

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
            originals=self._store.originals,
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
        with self._store.data_lock:
            by_id = self._store.originals
            originals = [by_id[i] for m in messages if (i := m.context_message_id) in by_id]
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
        return list(self._hooks.states.history)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Receive this context's compression-state events; returns an unsubscribe function."""
        return self._hooks.states.subscribe(callback)

    # --- writes --------------------------------------------------------------------------

    def set_messages(self, messages: Sequence[AnyMessage]) -> None:
        """Replace the view (the log is untouched); messages foreign to the log get derived ids."""
        self._store.set_view(check_messages(messages, "set_messages"))

    def pop_messages(self, count: int = 1) -> list[AnyMessage]:
        """Remove and return the newest ``count`` messages of the view (the log keeps them)."""
        return self._store.pop(count)

    def truncate_after(self, log_id: str, *, expected_last_id: str | None = None) -> list[str]:
        """Remove the logged messages above ``log_id`` from the log and the view; their ids.

        The log's one exception to append-only (an Agents SDK ``pop_item``): allowed only
        when those messages end the view exactly as logged, i.e. no processor folded,
        rewrote or offloaded them, and no operation holds the processor lock. Ids are never
        reused. Raises ``TruncateRefused`` with reason ``covered``, ``busy`` or ``moved``
        (the log does not end at ``expected_last_id``); nothing is removed then.
        """
        return self._store.truncate_after(log_id, expected_last_id=expected_last_id)

    # --- operations that run processors ------------------------------------------------

    def add_messages(self, messages: AnyMessage | Sequence[AnyMessage]) -> list[str]:
        """Log ``messages``, run the add hooks over them, append the result to the view.

        Returns the log ids assigned. System messages are rejected: they are sent with each
        window request, never stored. While an active compression runs, the messages are
        logged at once and join the view unprocessed when it finishes (spec 3.3 step 2).
        """
        batch = self._store.append(check_messages(messages))
        if batch:
            self._hooks.add(batch)
        return [str(m.context_message_id) for m in batch]

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
        return self._hooks.window(system_messages, tools, window_size, dialogue_round, kwargs)

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
        return self._hooks.compress(processor_types, compression_trigger, preserve_instruction)

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
        with self._store.data_lock:
            snapshot = self._store.snapshot()
            snapshot.processors = [{"type": name, "state": p.save_state()} for name, p in self.processors]
            snapshot.archive = self.archive.dump() if self.archive is not None else None
        for handle in offload_handles(snapshot.view):
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
        self._store.restore(snapshot)
        for (_, processor), entry in zip(self.processors, snapshot.processors, strict=True):
            processor.load_state(entry.get("state", {}))
        if self.archive is not None:
            self.archive.load(snapshot.archive)
