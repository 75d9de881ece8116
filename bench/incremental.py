"""Benchmark: incremental compaction versus re-summarising the whole history, and store latency.

A 2,000-turn conversation is made from ``../shared/data`` by concatenating tau-bench runs and
LoCoMo conversations (appending from whichever source has fewer turns so far, only the first
system message kept, tool-call ids made unique per run); ``check_window`` must find no
violation in it. It is appended to a log 50 turns at a time and compacted after each append:

* incremental: ``Coordinator.compress`` on memory stores (previous blocks + only the new
  range), with ``ctxcore.summarize.strategies.model(ExtractiveModel)`` behind a wrapper that
  records what every call is sent: the request's tokens, and the pending + context messages'
  tokens (the contract's sources and context);
* incremental, uncapped: the same with every earlier block as the summariser's context (how
  ``run_stage`` did it before ``SUMMARIZER_CONTEXT_RATIO`` capped it), for comparison;
* naive: at the same points, the same strategy re-summarises the whole history from scratch
  (no previous blocks); its calls go to a stub that only counts (the request does not depend
  on the reply).

Reported: tokens sent to the summariser by each, and their ratio to the conversation's own
tokens (goal: incremental <= 1.3x). Then the I/O of the incremental run replayed on each
backend (memory; Redis at 127.0.0.1:6379 db 10 with a unique prefix; SQLite in a temporary
file; PostgreSQL with a unique table prefix; a backend whose server is absent is skipped with
the reason): p50/p99 of ``read_after`` (the pending range after the previous cursor) and of
the CAS ``save`` of each new state. Everything written is removed. Prints tables; asserts
nothing.

    .venv/bin/python bench/incremental.py            # quick profile (default): 2,000 turns, 3 replays
    .venv/bin/python bench/incremental.py --long     # 4,000 turns, 10 replays per backend
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from fast_path_flat import runs
from store_latency import Stores, percentiles, redis_stores, sql_stores

import ctxcore.pipeline.running as running_module
from ctxcore.coordinator import Coordinator
from ctxcore.messages import AnyMessage
from ctxcore.state import CompressionState, ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, ModelClient, OutputContract, Usage
from ctxcore.summarize.strategies import model as model_strategy
from ctxcore.tokens import TiktokenCounter, TokenCounter
from ctxcore.turns import turns
from ctxcore.window import check_window

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
SOURCES = ("tau_bench.jsonl", "locomo.jsonl")


def conversation(data: Path, n_turns: int) -> tuple[list[AnyMessage], list[int]]:
    """The messages of ``n_turns`` turns and the index where each turn starts."""
    sources = {name: runs(data / name) for name in SOURCES}
    have = dict.fromkeys(SOURCES, 0)
    body: list[AnyMessage] = []
    while True:
        name = min(have, key=lambda k: have[k])
        _, messages = next(sources[name])
        have[name] += len(turns(messages))
        body.extend(messages)
        found = turns(body)
        if len(found) > n_turns:
            return body[: found[n_turns].start], [t.start for t in found[:n_turns]]


@dataclass
class Recorder:
    """What each summariser call was sent: request tokens, and pending + context tokens."""

    counter: TokenCounter
    inner: ModelClient | None = None
    sent: list[int] = field(default_factory=list)
    payload: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        """The wrapped model's name."""
        return self.inner.name if self.inner is not None else "counting-stub"

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """Record, then answer with the wrapped model (or a one-line stub summary)."""
        self.sent.append(self.counter.count_messages(messages))
        if contract is not None:
            sources = [m for b in contract.blocks for m in b.source] + list(contract.source)
            self.payload.append(
                self.counter.count_messages(sources) + self.counter.count_messages(contract.context)
            )
        if self.inner is None:
            return Completion('{"blocks": [{"block_id": "summary", "summary": "stub"}]}', Usage(0, 0, 0, 1))
        started = time.perf_counter()
        try:
            return self.inner.complete(messages, max_tokens=max_tokens, contract=contract)
        finally:
            self.seconds += time.perf_counter() - started


@dataclass
class Replay:
    """The incremental run's I/O, to replay on other backends."""

    chunks: list[list[AnyMessage]] = field(default_factory=list)
    cursors: list[str | None] = field(default_factory=list)  # read_after cursor before each compaction
    states: list[CompressionState | None] = field(default_factory=list)  # saved after it (None: skipped)


def incremental(
    body: list[AnyMessage], starts: list[int], every: int, budget: int, counter: TokenCounter
) -> tuple[Recorder, Replay, dict[str, float]]:
    """``Coordinator.compress`` after every ``every`` turns, on memory stores."""
    recorder = Recorder(counter, ExtractiveModel(counter))
    store, log = MemoryStateStore(), MemoryMessageLog()
    key = ConversationKey("bench", "incremental")
    store.set_budget(key, budget)
    coordinator = Coordinator(store, log, counter, lambda _: recorder, trigger=lambda _: True)
    replay = Replay()
    bounds = [*starts[every::every], len(body)]
    previous = 0
    started = time.perf_counter()
    outcomes: dict[str, float] = {}
    for end in bounds:
        chunk = body[previous:end]
        previous = end
        log.append(key, chunk)
        state = store.load(key)
        replay.chunks.append(chunk)
        replay.cursors.append(state.covered_until if state else None)
        result = coordinator.compress(key)
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
        replay.states.append(result.state if result.outcome == "compressed" else None)
    final = store.load(key)
    outcomes["seconds"] = time.perf_counter() - started
    outcomes["blocks"] = len(final.blocks) if final else 0
    outcomes["pinned"] = len(final.pinned) if final else 0
    return recorder, replay, outcomes


def naive(
    body: list[AnyMessage], starts: list[int], every: int, keep_recent: int, counter: TokenCounter
) -> Recorder:
    """At the same points, one summary of everything so far (no previous blocks)."""
    recorder = Recorder(counter)
    summarize = model_strategy(recorder)
    for end in [*starts[every::every], len(body)]:
        summarize([], body[: max(end - keep_recent, 1)], 2000)
    return recorder


def replay_on(stores: Stores, replay: Replay) -> tuple[list[int], list[int]]:
    """Append, read_after and save as the incremental run did; nanoseconds of reads and saves."""
    state_store, log = stores
    key = ConversationKey("bench", f"replay-{uuid.uuid4().hex[:8]}")
    reads: list[int] = []
    saves: list[int] = []
    version = 0
    for chunk, cursor, state in zip(replay.chunks, replay.cursors, replay.states, strict=True):
        log.append(key, chunk)
        started = time.perf_counter_ns()
        log.read_after(key, cursor)
        reads.append(time.perf_counter_ns() - started)
        if state is None:
            continue
        fresh = CompressionState(blocks=state.blocks, covered_until=state.covered_until, pinned=state.pinned)
        started = time.perf_counter_ns()
        saved = state_store.save(key, fresh, expected_version=version)
        saves.append(time.perf_counter_ns() - started)
        assert saved, "the replayed save lost its compare-and-swap"
        version += 1
    state_store.delete(key)
    log.delete(key)
    return reads, saves


def _ratio_row(name: str, recorder: Recorder, own: int) -> str:
    sent, payload = sum(recorder.sent), sum(recorder.payload)
    return (
        f"| {name:<12} | {len(recorder.sent):>5} | {sent:>14,} | {sent / own:>9.2f}x | {payload:>16,} | "
        f"{payload / own:>10.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="4,000 turns and 10 replays per backend")
    parser.add_argument(
        "--turns", type=int, help="turns in the conversation (default 2000, 4000 with --long)"
    )
    parser.add_argument("--every", type=int, default=50, help="turns between compactions")
    parser.add_argument(
        "--budget", type=int, default=32_000, help="the conversation's budget (sets the targets)"
    )
    parser.add_argument("--replays", type=int, help="replays per backend (default 3, 10 with --long)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/10")
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    n_turns = args.turns or (4000 if args.long else 2000)
    replays = args.replays or (10 if args.long else 3)
    counter = TiktokenCounter()

    body, starts = conversation(args.data, n_turns)
    violations = check_window(body)
    own = counter.count_messages(body)
    print(
        f"{len(starts):,} turns, {len(body):,} messages, {own:,} tokens (tau-bench + LoCoMo), "
        f"check_window violations: {len(violations)}; compaction every {args.every} turns, budget {args.budget:,}; "
        f"python {platform.python_version()}, {os.cpu_count()} cores\n"
    )
    inc, replay, outcomes = incremental(body, starts, args.every, args.budget, counter)
    # For comparison: every earlier block as context, as before the summarizer context was capped.
    capped = (running_module.SUMMARIZER_CONTEXT_RATIO, running_module.SUMMARIZER_CONTEXT_FLOOR)
    running_module.SUMMARIZER_CONTEXT_RATIO, running_module.SUMMARIZER_CONTEXT_FLOOR = 10**6, 10**12
    try:
        uncapped, _, _ = incremental(body, starts, args.every, args.budget, counter)
    finally:
        running_module.SUMMARIZER_CONTEXT_RATIO, running_module.SUMMARIZER_CONTEXT_FLOOR = capped
    keep_recent = Coordinator(
        MemoryStateStore(), MemoryMessageLog(), counter, lambda _: inc
    ).keep_recent_messages
    nai = naive(body, starts, args.every, keep_recent, counter)
    header = f"| {'summariser':<12} | calls | {'request tokens':>14} | {'/ own':>10} | {'pending+context':>16} | {'/ own':>11} |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    print(_ratio_row("incremental", inc, own))
    print(_ratio_row("  uncapped", uncapped, own))
    print(_ratio_row("naive", nai, own))
    ratio = sum(inc.sent) / own
    print(
        f"\nincremental / naive request tokens: {sum(inc.sent) / sum(nai.sent):.3f}; goal incremental <= 1.3x own: "
        f"{'met' if ratio <= 1.3 else 'NOT met'} ({ratio:.2f}x). Incremental run: "
        f"{outcomes.get('compressed', 0):.0f} compressed, {outcomes.get('skipped', 0):.0f} skipped, "
        f"{outcomes.get('failed', 0):.0f} failed; final state {outcomes['blocks']:.0f} blocks, "
        f"{outcomes['pinned']:.0f} pinned; {outcomes['seconds']:.1f} s ({inc.seconds:.1f} s in the model)."
    )

    print(
        f"\nstore latency, ms, the incremental run's I/O replayed {replays}x per backend "
        f"(read_after = the pending range, ~{args.every} turns; save = CAS of the new state)"
    )
    print(
        f"| {'backend':<10} | {'read_after p50':>14} | {'p99':>7} | {'save p50':>8} | {'p99':>7} | samples |"
    )
    print("|------------|----------------|---------|----------|---------|---------|")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        backends: list[tuple[str, Callable[[], Stores | None]]] = [
            ("memory", lambda: (MemoryStateStore(), MemoryMessageLog())),
            ("redis", lambda: stack.enter_context(redis_stores(args.redis_url))),
            ("sqlite", lambda: stack.enter_context(sql_stores(f"sqlite:///{tmp / 'bench.db'}", "ctxcore_"))),
            (
                "postgres",
                lambda: stack.enter_context(
                    sql_stores(args.postgres_url, f"ctxcore_bench_{uuid.uuid4().hex[:8]}_")
                ),
            ),
        ]
        for name, make in backends:
            stores = make()
            if stores is None:
                continue
            reads: list[int] = []
            saves: list[int] = []
            for _ in range(replays):
                r, s = replay_on(stores, replay)
                reads += r
                saves += s
            (r50, r99), (s50, s99) = percentiles(reads), percentiles(saves)
            print(
                f"| {name:<10} | {r50:>14.3f} | {r99:>7.3f} | {s50:>8.3f} | {s99:>7.3f} | {len(reads):>7} |"
            )


if __name__ == "__main__":
    main()
