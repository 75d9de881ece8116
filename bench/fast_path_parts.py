"""The pieces ``bench/fast_path.py`` measures with: the scheduler-backed queue, one conversation
at a nominal tail and its samples, an agent step, the floor's one round trip, percentiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage
from ctxcore.state import ConversationKey
from ctxcore.status import CompactionStatus
from workers.failures import FailureRecord
from workers.runtime import Runtime

PAGE = 128


class SchedulerQueue:
    """``CeleryQueue``'s reads without Celery: the failure record, then the scheduler."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def status(self, key: ConversationKey) -> CompactionStatus:
        failing = self.runtime.failures.get(key).failing
        return "failing" if failing else self.runtime.scheduler.status(key)

    def status_from(self, record: FailureRecord) -> CompactionStatus:
        """As ``CeleryQueue``: from the record the window read (the scheduler mirrors into it)."""
        return "failing" if record.failing else record.scheduler_status

    def request(self, key: ConversationKey) -> CompactionStatus:
        self.runtime.scheduler.request(key)
        return self.status(key)


@dataclass
class Tail:
    """One conversation at a nominal tail, and the samples measured on it (nanoseconds)."""

    tail: int
    key: ConversationKey
    system: list[AnyMessage]
    nominal_last: str
    cursor: int
    pinned: list[str]
    miss: list[int] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)
    append: list[int] = field(default_factory=list)
    floor: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    fallback: int = 0


def step(i: int) -> list[AnyMessage]:
    """One agent step: a tool call and its short result, ids unique in the run."""
    call = ToolCall(
        id=f"bench-{i}", name="get_reservation_details", arguments=f'{{"reservation_id": "R{i:05d}"}}'
    )
    result = f'{{"reservation_id": "R{i:05d}", "status": "confirmed", "cabin": "economy", "passengers": 2}}'
    return [
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(tool_call_id=call.id, content=result),
    ]


def floor_call(client: redis.Redis, prefix: str, runtime: Runtime, size: Tail) -> Callable[[], object]:
    """The redefined floor: one round trip of what a window reads, undecoded."""
    tag = size.key.hash_tag
    stream = f"{prefix}:{tag}:log"
    failures = runtime.failures.key(size.key)

    def call() -> object:
        pipe = client.pipeline(transaction=False)
        pipe.lindex(f"{prefix}:{tag}:state:history", 0)
        for log_id in size.pinned:
            pipe.xrange(stream, f"{int(log_id)}-0", f"{int(log_id)}-0", count=1)
        pipe.xrevrange(stream, "+", f"{size.cursor + 1}-0", count=PAGE)
        pipe.hgetall(failures)
        pipe.hgetall(f"{prefix}:{tag}:compaction")
        pipe.get(f"{prefix}:{tag}:budget")
        return pipe.execute()

    return call


def pct(samples: list[int]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6  # noqa: E731
    return pick(0.50), pick(0.95), pick(0.99)
