"""Benchmark: the fast path as agents call it, one step appended before every window.

A conversation of 10,000 logged messages (tau-bench runs, built as in ``fast_path_flat.py``)
whose saved state covers all but its newest T messages: T = 50 (workers keep up), 500 and
5,000 (workers lag). Each round starts from that nominal tail (the previous round's steps
taken back with ``truncate_after``) and appends at most ``--steps`` steps (default 10), one
before each window. Per tail, p50/p95/p99 of:

* ``miss``: ``get_window`` right after an append: what an agent does, the figure the goals use;
* ``hit``: ``get_window`` again with nothing appended: what a window cache could serve;
* ``append``: ``ContextService.append`` of the step (an assistant tool call and its result:
  validated against the tail, counted and stored with its count), timed apart;
* ``floor``: what one read script per window would do, in one pipelined round trip with
  results left undecoded: the state, the pinned entries, the first newest-first tail page
  (``XREVRANGE ... COUNT 128``), the failure record, the compaction hash and the budget
  (``GET``; a window writes it only when it changed).

``--caches`` then measures the agent step (append + window) at the first tail with each
cache of the path removed in turn, in the same run: one service per variant, the variants
interleaved step by step, each step from the nominal tail (the previous step taken back,
untimed). A cache stays only if removing it costs more than 20% of the step p50 (issue 41).

The queue is scheduler-backed: a window's status comes from the failure record and the
scheduler as ``CeleryQueue`` reads it; a request queues in the scheduler, and no task is
sent (no worker runs). Tools: the 14 tau-bench airline definitions. Redis 127.0.0.1:6379
db 10 (or an embedded server), a unique key prefix deleted afterwards. Asserts nothing.

    .venv/bin/python bench/fast_path.py                 # 20 rounds: 200 windows per path at tails <= 500
    .venv/bin/python bench/fast_path.py --rounds 5      # quicker
    .venv/bin/python bench/fast_path.py --tails 50 --rounds 3 --caches 30   # what each cache earns
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import platform
import pstats
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fast_path_flat import BUDGET, DEFAULT_DATA, conversation, covered_state, tau_tools
from fast_path_parts import SchedulerQueue, Tail, floor_call, pct, step

import workers.service.context_service as service_module
from ctxcore.config import Settings
from ctxcore.messages import AnyMessage
from ctxcore.state import ConversationKey
from ctxcore.tokens import TiktokenCounter
from ctxcore.window_counter import WindowCounter
from workers.embedded import ensure_redis
from workers.runtime import Runtime, build_service
from workers.service import ContextService

LOG_MESSAGES = 10_000
TAILS = (50, 500, 5_000)
# Tails over this get a fifth of the rounds (at least 3): a window there reads and rules the
# whole tail (about a second at 5,000 messages) until newest-first reads land.
SLOW_TAIL = 500


class Forgetful(dict):  # type: ignore[type-arg]
    """A dict that stores nothing: a cache that always misses."""

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def setdefault(self, key: object, default: object = None) -> object:
        return default


class NoDecoded:
    """``DecodedEntries`` that decode every time."""

    def decode(self, rows: object, decode: Callable[[object], object]) -> object:
        return decode(rows)

    def __len__(self) -> int:
        return 0


class NoMemoCounter(WindowCounter):
    """``WindowCounter`` without its memo (nor the stored counts it is seeded with)."""

    def count_message(self, message: AnyMessage) -> int:
        return self.inner.count_message(message)

    def seed(self, message: AnyMessage, count: int) -> None:
        pass

    def sum_messages(self, messages: object) -> int:
        return sum(self.inner.count_message(m) for m in messages)  # type: ignore[attr-defined]

    def count_tools(self, tools: object) -> int:
        return self.inner.count_tools(tools)  # type: ignore[arg-type]


def without(
    name: str, service: ContextService, runtime: Runtime
) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The context a variant's step runs in: ``service`` with the cache ``name`` removed."""
    reader: Any = service._window_reader
    if name == "tiktoken_lru":
        service.counter = TiktokenCounter(cache_size=0)
    elif name == "counters_by_encoding":
        service._counters = Forgetful()
    elif name not in ("all", "all_with_model", "decoded_entries", "window_counter_memo"):
        raise SystemExit(f"unknown cache {name!r}")

    @contextlib.contextmanager
    def swapped() -> Iterator[None]:
        if name == "window_counter_memo":
            service_module.WindowCounter = NoMemoCounter  # type: ignore[misc]
        elif name == "decoded_entries":  # shared by the log and its reader
            kept, runtime.log.decoded, reader.decoded = runtime.log.decoded, NoDecoded(), NoDecoded()  # type: ignore[attr-defined]
        try:
            yield
        finally:
            service_module.WindowCounter = WindowCounter  # type: ignore[misc]
            if name == "decoded_entries":
                runtime.log.decoded = reader.decoded = kept  # type: ignore[attr-defined]

    return swapped


# Each cache left under append and get_window (issue 41 removed the rule chains by budget,
# the offload-handle memo, the window counter's memo, the decoded states and the Redis
# reader's second read shape: each saved under 20% of the step).
CACHES = (
    "all",
    "tiktoken_lru",
    "window_counter_memo",
    "decoded_entries",
    # The request names its model (as the proxy's do): one counter per encoding, or one per window.
    "all_with_model",
    "counters_by_encoding",
)
MODEL_VARIANTS = ("all_with_model", "counters_by_encoding")


def cache_variants(runtime: Runtime, size: Tail, tools: list[Any], rounds: int, first_serial: int) -> None:
    """The agent step at ``size`` with each cache removed in turn, interleaved (module docstring)."""
    variants = []
    for name in CACHES:
        service = build_service(runtime, SchedulerQueue(runtime))
        variants.append((name, service, without(name, service, runtime)))
        service.get_window(size.key, BUDGET, size.system, tools)  # warm-up
    steps: dict[str, list[int]] = {name: [] for name in CACHES}
    floors: list[int] = []
    floor = floor_call(runtime.redis, runtime.settings.redis.key_prefix, runtime, size)
    windows: dict[str, list[int]] = {name: [] for name in CACHES}
    serial = first_serial
    for r in range(rounds):
        for _ in range(10):
            for name, service, context in variants[r % len(variants) :] + variants[: r % len(variants)]:
                serial += 1
                runtime.log.truncate_after(size.key, size.nominal_last)
                with context():
                    started = time.perf_counter_ns()
                    service.append(size.key, step(serial))
                    appended = time.perf_counter_ns()
                    model = "gpt-4o" if name in MODEL_VARIANTS else None
                    service.get_window(size.key, BUDGET, size.system, tools, model)
                    done = time.perf_counter_ns()
                steps[name].append(done - started)
                windows[name].append(done - appended)
                if name == "all":
                    started = time.perf_counter_ns()
                    floor()
                    floors.append(time.perf_counter_ns() - started)
    base = pct(steps["all"])[0]
    with_model = pct(steps["all_with_model"])[0]
    print(
        f"\nagent step p50 with every cache {base:.2f} ms, floor p50 {pct(floors)[0]:.3f} ms: "
        f"{base / pct(floors)[0]:.1f}x the floor"
    )
    print(
        f"\nAgent step (append + window) at tail {size.tail:,} with each cache removed ({len(steps['all'])} steps each):"
    )
    print("| removed | step p50 | window p50 | step / all caches (with a model: all_with_model) |")
    print("|---|---|---|---|")
    for name in CACHES:
        p50 = pct(steps[name])[0]
        ratio = p50 / (with_model if name in MODEL_VARIANTS else base)
        print(f"| {name} | {p50:.2f} | {pct(windows[name])[0]:.2f} | {ratio:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per tail (default 20)")
    parser.add_argument(
        "--steps", type=int, default=10, help="steps appended per round, at most 10 (default 10)"
    )
    parser.add_argument(
        "--tails", type=int, nargs="*", default=list(TAILS), help="tails (default 50 500 5000)"
    )
    parser.add_argument(
        "--caches", type=int, metavar="ROUNDS", help="then measure each cache removed, ROUNDS x 10 steps"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    parser.add_argument(
        "--retention-days",
        type=int,
        default=None,
        help="service.retention_days (default none): appends and windows then keep key TTLs",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA / "tau_bench.jsonl")
    parser.add_argument(
        "--profile", type=int, metavar="N", help="cProfile the miss path of the first tail; print the top N"
    )
    args = parser.parse_args()
    if not 1 <= args.steps <= 10:
        parser.error("--steps must be between 1 and 10")
    server = ensure_redis(args.redis_url)
    url = args.redis_url if not server.started else server.url.rsplit("/", 1)[0] + "/10"
    prefix = f"ctxcore-bench-{uuid.uuid4().hex[:8]}"
    runtime = Runtime(
        Settings.load(
            {"redis": {"url": url, "key_prefix": prefix}, "service": {"retention_days": args.retention_days}}
        )
    )
    service = build_service(runtime, SchedulerQueue(runtime))
    client = runtime.redis
    tools = tau_tools()
    print(
        f"ContextService.get_window as agents call it: Redis {'embedded ' if server.started else ''}{url}, "
        f"{LOG_MESSAGES:,} log messages, budget {BUDGET:,}, {len(tools)} tool definitions, scheduler-backed "
        f"status; retention {args.retention_days or 'none'} days; "
        f"{args.rounds} rounds x {args.steps} steps per tail; python {platform.python_version()}, "
        f"{os.cpu_count()} cores\n"
    )
    measured: list[Tail] = []
    serial = 0
    try:
        for tail in args.tails:
            system, body = conversation(args.data, LOG_MESSAGES)
            key = ConversationKey("bench", f"agent-{tail}")
            ids: list[str] = []
            for i in range(0, len(body), 1000):
                # Counted as the service's appends count (stored counts, real-user flags).
                chunk = body[i : i + 1000]
                counts = service.append_counts(body[max(0, i - 64) : i], chunk)
                if counts is None:
                    raise RuntimeError("the bench needs the default TiktokenCounter")
                counted = runtime.log.counted()
                if counted is None:
                    raise RuntimeError("the bench needs a log with stored counts")
                ids += counted.append_counted(key, chunk, counts)
            state = covered_state(body, ids, tail)
            if not runtime.state_store.save(key, state, expected_version=0):
                raise RuntimeError(f"could not save the state of {key}")
            saved = runtime.state_store.load(key)
            if saved is None or saved.covered_until is None:
                raise RuntimeError(f"the state of {key} did not load")
            cursor = int(saved.covered_until)
            size = Tail(
                len(body) - ids.index(saved.covered_until) - 1, key, system, ids[-1], cursor, saved.pinned
            )
            service.get_window(key, BUDGET, system, tools)  # warm-up: caches, the rule chain
            measured.append(size)
            print(f"  tail {size.tail:>5,}: {len(body):,} messages logged", flush=True)
        profiler = cProfile.Profile() if args.profile else None
        for r in range(args.rounds):
            for size in measured[r % len(measured) :] + measured[: r % len(measured)]:
                if size.tail > SLOW_TAIL and r >= max(3, args.rounds // 5):
                    continue
                runtime.log.truncate_after(size.key, size.nominal_last)  # back to the nominal tail
                floor = floor_call(client, prefix, runtime, size)
                for _ in range(args.steps):
                    serial += 1
                    started = time.perf_counter_ns()
                    service.append(size.key, step(serial))
                    size.append.append(time.perf_counter_ns() - started)
                    profiling = profiler is not None and size is measured[0]
                    if profiling:
                        profiler.enable()
                    started = time.perf_counter_ns()
                    result = service.get_window(size.key, BUDGET, size.system, tools)
                    size.miss.append(time.perf_counter_ns() - started)
                    size.step.append(size.append[-1] + size.miss[-1])
                    if profiling:
                        profiler.disable()
                    size.fallback += int(result.fallback_applied)
                    started = time.perf_counter_ns()
                    service.get_window(size.key, BUDGET, size.system, tools)
                    size.hit.append(time.perf_counter_ns() - started)
                    started = time.perf_counter_ns()
                    floor()
                    size.floor.append(time.perf_counter_ns() - started)
        if args.caches:
            cache_variants(runtime, measured[0], tools, args.caches, serial)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        if server.started:
            server.stop()

    if profiler is not None:
        print(f"\ncProfile of {len(measured[0].miss)} miss-path windows at tail {measured[0].tail}:")
        for order in ("cumulative", "tottime"):
            pstats.Stats(profiler).strip_dirs().sort_stats(order).print_stats(args.profile)
    print(
        "\n| tail | windows | fallback | miss p50 | p95 | p99 | hit p50 | p99 | append p50 | p99 | "
        "floor p50 | p99 | miss/floor | miss/miss(first tail) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    first = pct(measured[0].miss)[0]
    for size in measured:
        m, h, a, f = pct(size.miss), pct(size.hit), pct(size.append), pct(size.floor)
        print(
            f"| {size.tail:,} | {len(size.miss)} | {size.fallback} | {m[0]:.2f} | {m[1]:.2f} | {m[2]:.2f} | "
            f"{h[0]:.2f} | {h[2]:.2f} | {a[0]:.2f} | {a[2]:.2f} | {f[0]:.3f} | {f[2]:.3f} | "
            f"{m[0] / f[0]:.1f} | {m[0] / first:.1f} |"
        )
    small, large = measured[0], measured[-1]
    ratio = pct(small.miss)[0] / pct(small.floor)[0]
    print(
        f"\nagent step (append + window) p50 at tail {small.tail:,}: {pct(small.step)[0]:.2f} ms, "
        f"{pct(small.step)[0] / pct(small.floor)[0]:.1f}x the floor"
    )
    print(
        f"\nmiss p50 / floor p50 at tail {small.tail:,}: {ratio:.1f} (goal <= 2: {'met' if ratio <= 2 else 'NOT met'}); "
        f"miss p50 tail {large.tail:,} / tail {small.tail:,}: {pct(large.miss)[0] / pct(small.miss)[0]:.1f} "
        f"(goal <= 20: {'met' if pct(large.miss)[0] / pct(small.miss)[0] <= 20 else 'NOT met'}); milliseconds."
    )


if __name__ == "__main__":
    main()
