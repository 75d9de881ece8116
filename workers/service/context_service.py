"""``ContextService``: the fast path agents call to append messages and get windows.

``get_window`` never calls a model: it reads the saved compaction state, the pinned anchors
and the raw log after the cursor, applies the cheap rule chain to that tail and serves the
result through ``ctxcore.assemble.assemble_window``. Its cost grows with the messages after
the cursor, not with the conversation's history. When the view is over the conversation's
trigger it asks the queue for a (coalesced) background compaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from ctxcore.assemble import RuleFn, WindowResult, assemble_window
from ctxcore.config import Settings
from ctxcore.contract import check_messages_contract
from ctxcore.errors import ConflictError, InvalidMessageError, NotFoundError, QuotaExceeded, RecallDisabled
from ctxcore.messages import AnyMessage, SystemMessage
from ctxcore.pipeline.sizing import unservable_tokens
from ctxcore.processors.chain import WindowRules
from ctxcore.processors.recall_tool import DEFAULT_RECALL_TOKENS, RECALL_TOOL_NAME, recall_tool_definition
from ctxcore.protocol import append_violation
from ctxcore.recall.archive import RecallAnswer, recall
from ctxcore.recall.auto import AutoRecall
from ctxcore.recall.cache import IndexCache
from ctxcore.state import CompressionState, ConversationKey, MessageLog, OffloadStore, StateStore
from ctxcore.state.base import read_pinned
from ctxcore.state.budget import (
    BudgetTokens,
    check_budget,
    conversation_budget,
    result_cap_tokens,
    trigger_tokens,
)
from ctxcore.state.tail import AppendCounts, TailRead
from ctxcore.state.undecodable import is_undecodable, without_undecodable
from ctxcore.status import CompactionDetail
from ctxcore.tokens import TiktokenCounter, TokenCounter, encoding_for_model
from ctxcore.turns import UserDetector
from ctxcore.window_counter import WindowCounter
from workers.failures import FailureRecord, FailureStore, parse_record
from workers.holds import rearmed
from workers.queues import CompactionQueue, InlineQueue
from workers.service.append_checks import AppendOutcome, check_batch, validation_tail
from workers.service.tail import WindowTail, read_window_tail
from workers.spend import summariser_cap

__all__ = ["AppendOutcome", "CompactionQueue", "ContextService", "InlineQueue"]


class ContextService:
    """Append and window operations over the stores (see module docstring)."""

    def __init__(
        self,
        settings: Settings,
        state_store: StateStore,
        log: MessageLog,
        offloads: OffloadStore | None,
        enqueue: CompactionQueue,
        *,
        counter: TokenCounter | None = None,
        detector: UserDetector | None = None,
        clock: Callable[[], float] = time.perf_counter,
        failures: FailureStore | None = None,
    ) -> None:
        self.settings = settings
        self.state_store = state_store
        self.log = log
        self.offloads = offloads
        self.queue = enqueue
        self.counter = counter or TiktokenCounter(settings.engine.tokenizer_model)
        self.detector = detector or settings.engine.detector()
        self._clock = clock
        self.failures = failures
        self._counters: dict[str, TokenCounter] = {}
        # Parsed recall indexes for auto-recall windows and searches (not measured by
        # bench/fast_path.py, whose conversations have no archive).
        self._indexes = IndexCache()
        self.last_latency_ms = 0.0
        self._window_reader = state_store.window_reader(log)
        self._counted_log = log.counted()

    # --- appends ----------------------------------------------------------------------

    def append(
        self, key: ConversationKey, messages: Sequence[AnyMessage], *, expected_last_id: str | None = None
    ) -> list[str]:
        """Validate and append messages; returns their log ids (existing ids for duplicates).

        Raises ``InvalidMessageError`` naming the index of the first bad message (system
        messages are rejected: they come with each window request) and ``ConflictError``
        (with the log's ``last_id``) when ``expected_last_id`` is not where the log ends,
        checked atomically inside the append; a replay of a call that succeeded returns its
        ids instead (every message needs a ``message_id`` for that).
        """
        check_batch(messages, self.settings.service)
        # The message contract (ctxcore.contract), before anything is read or stored.
        check_messages_contract(messages)
        # The cursor alone: loading the state (10.7 kB of JSON in bench/fast_path.py) for
        # nothing but its cursor cost 2-4% of an agent step's CPU at tail 51 (issue 41).
        tail = validation_tail(self.log, key, self.state_store.cursor(key), expected_last_id)
        logged_ids = {t.message_id for t in tail if t.message_id}
        fresh = [(i, m) for i, m in enumerate(messages) if not (m.message_id and m.message_id in logged_ids)]
        found = append_violation(tail, [m for _, m in fresh])
        if found is not None:
            at, first = found
            raise InvalidMessageError(fresh[at][0] if fresh else 0, first.rule, first.detail)
        counts = self.append_counts(tail, messages)
        if counts is not None and self._counted_log is not None:
            return self._counted_log.append_counted(
                key, list(messages), counts, expected_last_id=expected_last_id
            )
        return self.log.append(key, list(messages), expected_last_id=expected_last_id)

    def append_if_match(
        self, key: ConversationKey, messages: Sequence[AnyMessage], if_match: str | None
    ) -> AppendOutcome:
        """``append`` under an ``If-Match`` precondition: ``None`` (none), ``"*"`` (the
        conversation exists, else ``ConflictError``) or the log id the log must end at
        (``ConflictError`` with the log's ``last_id`` otherwise). An append creating a
        conversation is ``QuotaExceeded`` past the tenant's ``max_conversations``."""
        expected = if_match
        previous = self.log.last_id(key)
        if expected == "*":
            # RFC 9110: "*" matches any current representation, i.e. the conversation exists.
            if previous is None:
                raise ConflictError("If-Match: * but the conversation does not exist")
            expected = None
        if previous is None and expected is None:
            self.check_conversation_limit(key.tenant_id)
        try:
            ids = self.append(key, messages, expected_last_id=expected)
        except ConflictError as exc:
            # The last id the atomic check saw: no second read that could see a later one.
            last = exc.last_id
            raise ConflictError(
                f"If-Match {expected!r} does not match the log's last id {last!r}",
                last_id=last,
                expected_last_id=expected,
            ) from exc
        # Under concurrent appends the max of our ids is the id our writes end at: a client
        # sending it as If-Match gets a conflict if someone else appended after us, as it should.
        replay = previous is not None and all(i <= previous for i in ids)
        return AppendOutcome(ids, max(ids) if ids else previous, replay)

    def check_conversation_limit(self, tenant: str) -> None:
        """``QuotaExceeded`` when the tenant already has ``max_conversations`` conversations.

        Only called for an append that would create a conversation. Two concurrent creations
        can both pass the check (it is not a transaction): the limit is a quota, not a lock.
        """
        limit = self.settings.tenant(tenant).max_conversations
        if limit is not None and len(self.log.list_conversations(tenant, None, limit)) >= limit:
            raise QuotaExceeded(
                f"tenant has reached its limit of {limit} conversations; delete one to start another"
            )

    def append_counts(
        self, tail: Sequence[AnyMessage], messages: Sequence[AnyMessage]
    ) -> AppendCounts | None:
        """What an append stores beside ``messages`` (logged after ``tail``): their counts under
        the default encoding and which are real user messages, so windows can read long tails
        newest first. None for a counter without an encoding (stored counts are tiktoken's)."""
        encoding = self.counter.encoding_name
        if encoding is None:
            return None
        flags = self.detector.real_flags([*tail, *messages])[len(tail) :]
        return AppendCounts(encoding, [self.counter.count_message(m) for m in messages], flags)

    # --- windows ----------------------------------------------------------------------

    def _counter_for(self, model: str | None) -> TokenCounter:
        if model is None:
            return self.counter
        # One counter per encoding (not per model name, which the client chooses freely:
        # a cache keyed by it would grow without bound) keeps its message cache warm: with
        # a new counter per window an agent step naming its model took 2.0x as long
        # (bench/fast_path.py --caches).
        encoding = encoding_for_model(model)
        return self._counters.get(encoding) or self._counters.setdefault(encoding, TiktokenCounter(model))

    def _rules(
        self, key: ConversationKey, budget_tokens: BudgetTokens, counter: TokenCounter
    ) -> RuleFn | None:
        if self.settings.engine.rule_chain == "none":
            return None
        # One per window: keeping chains by budget saved 1-5% of an agent step at a 51-message
        # tail (bench/fast_path.py --caches, issue 41).
        chain = WindowRules(budget_tokens, max_result_ratio=self.settings.engine.max_result_ratio)
        return partial(chain.apply, counter=counter, offloads=self.offloads, key=key, detector=self.detector)

    def _window_reads(
        self,
        key: ConversationKey,
        budget_tokens: BudgetTokens,
        counter: WindowCounter,
        require_existing: bool,
        recall_index: bool,
        recording: bool = True,
    ) -> tuple[CompressionState, list[AnyMessage], WindowTail, FailureRecord | None]:
        """State, pinned anchors, tail and failure record: one round trip where the stores
        offer a window reader (with a counter whose counts the log stores), else the stores
        one by one (the record read once). With ``recall_index`` the reader also brings a
        recall index newer than the one held."""
        reader = self._window_reader if recording else None  # the readers record the budget
        encoding = counter.encoding_name
        tail_read: TailRead | None = None
        if reader is not None and encoding is not None:
            held = self._indexes.version(key) if recall_index else None
            got = reader.read(key, budget_tokens, encoding, held)
            if require_existing and got.state is None and got.last_id is None:
                raise NotFoundError(f"conversation {key} not found")
            if got.index is not None:
                self._indexes.put(key, got.index)
            if got.refresh_due:  # at most hourly per conversation: the read returned its TTL
                reader.refresh(key)
            state, pinned, tail_read = got.state or CompressionState(), got.pinned, got.tail
            if self.failures is None:
                record = None
            elif got.compaction is not None and got.compaction_key == self.failures.key(key):
                record = parse_record(got.compaction)  # read beside the conversation (Redis)
            else:
                record = self.failures.get(key)
        else:
            loaded = self.state_store.load(key)
            if require_existing and loaded is None and self.log.last_id(key) is None:
                raise NotFoundError(f"conversation {key} not found")
            state = loaded or CompressionState()
            if recording:
                self.state_store.set_budget(key, budget_tokens)
            pinned = read_pinned(self.log, key, state)
            record = self.failures.get(key) if self.failures is not None else None
            if encoding is not None and self._counted_log is not None:
                tail_read = self._counted_log.read_tail(
                    key, state.covered_until, budget_tokens=budget_tokens, encoding=encoding
                )
        tail = read_window_tail(
            self.log,
            self._counted_log,
            key,
            state.covered_until,
            counter,
            default_encoding=self.counter.encoding_name,
            pinned=pinned,
            detector=self.detector,
            read=tail_read,
        )
        return state, pinned, tail, record

    def recall(
        self, key: ConversationKey, query: str, max_tokens: int = DEFAULT_RECALL_TOKENS
    ) -> RecallAnswer:
        """Search what compaction folded in ``key`` (at most two chunks within ``max_tokens``).

        Raises ``RecallDisabled`` (naming the setting) when recall is off for the tenant and
        ``InvalidMessageError`` for an empty query or a non-positive ``max_tokens``.
        """
        if not self.settings.recall_for_tenant(key.tenant_id).enabled:
            raise RecallDisabled(
                f"tenants.{key.tenant_id}.recall.enabled"
                if key.tenant_id in self.settings.tenants
                else "recall.enabled"
            )
        if not query.strip():
            raise InvalidMessageError(-1, "query", "must name the words to look for")
        if max_tokens <= 0:
            raise InvalidMessageError(-1, "max_tokens", "must be a positive number of tokens")
        state = self.state_store.load(key) or CompressionState()
        index = self._indexes.get(key, state.archive_version, lambda: self.state_store.load_archive(key))
        return recall(index, query, max_tokens, self.counter)

    def window_tools(self, key: ConversationKey, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The tools a window of ``key`` is served (and counted) with: the request's, then
        ctxcore's own: ``recall_compressed_context`` while recall is on for the tenant."""
        out = [dict(t) for t in tools]
        if self.settings.recall_for_tenant(key.tenant_id).enabled and not any(
            t.get("function", {}).get("name") == RECALL_TOOL_NAME for t in out
        ):
            # The agent can search what compaction folded; the tool is counted in the budget.
            out.append(recall_tool_definition())
        return out

    def get_window(
        self,
        key: ConversationKey,
        budget_tokens: int,
        system_messages: Sequence[AnyMessage] = (),
        tools: Sequence[Mapping[str, Any]] = (),
        model: str | None = None,
        *,
        own_tools: bool = True,
        require_existing: bool = False,
        preview: bool = False,
    ) -> WindowResult:
        """The window for ``key`` within ``budget_tokens``; never calls a model.

        Records the budget beside the state; asks for compaction when the view is over
        ``trigger_ratio`` of it, unless a hold (``workers.holds``) keeps jobs from starting.
        ``compaction`` is the queue's status, ``paused`` while such a hold pauses it, or
        ``failing`` while the conversation's last job failed (``compaction_detail`` says why,
        from the ``failures`` store when one was given). ``BudgetExceeded`` when system + tools +
        anchors alone do not fit. ``own_tools=False`` counts and serves the request's tools
        alone (the proxy never injects the recall tool). With ``require_existing`` a
        conversation with neither log nor state is ``NotFoundError`` (checked in the same
        read on Redis), and nothing is recorded for it, nor with ``preview`` (no compaction either).
        """
        # The one check of the budget; the stores take what it returns (ctxcore.state.budget).
        budget_tokens = check_budget(budget_tokens)
        for i, message in enumerate(system_messages):
            if not isinstance(message, SystemMessage):
                raise InvalidMessageError(i, "system_messages", "only system messages belong here")
        started = self._clock()
        tools = self.window_tools(key, tools) if own_tools else [dict(t) for t in tools]
        # One counter for the rules and the window (the request's model), each message
        # counted once however often the window's steps ask.
        counter = WindowCounter(self._counter_for(model))
        # Compactions, holds and the tail read work to the room the messages have.
        room = conversation_budget(budget_tokens, system_messages, tools, counter)
        recall_settings = self.settings.recall_for_tenant(key.tenant_id)
        state, pinned, read, record = self._window_reads(
            key, room, counter, require_existing, recall_settings.auto, recording=not preview
        )
        # Entries that no longer decode are left out with the results answering them, and
        # named in elided_ranges (ctxcore.state.undecodable): never a failed window.
        tail, undecodable = without_undecodable(read.messages)
        pinned = [m for m in pinned if not is_undecodable(m)]
        auto: AutoRecall | None = None
        if recall_settings.auto:
            index = self._indexes.get(key, state.archive_version, lambda: self.state_store.load_archive(key))
            auto = AutoRecall(index, recall_settings.auto_max_ratio) if index is not None else None
        result = assemble_window(
            state,
            tail,
            budget_tokens,
            list(system_messages),
            list(tools),
            self._rules(key, budget_tokens, counter),
            counter,
            pinned=pinned,
            detector=self.detector,
            auto_recall=auto,
            rule_chunk_tokens=self.settings.service.chunk_tokens(room),
        )
        if read.elided:
            # The older tail was left unread behind markers: the fallback applied, and the
            # trigger still sees the whole tail (its stored total).
            result.fallback_applied = True
            result.elided_ranges[:0] = read.elided
            result.raw_tokens += read.raw_tokens_delta
        if undecodable:
            result.elided_ranges = sorted([*result.elided_ranges, *undecodable])
        trigger = trigger_tokens(budget_tokens, room, self.settings.service.trigger_ratio)
        # A result no window could serve whole counts at the cap, as the workers' planning
        # counts it (ctxcore.pipeline.sizing: unservable_tokens): counted whole, it asked for a
        # compaction on every window. Counted only when the whole count is over the trigger.
        due = result.raw_tokens > trigger and (
            result.raw_tokens
            - unservable_tokens(
                tail, room, result_cap_tokens(room, self.settings.engine.result_cap_ratio), counter
            )
            > trigger
        )
        detail = record.detail if record is not None else CompactionDetail()
        cap = summariser_cap(self.settings, key.tenant_id)
        held = detail.hold is not None and not rearmed(
            detail.hold,
            budget_tokens=room,
            tail=tail,
            elided=read.elided,
            counter=counter,
            backoff_seconds=self.settings.worker.no_progress_backoff_seconds,
            cap_tokens=cap,
        )
        if held and detail.hold is not None and detail.hold.pauses:
            # No job until the hold re-arms (workers.holds): the last one could not progress,
            # or the tenant's summariser tokens of the day are spent.
            result.compaction = "paused"
        elif due and not held and cap != 0 and not preview:  # cap 0: rules only
            result.compaction = self.queue.request(key)
        else:
            # The queue's status from the record already read: read once per window.
            if detail.last_error:
                result.compaction = "failing"
            elif record is not None:
                result.compaction = self.queue.status_from(record)
            else:
                result.compaction = self.queue.status(key)
        if detail.last_error is not None and result.compaction != "paused":
            result.compaction = "failing"
        result.compaction_detail = detail
        self.last_latency_ms = (self._clock() - started) * 1000
        return result
