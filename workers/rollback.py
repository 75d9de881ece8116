"""``rollback_conversation``: make a kept state version current again, for ``ctxcore
rollback`` and ``POST .../rollback`` alike.

Under the conversation's lock (the one compaction stages hold), so a running stage cannot
save between the check and the copy; the copy itself is the store's CAS ``rollback``. The
rollback is written to the conversation's stage journal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ctxcore.errors import ConflictError, NotFoundError, VersionNotKept
from ctxcore.state import HISTORY_LIMIT, ConversationKey
from workers.journal import error_entry, write_entry
from workers.locks import ConversationBusy, LockBusy, conversation_lock
from workers.runtime import Runtime

__all__ = ["ROLLBACK_LOCK_WAIT_SECONDS", "RollbackDone", "rollback_conversation"]

# How long a rollback waits for a running compaction stage to release the conversation's lock.
ROLLBACK_LOCK_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class RollbackDone:
    """The version restored and the new current version holding its copy."""

    restored: int
    version: int


def rollback_conversation(runtime: Runtime, key: ConversationKey, version: int) -> RollbackDone:
    """Save a copy of kept version ``version`` of ``key`` as its new current version.

    ``NotFoundError`` when the conversation has no saved state, ``VersionNotKept`` (with
    the kept versions) when ``version`` is not kept, ``ConversationBusy`` when a stage
    keeps the lock past ``ROLLBACK_LOCK_WAIT_SECONDS``; each changes nothing.
    """
    started = time.perf_counter()
    settings = runtime.settings
    try:
        with conversation_lock(
            runtime.redis,
            settings.redis.key_prefix,
            key,
            settings.worker.lock_timeout,
            wait_seconds=ROLLBACK_LOCK_WAIT_SECONDS,
        ):
            state = runtime.state_store.load(key)
            if state is None:
                raise NotFoundError(f"{key}: no saved compaction state to roll back")
            kept = [s.version for s in runtime.state_store.history(key, HISTORY_LIMIT)]
            if version not in kept:
                shown = f"{kept[-1]}..{kept[0]}" if kept else "none"
                raise VersionNotKept(
                    f"{key}: version {version} is not kept (kept: {shown}, the last {HISTORY_LIMIT}); "
                    "pick one of those",
                    version=version,
                    kept=kept,
                )
            if not runtime.state_store.rollback(key, version, expected_version=state.version):
                raise ConflictError(f"{key}: another writer saved version {state.version + 1} first; retry")
    except LockBusy:
        raise ConversationBusy("a compaction of this conversation is running; retry shortly") from None
    done = RollbackDone(restored=version, version=state.version + 1)
    entry = error_entry(
        "rollback",
        "rolled_back",
        started,
        version=done.version,
        detail=f"version {version} restored as version {done.version}",
    )
    write_entry(runtime.journal, key, entry)
    return done
