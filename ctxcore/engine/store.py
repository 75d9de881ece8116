"""``ContextStore``: one conversation's log and view, their ids and locks.

A context keeps two lists:

* the **raw log**: every message ever added, append-only, each with its log id
  (``context_message_id``, a zero-padded per-context counter whose string order is append
  order). Compaction never changes it: ``get_raw_messages()``.
* the **view**: the current, possibly processed messages (``get_messages()``); processed
  copies keep the log id of their original, so anything can be traced back to the log.

The store owns the data, its locks, the reads, the direct writes and the snapshot of its
part; ``ModelContext`` has one, beside the ``HookRunner`` that runs processors over it.
Deviations from the reference are listed in the docstrings of the methods concerned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ctxcore.contract import check_messages_contract
from ctxcore.engine.snapshot import ContextSnapshot
from ctxcore.errors import ConfigError, InvalidMessageError, TruncateRefused
from ctxcore.messages import AnyMessage, SystemMessage
from ctxcore.protocol import append_violation
from ctxcore.state.base import parse_log_id
from ctxcore.state.keys import ConversationKey
from ctxcore.turns import UserDetector
from ctxcore.window import apply_window_limits

__all__ = ["LOCK_WARN_SECONDS", "ContextStore", "check_messages", "logger"]

# Named after the public module: logging configured for ``ctxcore.engine`` keeps working.
logger = logging.getLogger("ctxcore.engine")

LOCK_WARN_SECONDS = 120.0
ID_WIDTH = 12


def check_messages(messages: Any, what: str = "messages") -> list[AnyMessage]:
    """A list of non-system message objects, or ``InvalidMessageError``."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        messages = [messages]
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
    return list(messages)


class ContextStore:
    """The log, the view, their ids, the deferred adds and the two locks of one context.

    ``data_lock`` (re-entrant) guards the lists for short reads and writes;
    ``processor_lock`` serialises processor runs (``locked``) and is tried, never waited
    for, by ``truncate_after`` and active compression.

    Attributes:
        last_window_access: clock value of the last ``get_context_window``.
        usage_fresh_after: the log id the view had reached when it was last rewritten:
            provider usage reported with replies up to it describes requests the view no
            longer makes.
    """

    def __init__(self, key: ConversationKey, detector: UserDetector, max_messages: int | None) -> None:
        self.key = key
        self.detector = detector
        self.max_messages = max_messages
        self.last_window_access: float | None = None
        self.usage_fresh_after: str | None = None
        self.data_lock = threading.RLock()
        self.processor_lock = threading.Lock()
        self._raw: list[AnyMessage] = []
        self._by_id: dict[str, AnyMessage] = {}
        self._log_seq = 0  # the highest log id assigned: never reused
        self._view: list[AnyMessage] = []
        self._derived: set[str] = set()
        self._derived_seq = 0
        # Adds that arrive while an active compression holds the processor lock.
        self._deferred: list[AnyMessage] = []
        self._compressing = False

    @property
    def originals(self) -> dict[str, AnyMessage]:
        """The logged messages by log id, live (read under ``data_lock``; never written)."""
        return self._by_id

    # --- ids and the log ---------------------------------------------------------------

    def append(self, messages: list[AnyMessage]) -> list[AnyMessage]:
        """Log ``messages`` after checking the message contract and the protocol against
        the view's last step; ``InvalidMessageError`` stores nothing."""
        check_messages_contract(messages)
        with self.data_lock:
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
        limit = self.max_messages
        if limit is None or len(messages) <= limit:
            return list(messages)
        return apply_window_limits([], messages, window_size=limit, detector=self.detector)[1]

    # --- reads ---------------------------------------------------------------------------

    def messages(self) -> list[AnyMessage]:
        """The current view (at most ``max_messages`` newest, anchors kept)."""
        with self.data_lock:
            return self._limit(self._view)

    def raw_messages(self) -> list[AnyMessage]:
        """The append-only log."""
        with self.data_lock:
            return list(self._raw)

    def raw_message(self, log_id: str) -> AnyMessage | None:
        """One logged message by its log id."""
        with self.data_lock:
            return self._by_id.get(log_id)

    # --- writes --------------------------------------------------------------------------

    def set_view(self, messages: list[AnyMessage], *, rewrite: bool = True) -> None:
        """Replace the view (the log is untouched); messages foreign to the log get derived
        ids. ``rewrite=False`` for a history as given: usage reported for it still holds."""
        with self.data_lock:
            self._view = self._own_ids(messages)
            if rewrite:
                self.usage_fresh_after = f"{self._log_seq:0{ID_WIDTH}d}"

    def extend_view(self, messages: list[AnyMessage]) -> None:
        """Append processed messages to the view, trimmed once it is twice ``max_messages``."""
        with self.data_lock:
            self._view.extend(messages)
            if self.max_messages is not None and len(self._view) > 2 * self.max_messages:
                self._view = self._limit(self._view)

    def defer(self, messages: list[AnyMessage]) -> bool:
        """Hold logged ``messages`` for the view if an active compression runs (True then)."""
        with self.data_lock:
            if self._compressing:
                self._deferred.extend(messages)
            return self._compressing

    @contextmanager
    def compressing(self) -> Iterator[None]:
        """An active compression: adds are deferred, and join the view unprocessed at the end."""
        with self.data_lock:
            self._compressing = True
        try:
            yield
        finally:
            with self.data_lock:
                self._compressing = False
                self._view.extend(self._deferred)
                self._deferred = []

    def pop(self, count: int) -> list[AnyMessage]:
        """Remove and return the newest ``count`` messages of the view (the log keeps them)."""
        if count < 0:
            raise ConfigError(f"pop_messages: count must be >= 0, got {count}")
        with self.data_lock:
            cut = max(len(self._view) - count, 0)
            popped, self._view = self._view[cut:], self._view[:cut]
            if popped:
                self.usage_fresh_after = f"{self._log_seq:0{ID_WIDTH}d}"
            return popped

    def truncate_after(self, log_id: str, *, expected_last_id: str | None = None) -> list[str]:
        """See ``ModelContext.truncate_after``."""
        after = parse_log_id(log_id)
        if not self.processor_lock.acquire(blocking=False):
            raise TruncateRefused(
                "busy", f"context {self.key}: a processor run holds the lock; retry shortly"
            )
        try:
            with self.data_lock:
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
            self.processor_lock.release()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the processor lock: never time out (a processor may legitimately be slow)
        but say so while waiting."""
        waited = 0.0
        while not self.processor_lock.acquire(timeout=LOCK_WARN_SECONDS):
            waited += LOCK_WARN_SECONDS
            logger.warning("context %s: waiting %.0f s for the processor lock", self.key, waited)
        try:
            yield
        finally:
            self.processor_lock.release()

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self) -> ContextSnapshot:
        """The store's part of a context snapshot (call under ``data_lock`` to add to it)."""
        with self.data_lock:
            return ContextSnapshot(
                raw=list(self._raw),
                view=list(self._view),
                derived=sorted(self._derived),
                derived_seq=self._derived_seq,
                last_window_access=self.last_window_access,
                usage_fresh_after=self.usage_fresh_after,
                log_seq=self._log_seq,
            )

    def restore(self, snapshot: ContextSnapshot) -> None:
        """Take the store's part of ``snapshot``."""
        with self.data_lock:
            self._raw = snapshot.raw
            self._by_id = {str(m.context_message_id): m for m in snapshot.raw}
            self._view = snapshot.view
            self._derived = set(snapshot.derived)
            self._derived_seq = snapshot.derived_seq
            self.last_window_access = snapshot.last_window_access
            self.usage_fresh_after = snapshot.usage_fresh_after
            self._log_seq = snapshot.log_seq
