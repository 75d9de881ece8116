"""Benchmark: is ``ContextService.get_window`` flat in the length of the history? (hit path)

The agent pattern (one step appended before each window, longer tails, the redefined
floor) is ``fast_path.py``; this one windows an unchanged conversation, so it measures the
hit path, and keeps the recompute comparison and ``--recall auto``.

For conversations of 100, 1,000 and 10,000 logged messages (tau-bench runs concatenated in
file order and cycled, tool-call ids made unique per run) in a Redis-backed log, with a
saved ``CompressionState`` whose blocks cover everything up to a step boundary about 50
messages from the end (three blocks of a fixed ~600-token summary each, the task anchor
pinned), so only the history's length differs between sizes. Per size, p50/p99 of:

* ``get_window``: the fast path as served (state, budget, pinned anchors, tail, rules, assemble),
  with the 14 tau-bench airline tool definitions (and, beside it, without tools);
* the floor: the same Redis keys in one pipelined round trip (state ``LINDEX``, budget ``SET``,
  pinned ``XRANGE``, tail ``XRANGE``), not decoded;
* recomputing the window from the whole history (read the whole log, then rules and
  ``assemble_window`` over every raw message, nothing summarised): what get_window avoids.

With ``--recall auto`` the covered messages are archived (as a compaction with recall on
would have) and each size is also served by a service with auto-recall on: ``auto p50``
and ``auto/get_window`` in the same run, then the miss path (one new message appended
before each window, plain and auto alternately): ``miss auto/get_window``, goal <= 2x.

Goal: flat, p50(largest)/p50(smallest) <= 1.2 for get_window. Redis: 127.0.0.1:6379 db 10
(or an embedded server when none answers), a unique key prefix, deleted afterwards. Prints
tables; asserts nothing.

    .venv/bin/python bench/fast_path_flat.py            # quick profile (default): 300 calls per size
    .venv/bin/python bench/fast_path_flat.py --long     # 2,000 calls per size, and 50,000 messages too
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis
from store_latency import percentiles

from ctxcore.assemble import assemble_window
from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, SystemMessage, UserMessage, from_openai
from ctxcore.pipeline import block_message
from ctxcore.recall import ChunkingConfig, archive_messages
from ctxcore.render import head_tail, serialize_messages
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.turns import steps
from workers.embedded import ensure_redis
from workers.runtime import Runtime, build_service
from workers.service import InlineQueue

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
TAIL = 50
BLOCKS = 3
SUMMARY_CHARS = 2400  # about 600 tokens per block, whatever the history's length
BUDGET = 32_000


def tau_tools() -> list[dict[str, Any]]:
    """OpenAI tool definitions for the tau-bench airline tools (names and arguments from the data)."""
    arguments = {
        "book_reservation": "user_id origin destination flight_type cabin flights passengers payment_methods "
        "total_baggages nonfree_baggages insurance",
        "calculate": "expression",
        "cancel_reservation": "reservation_id",
        "get_reservation_details": "reservation_id",
        "get_user_details": "user_id",
        "list_all_airports": "",
        "search_direct_flight": "origin destination date",
        "search_onestop_flight": "origin destination date",
        "send_certificate": "user_id amount",
        "think": "thought",
        "transfer_to_human_agents": "summary",
        "update_reservation_baggages": "reservation_id total_baggages nonfree_baggages payment_id",
        "update_reservation_flights": "reservation_id cabin flights payment_id",
        "update_reservation_passengers": "reservation_id passengers",
    }
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name.replace('_', ' ').capitalize()} for the airline agent. Use it only when the "
                "policy allows it and, for any change to a booking, only after the user confirmed the exact "
                "details. Returns a JSON object, or an error message explaining what was wrong.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        arg: {
                            "type": "string",
                            "description": f"The {arg.replace('_', ' ')}, as the user gave it.",
                        }
                        for arg in args.split()
                    },
                    "required": args.split(),
                },
            },
        }
        for name, args in arguments.items()
    ]


def runs(path: Path) -> Iterator[tuple[SystemMessage | None, list[AnyMessage]]]:
    """Each run of ``path`` (cycled forever): its system message and the rest, tool ids unique."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    k = 0
    while True:
        for record in records:
            raw = []
            for m in record["messages"]:
                m = dict(m)
                if m.get("tool_calls"):
                    m["tool_calls"] = [{**c, "id": f"r{k}-{c['id']}"} for c in m["tool_calls"]]
                if m.get("tool_call_id"):
                    m["tool_call_id"] = f"r{k}-{m['tool_call_id']}"
                raw.append(m)
            messages = from_openai(raw)
            system = next((m for m in messages if isinstance(m, SystemMessage)), None)
            yield system, [m for m in messages if not isinstance(m, SystemMessage)]
            k += 1


def conversation(path: Path, n: int) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """(a system message, about ``n`` messages): whole runs, ending with the same runs for every ``n``.

    The last runs (at least ``TAIL + 10`` messages) are the same whatever ``n``, and so are
    the first run, the system message and (see ``covered_state``) the blocks: sizes differ
    only in how much history lies between them.
    """
    source = runs(path)
    system: list[AnyMessage] = []
    ending: list[AnyMessage] = []
    while len(ending) < TAIL + 10:
        run_system, messages = next(source)
        if not system and run_system is not None:
            system.append(run_system)
        ending.extend(messages)
    history: list[AnyMessage] = []
    while not history or len(history) + len(ending) < n:
        history.extend(next(source)[1])
    return system, history + ending


def covered_state(body: list[AnyMessage], ids: list[str], tail: int = TAIL) -> CompressionState:
    """Blocks over log ids 2..cursor (cursor: the last step end at least ``tail`` from the end)."""
    ends = [s.end for s in steps(body) if s.complete and s.end <= len(body) - tail]
    cursor = ends[-1] if ends else 1
    bounds = [ends[len(ends) * i // BLOCKS] for i in range(1, BLOCKS)] if len(ends) >= BLOCKS else []
    edges = [1, *bounds, cursor]
    blocks = []
    for start, end in itertools.pairwise(edges):
        if end <= start:
            continue
        first, last = ids[start], ids[end - 1]
        summary = head_tail(serialize_messages(body[start:end]), SUMMARY_CHARS, 0.5, " … ")
        message = block_message(
            summary,
            block_id=f"L1-{first}-{last}",
            first_id=first,
            last_id=last,
            level=1,
            scope="completed_react",
        )
        blocks.append(
            SummaryBlock(block_id=f"L1-{first}-{last}", messages=[message], first_id=first, last_id=last)
        )
    return CompressionState(blocks=blocks, covered_until=ids[cursor - 1], pinned=[ids[0]])


@dataclass
class Size:
    """One conversation in the log, and the samples measured on it."""

    n: int
    key: ConversationKey
    system: list[AnyMessage]
    state: CompressionState
    tail: int
    window: list[int] = field(default_factory=list)
    bare: list[int] = field(default_factory=list)
    floor: list[int] = field(default_factory=list)
    recompute: list[int] = field(default_factory=list)
    auto: list[int] = field(default_factory=list)
    miss: list[int] = field(default_factory=list)
    miss_auto: list[int] = field(default_factory=list)
    tokens: int = 0


def sample(into: list[int], n: int, call: Callable[[], object]) -> None:
    """Append the nanoseconds of ``n`` sequential calls of ``call``."""
    for _ in range(n):
        started = time.perf_counter_ns()
        call()
        into.append(time.perf_counter_ns() - started)


def miss_calls(
    runtime: Runtime, size: Size, n: int, plain: Callable[[], object], auto: Callable[[], object]
) -> None:
    """The miss path: one new user message appended (untimed, straight to the log, so no
    compaction is triggered) before each window, plain and auto-recall alternately."""
    for i in range(n):
        for into, call in ((size.miss, plain), (size.miss_auto, auto)):
            note = f"ran the check again ({i}): {len(into)} results, status ok, see the earlier output"
            runtime.log.append(size.key, [UserMessage(content=note)])
            started = time.perf_counter_ns()
            call()
            into.append(time.perf_counter_ns() - started)


def floor_call(client: redis.Redis, prefix: str, size: Size) -> Callable[[], object]:
    """The keys get_window reads and writes, in one pipelined round trip (not decoded)."""
    tag = size.key.hash_tag
    stream = f"{prefix}:{tag}:log"
    assert size.state.covered_until is not None
    cursor = int(size.state.covered_until)

    def call() -> object:
        pipe = client.pipeline(transaction=False)
        pipe.lindex(f"{prefix}:{tag}:state:history", 0)
        pipe.set(f"{prefix}:{tag}:budget", BUDGET)
        for log_id in size.state.pinned:
            pipe.xrange(stream, f"{int(log_id)}-0", f"{int(log_id)}-0", count=1)
        pipe.xrange(stream, f"{cursor + 1}-0", "+")
        return pipe.execute()

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="2,000 calls per size; sizes up to 50,000")
    parser.add_argument("--calls", type=int, help="get_window calls per size (default 300, 2000 with --long)")
    parser.add_argument("--sizes", type=int, nargs="*", help="logged messages (default 100 1000 10000)")
    parser.add_argument("--no-tools", action="store_true", help="send no tool definitions with the requests")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA / "tau_bench.jsonl")
    parser.add_argument("--recall", choices=("off", "auto"), default="off", help="also measure auto-recall")
    args = parser.parse_args()
    calls = args.calls or (2000 if args.long else 300)
    sizes = args.sizes or ([100, 1_000, 10_000, 50_000] if args.long else [100, 1_000, 10_000])
    rounds = 10  # sizes take turns, so load from elsewhere on the machine hits them alike
    recompute_calls = 10
    server = ensure_redis(args.redis_url)
    url = args.redis_url if not server.started else server.url.rsplit("/", 1)[0] + "/10"
    prefix = f"ctxcore-bench-{uuid.uuid4().hex[:8]}"
    runtime = Runtime(Settings.load({"redis": {"url": url, "key_prefix": prefix}}))
    service = build_service(runtime, InlineQueue())
    recalling = None
    if args.recall == "auto":
        auto_settings = Settings.load(
            {"redis": {"url": url, "key_prefix": prefix}, "recall": {"enabled": True, "auto": True}}
        )
        recalling = build_service(Runtime(auto_settings), InlineQueue())
    client = runtime.redis
    tools = [] if args.no_tools else tau_tools()
    print(
        f"ContextService.get_window, Redis {'embedded ' if server.started else ''}{url}, budget {BUDGET:,}, "
        f"{BLOCKS} blocks of ~{SUMMARY_CHARS // 4} tokens, the same ~{TAIL} tail messages for every size, "
        f"{len(tools)} tool definitions ({runtime.counter.count_tools(tools):,} tokens); {calls} calls per size "
        f"in {rounds} interleaved rounds ({recompute_calls} for the recompute); "
        f"python {platform.python_version()}, {os.cpu_count()} cores\n"
    )
    measured: list[Size] = []
    try:
        for n in sizes:
            system, body = conversation(args.data, n)
            key = ConversationKey("bench", f"fast-{len(body)}")
            ids: list[str] = []
            for i in range(0, len(body), 1000):
                ids += runtime.log.append(key, body[i : i + 1000])
            state = covered_state(body, ids)
            archive = None
            if recalling is not None:
                covered = [
                    m.model_copy(update={"context_message_id": i}) for m, i in zip(body, ids, strict=True)
                ]
                cut = ids.index(str(state.covered_until)) + 1
                _, archive = archive_messages(None, covered[1:cut], runtime.counter, ChunkingConfig())
                state = state.model_copy(update={"archive_version": archive.version if archive else 0})
            assert runtime.state_store.save(key, state, expected_version=0, archive=archive)
            state = runtime.state_store.load(key)
            assert state is not None and state.covered_until is not None
            tail = len(body) - ids.index(state.covered_until) - 1
            measured.append(Size(len(body), key, system, state, tail))
        for size in measured:
            result = service.get_window(size.key, BUDGET, size.system, tools)  # warm-up: caches, chain
            size.tokens = result.stats.total_tokens
        for r in range(rounds):
            for size in (
                measured[r % len(measured) :] + measured[: r % len(measured)]
            ):  # rotate who goes first
                with_tools = partial(service.get_window, size.key, BUDGET, size.system, tools)
                sample(size.window, calls // rounds, with_tools)
                sample(size.bare, calls // rounds, partial(service.get_window, size.key, BUDGET, size.system))
                sample(size.floor, calls // rounds, floor_call(client, prefix, size))
                if recalling is not None:
                    sample(
                        size.auto,
                        calls // rounds,
                        partial(recalling.get_window, size.key, BUDGET, size.system, tools),
                    )
        rules = service._rules(measured[0].key, BUDGET, runtime.counter)
        for size in measured:

            def recompute(size: Size = size) -> object:
                # No compaction: the whole log, rules and assemble over every raw message.
                everything = runtime.log.read_after(size.key, None)
                if len(everything) != size.n:
                    raise RuntimeError(f"the log of {size.key} changed under the bench (db flushed?)")
                return assemble_window(
                    CompressionState(), everything, BUDGET, size.system, tools, rules, runtime.counter
                )

            sample(size.recompute, recompute_calls, recompute)
            print(f"  {size.n:>6,} messages measured", flush=True)
        for size in measured:
            # The same window all along: nothing else touched the keys while we measured.
            if service.get_window(size.key, BUDGET, size.system, tools).stats.total_tokens != size.tokens:
                raise RuntimeError(f"the state of {size.key} changed under the bench (db flushed?)")
        if recalling is not None:
            # Last: the appends change the keys the checks above compare against.
            for size in measured:
                miss_calls(
                    runtime,
                    size,
                    calls // 2,
                    partial(service.get_window, size.key, BUDGET, size.system, tools),
                    partial(recalling.get_window, size.key, BUDGET, size.system, tools),
                )
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        if server.started:
            server.stop()

    print(
        f"\n| {'log messages':>12} | tail | window tokens | {'get_window p50':>14} | {'p99':>6} | no tools p50 | "
        f"{'floor p50':>9} | {'p99':>6} | get_window/floor | {'recompute p50':>13} | {'p99':>7} | "
        "recompute/get_window |"
    )
    print("|" + "|".join("-" * w for w in (14, 6, 15, 16, 8, 14, 11, 8, 18, 15, 9, 22)) + "|")
    for size in measured:
        (w50, w99), (f50, f99), (r50, r99) = (
            percentiles(size.window),
            percentiles(size.floor),
            percentiles(size.recompute),
        )
        print(
            f"| {size.n:>12,} | {size.tail:>4} | {size.tokens:>13,} | {w50:>14.2f} | {w99:>6.2f} | "
            f"{percentiles(size.bare)[0]:>12.2f} | {f50:>9.3f} | {f99:>6.3f} | {w50 / f50:>16.1f} | "
            f"{r50:>13.1f} | {r99:>7.1f} | {r50 / w50:>20.0f} |"
        )
    if recalling is not None:
        print(
            "\n| log messages | get_window p50 | auto-recall p50 | auto/get_window | "
            "miss get_window p50 | miss auto-recall p50 | miss auto/get_window |"
        )
        print("|---|---|---|---|---|---|---|")
        for size in measured:
            w50, a50 = percentiles(size.window)[0], percentiles(size.auto)[0]
            m50, ma50 = percentiles(size.miss)[0], percentiles(size.miss_auto)[0]
            print(
                f"| {size.n:,} | {w50:.2f} | {a50:.2f} | {a50 / w50:.2f} | {m50:.2f} | {ma50:.2f} | "
                f"{ma50 / m50:.2f} (goal <= 2) |"
            )
    first, last = percentiles(measured[0].window)[0], percentiles(measured[-1].window)[0]
    print(
        f"\nflatness: get_window p50({measured[-1].n:,}) / p50({measured[0].n:,}) = {last / first:.2f} "
        f"(goal <= 1.2: {'met' if last / first <= 1.2 else 'NOT met'}); milliseconds."
    )


if __name__ == "__main__":
    main()
