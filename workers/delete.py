"""``delete_conversation``: remove everything of a conversation, under its lock.

Beside ``rollback`` and ``truncate``: it reaches every store of the runtime (and the proxy's
index), so it sits above them, not in the fast path's ``workers.service``.

Under the lock compaction stages hold, a running stage cannot save a state (and so
resurrect the conversation) between the deletes.
"""

from __future__ import annotations

from ctxcore.state import ConversationKey
from workers.locks import ConversationBusy, LockBusy, conversation_lock
from workers.proxy.index import HashIndex
from workers.runtime import Runtime

__all__ = ["DELETE_LOCK_WAIT_SECONDS", "delete_conversation"]

# How long a deletion waits for a running compaction stage to release the conversation's lock.
DELETE_LOCK_WAIT_SECONDS = 5.0


def delete_conversation(runtime: Runtime, key: ConversationKey) -> None:
    """Delete ``key``'s queued work, offloads, state, journal, failure record, waiting trace
    contexts, proxy index and log.

    ``ConversationBusy`` (nothing deleted) when a compaction stage keeps the lock past
    ``DELETE_LOCK_WAIT_SECONDS``.
    """
    settings = runtime.settings
    try:
        with conversation_lock(
            runtime.redis,
            settings.redis.key_prefix,
            key,
            settings.worker.lock_timeout,
            wait_seconds=DELETE_LOCK_WAIT_SECONDS,
        ):
            runtime.scheduler.forget(key)
            runtime.offloads.delete(key)
            runtime.state_store.delete(key)
            runtime.journal.delete(key)
            runtime.failures.delete(key)
            runtime.job_traces.delete(key)
            HashIndex(runtime.redis, settings.redis.key_prefix).delete(key)  # the proxy's
            # The log goes last: if anything above fails, the conversation still exists
            # and the deletion can simply be retried.
            runtime.log.delete(key)
    except LockBusy:
        raise ConversationBusy("a compaction of this conversation is running; retry shortly") from None
