"""``truncate_conversation``: remove a conversation's newest messages, under its lock.

The log is append-only except here. Compaction reads the log up to its cursor and writes
states that point into it, so the messages removed must be above everything a saved state
covers; holding the lock compaction stages hold makes that check and the removal one step.
"""

from __future__ import annotations

from ctxcore.errors import TruncateRefused
from ctxcore.state import ConversationKey
from ctxcore.state.base import parse_log_id
from workers.locks import LockBusy, conversation_lock
from workers.runtime import Runtime

__all__ = ["TRUNCATE_LOCK_WAIT_SECONDS", "truncate_conversation"]

# How long a truncation waits for a running compaction stage before refusing (busy).
TRUNCATE_LOCK_WAIT_SECONDS = 2.0


def truncate_conversation(
    runtime: Runtime, key: ConversationKey, log_id: str, *, expected_last_id: str | None = None
) -> list[str]:
    """Remove the messages of ``key`` above ``log_id``; their log ids (see
    ``MessageLog.truncate_after``).

    ``TruncateRefused`` (nothing removed): ``covered`` when the saved compaction state
    covers a message above ``log_id``, ``busy`` when a compaction stage keeps the lock past
    ``TRUNCATE_LOCK_WAIT_SECONDS``, ``moved`` when the log does not end at
    ``expected_last_id``.
    """
    after = parse_log_id(log_id)
    settings = runtime.settings
    try:
        with conversation_lock(
            runtime.redis,
            settings.redis.key_prefix,
            key,
            settings.worker.lock_timeout,
            wait_seconds=TRUNCATE_LOCK_WAIT_SECONDS,
        ):
            state = runtime.state_store.load(key)
            covered = state.covered_until if state is not None else None
            if covered is not None and parse_log_id(covered) > after:
                raise TruncateRefused(
                    "covered",
                    f"{key}: compaction covers the log up to {covered}; messages at or below it "
                    f"cannot be removed (asked: after {log_id})",
                    last_id=runtime.log.last_id(key),
                )
            return runtime.log.truncate_after(key, log_id, expected_last_id=expected_last_id)
    except LockBusy:
        raise TruncateRefused(
            "busy", f"{key}: a compaction holds the conversation's lock; retry shortly"
        ) from None
