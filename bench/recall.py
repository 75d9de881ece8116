"""Benchmark: the recall index at 1,000 chunks: size, load time, query latency.

Archives the bundled agent runs and the test chats (cycled, log ids renumbered) with the
default chunking (3,000 / 300 tokens, 256-token passages) until the index holds the wanted
number of chunks, then reports the index's size in bytes, ``RecallIndex.from_bytes`` (what
the fast path pays once per archive version), and the p50/p99 of ``recall`` (the tool and the
route) and of an auto-recall passage pick, over queries made of words of the archived text.
Prints a table; asserts nothing.

    .venv/bin/python bench/recall.py                 # 1,000 chunks, 500 queries
    .venv/bin/python bench/recall.py --chunks 5000
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from store_latency import percentiles

from ctxcore.messages import AnyMessage, from_openai
from ctxcore.recall import ChunkingConfig, RecallIndex, archive_messages, recall
from ctxcore.recall.auto import AutoRecall, recalled_message
from ctxcore.tokens import TiktokenCounter

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "ctxcore" / "samples" / "agent_runs.jsonl", ROOT / "tests" / "data" / "dialogue_qa.jsonl")


def messages() -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for path in SOURCES:
        for line in path.read_text(encoding="utf-8").splitlines():
            out.extend(m for m in from_openai(json.loads(line)["messages"]) if m.role != "system")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    counter = TiktokenCounter()
    pool = messages()
    chunking = ChunkingConfig()
    index: RecallIndex | None = None
    seq = 0
    started = time.perf_counter()
    while index is None or index.chunk_count() < args.chunks:
        batch = []
        for message in pool[:200]:
            seq += 1
            batch.append(message.model_copy(update={"context_message_id": f"{seq:012d}"}))
        pool = pool[200:] + pool[:200]
        index, _ = archive_messages(index, batch, counter, chunking)
    build = time.perf_counter() - started
    data = index.to_bytes()
    loads = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        RecallIndex.from_bytes(data)
        loads.append(time.perf_counter_ns() - t0)
    rng = random.Random(7)
    words = [w for m in pool[:400] for w in str(m.content).split() if w.isalpha() and len(w) > 4]
    queries = [" ".join(rng.sample(words, 6)) for _ in range(args.queries)]
    searches, picks = [], []
    for query in queries:
        t0 = time.perf_counter_ns()
        recall(index, query, 2000, counter)
        searches.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        recalled_message(AutoRecall(index), query, 1500, frozenset(), counter)
        picks.append(time.perf_counter_ns() - t0)
    print(
        f"{index.chunk_count():,} chunks from {seq:,} messages (built in {build:.1f} s, incrementally, "
        f"200 messages per archive write)\n"
    )
    print("| figure | value |")
    print("|---|---|")
    print(f"| index size | {len(data) / 1e6:.2f} MB |")
    lp50, lp99 = percentiles(loads)
    print(f"| load (`from_bytes`) p50 / p99 | {lp50:.2f} / {lp99:.2f} ms |")
    sp50, sp99 = percentiles(searches)
    print(f"| `recall` query p50 / p99 | {sp50:.2f} / {sp99:.2f} ms (goal p50 <= 5 ms) |")
    ap50, ap99 = percentiles(picks)
    print(f"| auto-recall pick p50 / p99 | {ap50:.2f} / {ap99:.2f} ms |")


if __name__ == "__main__":
    main()
