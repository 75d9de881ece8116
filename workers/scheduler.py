"""Fair, coalescing compaction queue in Redis, sharded over rings of tenants.

Celery queues are FIFO, so a tenant that enqueues 10,000 jobs would starve everyone behind
it. Here jobs wait in one Redis list per tenant, and tenants with waiting jobs are served
round-robin in a ring: each Celery ``ctxcore.drain`` message is only a token meaning "run the
next job of this ring, fairly", so the order in which jobs *start* is decided by the ring,
not by the order the tokens were sent.

Rings: a stable hash spreads tenants over ``worker.scheduler_rings`` rings (16 by default);
ring i's keys share the hash tag ``{<prefix>:sched:<i>:<s>}``, where ``s`` is the smallest
suffix putting the tag's slot in the i-th of N equal slot ranges, so on a cluster the rings
spread evenly over the masters (3 masters: 5 or 6 of 16 rings each) instead of one slot
serving every enqueue, drain and finish. Every key a script touches is passed in ``KEYS``;
a drain is two calls, rotate the ring (which names a tenant) then pop that tenant's queue,
the second re-checking what the first read.

Tokens per ring: ``drain(ring=i)`` is sent when a job enters ring i, with at most
``worker.ring_tokens`` tokens outstanding per ring (counted in its slot). A drain that
starts a job re-sends its ring's token while the ring has more jobs, so a busy ring's tokens
queue behind the other rings' and fairness holds across rings with no global pointer. A
token that finds its ring empty scans at most N rings onward.

Per conversation there is at most one queued job and one running job: a request while
queued is absorbed; a request while running marks it dirty, and exactly one follow-up is
queued when the run finishes (unless the run failed: the failure backoff decides when the
conversation may queue again). A running job holds a lease; if its worker dies the lease
runs out and the next request re-queues the conversation.

Lost jobs: a running job's stage can be lost too (a retry that could not be published while
Redis was down). Each running job has a beat deadline in its ring (``beat``): the job's start,
its running stage's heartbeats and each stage sent or waiting for its retry countdown push it
on by ``liveness_seconds``; ``requeue_lost`` (the reconciler, ``workers.lost_jobs``) queues
again the running jobs whose deadline passed.

Liveness: a token can be lost (a failed send, a consumer that died). Each ring stamps when
its last token was sent or consumed; ``stuck_rings`` (the reconciler in every worker) finds
the rings with jobs whose stamp is older than ``requeue_after_seconds``, re-stamps them and
returns one token for each, atomically per ring, so N workers revive a ring once per
interval; a request for a queued job of such a ring sends a token at once. The reconciler
also learns how many tokens the other rings have out (``reconcile_scan``): tokens waiting in
the jobs queue stand for the stuck rings only beyond those.

Traces: every request is told to ``on_request`` first, which keeps its trace context for the
next job of its conversation to link to (``workers.telemetry.jobs``).

The ring count is stored at first start (``{<prefix>:sched:meta}``): a different
``scheduler_rings`` later would re-map tenants and strand their queued jobs, so it is refused.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeVar

import redis
from redis.crc import key_slot

from ctxcore.errors import ConfigError, StoreUnavailable
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.common import UNAVAILABLE
from ctxcore.state.redis.retention import RedisRetention
from workers import scheduler_scripts as lua

__all__ = ["FairScheduler", "Job", "Requested", "Status", "parse_status", "ring_tags"]

Status = Literal["idle", "queued", "running"]
_SLOTS = 16384
_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, *UNAVAILABLE)
T = TypeVar("T")


def parse_status(raw: bytes | str | None) -> Status:
    """A stored status (``queued:<t>``, ``running:<deadline>``, ``dirty:<deadline>``, None)
    as ``idle``, ``queued`` or ``running``; a run whose lease ran out (its worker died) is idle."""
    if raw is None or raw in (b"", ""):
        return "idle"
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    if text.startswith("queued"):
        return "queued"
    deadline = text.split(":", 1)[1] if ":" in text else ""
    if deadline and float(deadline) < time.time():
        return "idle"
    return "running"


def ring_tags(prefix: str, rings: int) -> list[str]:
    """Each ring's hash tag: ``{<prefix>:sched:<i>:<s>}`` with the smallest ``s`` whose slot
    lies in the i-th of ``rings`` equal slot ranges."""
    tags = []
    for i in range(rings):
        low, high = i * _SLOTS // rings, (i + 1) * _SLOTS // rings
        s = 0
        while not low <= key_slot(f"{prefix}:sched:{i}:{s}".encode()) < high:
            s += 1
        tags.append(f"{{{prefix}:sched:{i}:{s}}}")
    return tags


@dataclass(frozen=True)
class Job:
    """A conversation whose compaction is due; ``resend`` when a token for its ``ring`` must
    be sent again (the ring has more jobs)."""

    key: ConversationKey
    ring: int = 0
    resend: bool = False


@dataclass(frozen=True)
class Requested:
    """The outcome of ``FairScheduler.request``: ``created`` when a new job was queued,
    ``token`` the ring to send one drain token to (None: no token is due). True when either."""

    created: bool
    token: int | None

    def __bool__(self) -> bool:
        return self.created or self.token is not None


class FairScheduler:
    """Round-robin per-tenant job queues in rings, per-conversation coalescing (module doc)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        lease_seconds: float = 300.0,
        requeue_after_seconds: float = 30.0,
        *,
        rings: int = 16,
        ring_tokens: int = 2,
        mirror: Callable[[ConversationKey], str] | None = None,
        retention: RedisRetention | None = None,
        liveness_seconds: float = 20.0,
        on_request: Callable[[ConversationKey], None] | None = None,
    ) -> None:
        # Both counts are validated once, by the settings (worker.scheduler_rings, ring_tokens: >= 1).
        self.client = client
        self._mirror_key = mirror
        # The mirror's expiry (the conversation's), with a retention.
        self._retention = retention or RedisRetention(client, prefix)
        self.rings = rings
        self.ring_tokens = ring_tokens
        self.tags = ring_tags(prefix, rings)
        self._meta = f"{{{prefix}:sched:meta}}"
        self._meta_checked = False
        self.lease_seconds = lease_seconds
        self.requeue_after_seconds = requeue_after_seconds
        # Twice the heartbeat interval: how long a running job may go without news.
        self.liveness_seconds = liveness_seconds
        # Each script of ``workers.scheduler_scripts`` by its name there (``_call`` runs them).
        self._scripts = {name: client.register_script(getattr(lua, name)) for name in lua.__all__}
        # Told of every request before it reaches a job (queued, absorbed, or a running
        # job's follow-up): the next job to start links to it (workers.telemetry.jobs).
        self._on_request = on_request

    def ring_of(self, tenant_id: str) -> int:
        """The ring ``tenant_id`` is served in (a stable hash: every process agrees)."""
        return zlib.crc32(tenant_id.encode("utf-8")) % self.rings

    def _keys(self, ring: int, tenant_id: str) -> list[str]:
        tag = self.tags[ring]
        return [
            f"{tag}:status",
            f"{tag}:inring",
            f"{tag}:ring",
            f"{tag}:q:{tenant_id}",
            f"{tag}:out",
            f"{tag}:stamp",
            f"{tag}:seq",
            f"{tag}:beat",
        ]

    def _ring_keys(self, ring: int) -> list[str]:
        tag = self.tags[ring]
        return [f"{tag}:ring", f"{tag}:out", f"{tag}:stamp"]

    @staticmethod
    def _member(key: ConversationKey) -> str:
        return f"{key.tenant_id}/{key.conversation_id}"

    def _call(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return self._read(lambda: self._scripts[script](keys=keys, args=args))

    def _read(self, read: Callable[[], T]) -> T:
        """``read()`` after the start-up check, a Redis error as ``StoreUnavailable``."""
        self.check()
        try:
            return read()
        except _ERRORS as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc

    def check(self) -> None:
        """Record the ring count at first start; refuse a different one later (``ConfigError``):
        the start-up check, and done before the first use."""
        if self._meta_checked:
            return
        try:
            self.client.set(self._meta, self.rings, nx=True)
            stored = self.client.get(self._meta)
        except _ERRORS as exc:
            raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc
        if stored is not None and int(stored) != self.rings:
            raise ConfigError(
                f"worker.scheduler_rings is {self.rings} but this deployment's scheduler was started "
                f"with {int(stored)} rings ({self._meta}): re-mapping would strand queued jobs; set "
                f"scheduler_rings = {int(stored)}, or drain the queues and delete {self._meta}"
            )
        self._meta_checked = True

    def request(self, key: ConversationKey) -> Requested:
        """Ask for a compaction of ``key``; see ``Requested`` for whether to send a token."""
        if self._on_request is not None:  # before: a job popped meanwhile links to it
            self._on_request(key)
        ring = self.ring_of(key.tenant_id)
        got = self._call(
            "ENQUEUE",
            self._keys(ring, key.tenant_id),
            [
                self._member(key),
                key.tenant_id,
                key.conversation_id,
                repr(time.time()),
                self.requeue_after_seconds,
                self.ring_tokens,
            ],
        )
        code = int(self._mirrored(key, got))
        return Requested(created=code in (1, 3), token=ring if code in (1, 2) else None)

    def next_job(self, ring: int | None = None) -> Job | None:
        """Start the next job of ``ring`` (a token of that ring arrived), else of the next
        rings onward (at most all N); ``ring=None`` (a token of no ring) starts anywhere."""
        start = random.randrange(self.rings) if ring is None else ring % self.rings
        for step in range(self.rings):
            r = (start + step) % self.rings
            job = self._take(r, consume=ring is not None and step == 0)
            if job is not None:
                return job
        return None

    def _take(self, ring: int, consume: bool) -> Job | None:
        # A tenant in the ring with an empty queue (forgotten jobs) is dropped by the pop:
        # try a few more before moving on.
        for attempt in range(4):
            tenant = self._call(
                "ROTATE",
                self._ring_keys(ring),
                ["1" if consume and attempt == 0 else "0", repr(time.time())],
            )
            if tenant is None:
                return None
            name = tenant.decode() if isinstance(tenant, bytes) else str(tenant)
            got = self._call(
                "POP",
                self._keys(ring, name),
                [name, repr(time.time()), self.lease_seconds, self.ring_tokens, self.liveness_seconds],
            )
            if got:
                conv = got[0].decode() if isinstance(got[0], bytes) else str(got[0])
                job = Job(ConversationKey(name, conv), ring, bool(int(got[1])))
                self._mirrored(job.key, got)
                return job
        return None

    def renew(self, key: ConversationKey) -> bool:
        """Extend a running job's lease (called by each stage)."""
        tag = self.tags[self.ring_of(key.tenant_id)]
        args = [self._member(key), time.time() + self.lease_seconds]
        got = self._call("RENEW", [f"{tag}:status", f"{tag}:seq"], args)
        return bool(self._mirrored(key, got))

    def beat(self, key: ConversationKey, seconds_ahead: float | None = None) -> bool:
        """The running job of ``key`` shows life for ``seconds_ahead`` more seconds (default
        ``liveness_seconds``): a heartbeat, or a stage sent or waiting for its countdown.
        False when it is not running (nothing written)."""
        ahead = self.liveness_seconds if seconds_ahead is None else seconds_ahead
        tag = self.tags[self.ring_of(key.tenant_id)]
        return bool(
            self._call(
                "BEAT", [f"{tag}:status", f"{tag}:beat"], [self._member(key), repr(time.time() + ahead)]
            )
        )

    def requeue_lost(self) -> list[Job]:
        """Queue again every running job whose beat deadline passed (its stage was lost);
        each as a ``Job`` whose ``resend`` says a drain token of its ring is due. A job that
        showed life meanwhile is left alone (re-checked atomically per job)."""
        now = time.time()
        lost: list[Job] = []
        for ring in range(self.rings):
            beats = self._read(partial(self.client.hgetall, f"{self.tags[ring]}:beat"))
            for raw_member, raw_deadline in beats.items():
                if float(raw_deadline) >= now:
                    continue
                member = raw_member.decode() if isinstance(raw_member, bytes) else str(raw_member)
                tenant, _, conversation = member.partition("/")
                key = ConversationKey(tenant, conversation)
                got = self._call(
                    "REQUEUE_LOST",
                    self._keys(ring, tenant),
                    [member, tenant, conversation, repr(now), self.ring_tokens],
                )
                code = int(self._mirrored(key, got))
                if code:
                    lost.append(Job(key, ring, resend=code == 1))
        return lost

    def finish(self, key: ConversationKey, *, follow_up: bool = True) -> int:
        """Mark a run finished: -1 when it was not running (nothing to finish), 0 finished,
        1 finished and its follow-up queued (send one drain token to ``ring_of(tenant)``),
        2 finished and its follow-up queued behind its ring's tokens. ``follow_up=False``
        drops the follow-up a request during the run asked for (the run failed: back off)."""
        got = self._call(
            "FINISH",
            self._keys(self.ring_of(key.tenant_id), key.tenant_id),
            [
                self._member(key),
                key.tenant_id,
                key.conversation_id,
                repr(time.time()),
                "1" if follow_up else "0",
                self.ring_tokens,
            ],
        )
        return int(self._mirrored(key, got))

    def stuck_rings(self) -> dict[int, int]:
        """Rings with jobs whose tokens were neither sent nor consumed for over
        ``requeue_after_seconds``, each with the tokens to send now (one); atomic per ring, so
        concurrent reconcilers never both revive one ring in one interval."""
        return self.reconcile_scan()[0]

    def reconcile_scan(self) -> tuple[dict[int, int], int]:
        """``stuck_rings`` (reviving them), and the tokens outstanding of every other ring:
        those may be waiting in the jobs queue too, and they start their own rings' jobs (a
        token starts a job of its ring while the ring has jobs; an empty ring's scans onward,
        and may find a busy ring first), not a stuck ring's."""
        stuck: dict[int, int] = {}
        others_out = 0
        now = repr(time.time())
        for ring in range(self.rings):
            revived, outstanding = self._call(
                "STUCK", self._ring_keys(ring), [now, self.requeue_after_seconds]
            )
            if int(revived):
                stuck[ring] = int(revived)
            others_out += int(outstanding)
        return stuck, others_out

    def status(self, key: ConversationKey) -> Status:
        """``idle``, ``queued`` or ``running`` (a dirty run counts as running), from the
        ring's slot (the fast path reads the mirror in the compaction hash instead)."""
        status_key = f"{self.tags[self.ring_of(key.tenant_id)]}:status"
        return parse_status(self._read(partial(self.client.hget, status_key, self._member(key))))

    def forget(self, key: ConversationKey) -> None:
        """Drop a conversation's queued work and status (on delete)."""
        keys = self._keys(self.ring_of(key.tenant_id), key.tenant_id)
        args = [self._member(key), key.tenant_id, key.conversation_id]
        self._mirrored(key, self._call("FORGET", [*keys[:4], keys[6], keys[7]], args))

    def _mirrored(self, key: ConversationKey, got: list[Any]) -> Any:
        """Mirror a script's status change (its last two values: status, ring seq) into the
        conversation's compaction hash; returns the script's first value."""
        seq = int(got[-1])
        if self._mirror_key is not None and seq > 0:
            status = got[-2].decode() if isinstance(got[-2], bytes) else str(got[-2])
            keys = [self._mirror_key(key), self._retention.name(key, "log:seq")]
            self._call("MIRROR", keys, [status, seq, self._retention.ttl_ms(key)])
        return got[0]

    def depth(self) -> int:
        """Jobs waiting in all tenant queues (two calls per ring: ``/metrics`` only)."""
        total = 0
        for ring in range(self.rings):
            tag = self.tags[ring]
            try:
                tenants = self.client.lrange(f"{tag}:ring", 0, -1)
                if not tenants:
                    continue
                pipe = self.client.pipeline(transaction=False)
                for t in tenants:
                    pipe.llen(f"{tag}:q:{t.decode() if isinstance(t, bytes) else t}")
                total += int(sum(pipe.execute()))
            except _ERRORS as exc:
                raise StoreUnavailable(f"scheduler unavailable: {exc}") from exc
        return total
