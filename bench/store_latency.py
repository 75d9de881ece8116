"""Store latency per backend: p50 / p99 of state save, log append and read_after.

    .venv/bin/python bench/store_latency.py [--n 500] [--redis-url URL] [--postgres-url URL]

Memory and SQLite (a temporary file) always run; Redis and PostgreSQL run when they answer.
Everything the script writes is removed afterwards. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis
import sqlalchemy
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import (
    CompressionState,
    ConversationKey,
    MemoryMessageLog,
    MemoryStateStore,
    MessageLog,
    RedisMessageLog,
    RedisStateStore,
    SqlMessageLog,
    SqlStateStore,
    StateStore,
    SummaryBlock,
)

Stores = tuple[StateStore, MessageLog]


def sample_state() -> CompressionState:
    """A state of realistic size: three blocks of about 400 words each."""
    blocks = [
        SummaryBlock(
            block_id=f"b{i}",
            messages=[
                UserMessage(content=f"<memory_block_round>{'summary words ' * 200}</memory_block_round>")
            ],
            first_id=f"{i * 10 + 1:012d}",
            last_id=f"{i * 10 + 10:012d}",
        )
        for i in range(3)
    ]
    return CompressionState(blocks=blocks, covered_until="000000000030", pinned=["000000000001"])


def sample_step(n: int) -> list[UserMessage | AssistantMessage | ToolMessage]:
    """What an agent appends per round: a call and its result (about 1 kB)."""
    return [
        AssistantMessage(
            content=None, tool_calls=[ToolCall(id=f"c{n}", name="read_file", arguments='{"path": "a.py"}')]
        ),
        ToolMessage(content="def f():\n    return 1\n" * 40, tool_call_id=f"c{n}", message_id=f"tool-{n}"),
    ]


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6  # noqa: E731
    return pick(0.50), pick(0.99)


def timed(n: int, call: Callable[[int], object]) -> tuple[float, float]:
    samples = []
    for i in range(n):
        started = time.perf_counter_ns()
        call(i)
        samples.append(time.perf_counter_ns() - started)
    return percentiles(samples)


def measure(name: str, stores: Stores, n: int) -> None:
    state_store, log = stores
    key = ConversationKey("bench", f"conv-{uuid.uuid4().hex[:8]}")
    state = sample_state()
    save = timed(n, lambda i: state_store.save(key, state, i))
    append = timed(n, lambda i: log.append(key, sample_step(i)))
    last = log.last_id(key)
    assert last is not None
    cursor = f"{int(last) - 20:012d}"  # the tail after the compaction cursor: 20 messages
    read = timed(n, lambda i: log.read_after(key, cursor))
    load = timed(n, lambda i: state_store.load(key))
    cells = "  ".join(f"{p50:7.3f} {p99:7.3f}" for p50, p99 in (save, load, append, read))
    print(f"{name:<10}  {cells}")


@contextmanager
def redis_stores(url: str) -> Iterator[Stores | None]:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    except redis.RedisError as exc:
        print(f"redis      skipped: {exc}")
        yield None
        return
    prefix = f"ctxcore-bench-{uuid.uuid4().hex[:8]}"
    try:
        yield RedisStateStore(client, prefix), RedisMessageLog(client, prefix)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@contextmanager
def sql_stores(url: str, prefix: str) -> Iterator[Stores | None]:
    try:
        state_store = SqlStateStore(url, table_prefix=prefix)
        state_store.setup()
    except Exception as exc:
        print(f"{url.split(':')[0]:<10} skipped: {str(exc).splitlines()[0]}")
        yield None
        return
    try:
        yield state_store, SqlMessageLog(engine=state_store.engine, table_prefix=prefix)
    finally:
        if state_store.engine.dialect.name == "postgresql":
            with state_store.engine.begin() as conn:
                for table in (
                    "state",
                    "state_history",
                    "budget",
                    "log_counter",
                    "log",
                    "offload",
                    "schema_migrations",
                ):
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}")
        state_store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="operations per measurement")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()

    print(f"milliseconds, {args.n} sequential calls each; save = CAS of a ~2.5k-token state,")
    print("append = 2 messages (~1 kB), read_after = 20 messages, load = current state\n")
    print(
        f"{'backend':<10}  {'save p50 p99':>15}  {'load p50 p99':>15}  {'append p50 p99':>15}  {'read p50 p99':>15}"
    )
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        candidates: list[tuple[str, Stores | None]] = [
            ("memory", (MemoryStateStore(), MemoryMessageLog())),
            ("redis", stack.enter_context(redis_stores(args.redis_url))),
            ("sqlite", stack.enter_context(sql_stores(f"sqlite:///{tmp / 'bench.db'}", "ctxcore_"))),
            (
                "postgres",
                stack.enter_context(sql_stores(args.postgres_url, f"ctxcore_bench_{uuid.uuid4().hex[:8]}_")),
            ),
        ]
        for name, stores in candidates:
            if stores is not None:
                measure(name, stores, args.n)
    print(f"\nsqlalchemy {sqlalchemy.__version__}, redis-py {redis.__version__}")


if __name__ == "__main__":
    main()
