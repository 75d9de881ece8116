"""The retention sweep: what key TTLs cannot expire by themselves.

On Redis a conversation's own keys expire with their TTL (``ctxcore.state.redis.retention``);
left behind are its entries in other slots: the tenant's listing (and activity set) and the
scheduler's queue and status. On SQL nothing expires by itself. Every worker runs
``sweep_if_due`` on its timer (``workers.reconciler``); a Redis key taken with ``SET NX PX``
lets one sweep run per ``SWEEP_EVERY_SECONDS`` for the whole deployment.

- Redis: per tenant with a retention, the conversations of its activity set scored before
  the cutoff whose keys are all gone are unlisted (``UNLIST_LUA``: only if still not active)
  and forgotten by the scheduler.
- SQL: rows stamped before ``last_active_at`` existed are stamped now; each idle
  conversation is deleted under its lock (``SqlRetentionSweep.delete_if_idle``), then its
  Redis leftovers: failure record, proxy index, scheduler entry.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from ctxcore.errors import StoreError, StoreUnavailable
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.common import text, translated
from ctxcore.state.redis.retention import (
    OFFLOAD_SUFFIX,
    RETAINED_SUFFIXES,
    UNLIST_LUA,
    tenant_activity_key,
    tenant_index_key,
)
from ctxcore.state.retention import Retention
from workers.locks import LockBusy, conversation_lock
from workers.proxy.index import HashIndex

if TYPE_CHECKING:
    from ctxcore.state.sql.retention import SqlRetentionSweep
    from workers.failures import FailureStore
    from workers.runtime import Runtime
    from workers.scheduler import FairScheduler

__all__ = ["SWEEP_EVERY_SECONDS", "RetentionSweep", "SweepReport", "sweep_if_due"]

log = logging.getLogger(__name__)

# Retention is counted in days: a sweep every five minutes keeps listings at most that stale.
SWEEP_EVERY_SECONDS = 300.0
# Conversations handled per tenant and query; a pass takes at most _MAX_BATCHES of them.
_BATCH = 500
_MAX_BATCHES = 20
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


@dataclass
class SweepReport:
    """What one pass removed."""

    unlisted: int = 0
    deleted: int = 0


class RetentionSweep:
    """One deployment's sweep (see the module docstring), its dependencies explicit."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        retention: Retention,
        *,
        scheduler: FairScheduler | None = None,
        failures: FailureStore | None = None,
        sql: SqlRetentionSweep | None = None,
        lock_timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.retention = retention
        self.scheduler = scheduler
        self.failures = failures
        self.sql = sql
        self.lock_timeout = lock_timeout
        self._clock = clock

    def run(self) -> SweepReport:
        """One pass over Redis listings, then SQL (when configured)."""
        report = SweepReport()
        if not self.retention.enabled:
            return report
        report.unlisted = self._sweep_listings()
        if self.sql is not None:
            report.deleted = self._sweep_sql(self.sql)
        return report

    def _tenants(self) -> list[str]:
        """Tenants with an activity set (their conversations were appended with a retention)."""
        escaped = _GLOB_SPECIAL.sub(r"\\\1", self.prefix)
        pattern = f"{escaped}:tenant:{{*}}:active"
        found: set[str] = set()
        with translated("listing activity sets"):
            for raw in self.client.scan_iter(match=pattern, count=1000):
                name = text(raw)
                found.add(name[name.index("{") + 1 : name.rindex("}")])
        return sorted(found)

    def _gone(self, tenant: str, ids: list[str]) -> list[str]:
        """The ids among ``ids`` none of whose keys is left (one EXISTS each, pipelined)."""
        pipe = self.client.pipeline(transaction=False)
        for conversation in ids:
            tag = ConversationKey(tenant, conversation).hash_tag
            pipe.exists(*(f"{self.prefix}:{tag}:{s}" for s in (*RETAINED_SUFFIXES, OFFLOAD_SUFFIX)))
        return [c for c, n in zip(ids, pipe.execute(), strict=True) if int(n) == 0]

    def _sweep_listings(self) -> int:
        unlisted = 0
        for tenant in self._tenants():
            seconds = self.retention.seconds_for(tenant)
            if seconds is None:
                continue
            index, active = tenant_index_key(self.prefix, tenant), tenant_activity_key(self.prefix, tenant)
            cutoff = self._clock() - seconds
            start = 0
            for _ in range(_MAX_BATCHES):
                with translated(f"sweeping the listing of {tenant}"):
                    raw: list[bytes | str] = self.client.zrangebyscore(  # type: ignore[assignment]  # sync client: a list
                        active, "-inf", f"({cutoff!r}", start=start, num=_BATCH
                    )
                    ids = [text(i) for i in raw]
                    gone = self._gone(tenant, ids) if ids else []
                    removed = (
                        [text(i) for i in self.client.eval(UNLIST_LUA, 2, index, active, repr(cutoff), *gone)]
                        if gone
                        else []
                    )
                for conversation in removed:
                    if self.scheduler is not None:
                        self.scheduler.forget(ConversationKey(tenant, conversation))
                unlisted += len(removed)
                # Ids still there (keys alive, or active again) stay in the range: skip them.
                start += len(ids) - len(removed)
                if len(ids) < _BATCH:
                    break
        return unlisted

    def _sweep_sql(self, sql: SqlRetentionSweep) -> int:
        deleted = 0
        for key, cutoff in sql.idle_by_retention(self.retention, limit=_BATCH * _MAX_BATCHES):
            try:
                # Under the lock a running stage cannot save a state between the deletes.
                with conversation_lock(self.client, self.prefix, key, self.lock_timeout):
                    if not sql.delete_if_idle(key, cutoff):
                        continue
                    if self.failures is not None:
                        self.failures.delete(key)
                    HashIndex(self.client, self.prefix).delete(key)
                    if self.scheduler is not None:
                        self.scheduler.forget(key)
            except LockBusy:
                continue  # a compaction runs: the next pass looks again
            deleted += 1
        return deleted


def _sweep_lock(rt: Runtime) -> bool:
    """True for the one worker whose turn it is this interval."""
    name = f"{rt.settings.redis.key_prefix}:retention:sweep"
    with translated("taking the retention sweep's turn"):
        return bool(rt.redis.set(name, "1", nx=True, px=int(SWEEP_EVERY_SECONDS * 1000)))


def sweep_from_runtime(rt: Runtime) -> RetentionSweep:
    """The sweep over the runtime's stores."""
    sql: SqlRetentionSweep | None = None
    if rt.settings.database.url:
        from ctxcore.state.sql.retention import SqlRetentionSweep

        # With database.url set the runtime's state store is SQL on this engine and prefix.
        sql = SqlRetentionSweep(engine=rt.sql_engine, table_prefix=rt.settings.database.table_prefix)
    return RetentionSweep(
        rt.redis,
        rt.settings.redis.key_prefix,
        rt.retention,
        scheduler=rt.scheduler,
        failures=rt.failures,
        sql=sql,
        lock_timeout=rt.settings.worker.lock_timeout,
    )


def sweep_if_due(rt: Runtime) -> SweepReport | None:
    """Run one pass if this worker has the interval's turn; None when it has not (or Redis or
    the database is unavailable: logged, the next interval tries again)."""
    if not rt.retention.enabled:
        return None
    try:
        if not _sweep_lock(rt):
            return None
        report = sweep_from_runtime(rt).run()
    except (StoreUnavailable, StoreError, redis.RedisError) as exc:
        log.warning(
            "retention sweep: stores unavailable (%s); trying again in %.0f s", exc, SWEEP_EVERY_SECONDS
        )
        return None
    if report.unlisted or report.deleted:
        log.info(
            "retention sweep: %d expired conversation(s) unlisted, %d deleted from SQL",
            report.unlisted,
            report.deleted,
        )
    return report
