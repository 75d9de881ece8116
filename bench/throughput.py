"""Benchmark: compactions per second with 1 and 2 worker processes, and our overhead per stage.

Conversations: tau-bench runs in file order (``--conversations``, default 60), each logged
whole in Redis with a budget of ``--budget-ratio`` (default 0.5) of its tokens, keeping only
those that are over their compaction target. Summariser: the offline ``ExtractiveModel``.

1. Overhead per stage (in this process, no Celery): each conversation compacted stage by
   stage through a ``Coordinator`` on the Redis stores (``plan`` then ``run_stage``, as the
   stage tasks do), the model call timed apart. Per stage kind: p50 of the whole stage, of
   the model call and of the rest (planning, view and log reads, targets, rendering, CAS
   save): our own overhead.
2. Throughput: the same conversations (fresh keys) compacted by real
   ``celery -A workers.app worker --pool solo`` subprocesses (1, then 2), each a single
   worker process, configured through ``CTXCORE_*`` variables. The clock starts once every
   worker answers a ping; all compactions are requested at once through the fair scheduler
   (``request_compaction``); it stops when every conversation is idle again. Reported:
   compactions (jobs) per second, stages per second, and the worker-side mean stage time.

Redis: 127.0.0.1:6379 db 13 by default (an embedded server when none answers), unique key
prefixes (Celery's queue and result keys carry them too), exactly the run's keys removed
afterwards. Prints tables; asserts nothing.

    .venv/bin/python bench/throughput.py              # quick: 60 conversations
    .venv/bin/python bench/throughput.py --long       # 200 conversations
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.eval.data import Conversation, load_conversations
from ctxcore.messages import AnyMessage
from ctxcore.state import ConversationKey
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, OutputContract
from ctxcore.tokens import TiktokenCounter

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
ROOT = Path(__file__).resolve().parents[1]


class TimedModel:
    """``ExtractiveModel`` whose call time is accumulated apart."""

    def __init__(self, inner: ExtractiveModel) -> None:
        self.inner = inner
        self.seconds = 0.0

    @property
    def name(self) -> str:
        return self.inner.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        started = time.perf_counter()
        try:
            return self.inner.complete(messages, max_tokens=max_tokens, contract=contract)
        finally:
            self.seconds += time.perf_counter() - started


def pick(
    convs: list[Conversation], n: int, ratio: float, counter: TiktokenCounter
) -> list[tuple[Conversation, int]]:
    """The first ``n`` conversations that are over their target at ``ratio`` of their tokens."""
    out = []
    for conv in convs:
        if len(out) >= n:
            break
        total = counter.count_messages([*conv.system, *conv.messages])
        budget = int(total * ratio)
        # The workers do not see the system prompt: the view is the logged messages.
        if counter.count_messages(list(conv.messages)) > int(budget * 0.75) + 200:
            out.append((conv, budget))
    return out


def load(rt: Any, tenant: str, picked: list[tuple[Conversation, int]]) -> list[ConversationKey]:
    keys = []
    for n, (conv, budget) in enumerate(picked):
        key = ConversationKey(tenant, f"c{n:04d}")
        rt.log.append(key, list(conv.messages))
        rt.state_store.set_budget(key, budget)
        keys.append(key)
    return keys


def overhead(rt: Any, keys: list[ConversationKey]) -> list[str]:
    """Part 1: stage by stage in this process, model time apart."""
    model = TimedModel(ExtractiveModel(rt.counter))
    service = rt.settings.service
    coord = Coordinator(
        rt.state_store,
        rt.log,
        rt.counter,
        lambda _k: model,
        trigger_ratio=service.trigger_ratio,
        target_ratio=service.target_ratio,
        keep_recent_messages=rt.settings.engine.keep_recent_messages,
        detector=rt.detector,
    )
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for key in keys:
        exhausted: list[str] = []
        for _ in range(32):
            t0 = time.perf_counter()
            stage = coord.plan(key, exhausted=exhausted)
            plan_s = time.perf_counter() - t0
            if stage is None:
                break
            model.seconds = 0.0
            t1 = time.perf_counter()
            result = coord.run_stage(key, stage)
            run_s = time.perf_counter() - t1
            rows[stage.kind].append((plan_s + run_s, model.seconds, plan_s + run_s - model.seconds))
            if result.outcome in ("skipped", "failed"):
                exhausted.append(stage.kind)
    lines = [
        "| stage | runs | p50 stage ms | p50 model ms | p50 our ms | p90 our ms | our share |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, values in rows.items():
        total = [v[0] * 1000 for v in values]
        model_ms = [v[1] * 1000 for v in values]
        ours = [v[2] * 1000 for v in values]
        share = sum(ours) / sum(total) if sum(total) else 0.0
        lines.append(
            f"| {kind} | {len(values)} | {statistics.median(total):.1f} | {statistics.median(model_ms):.1f} "
            f"| {statistics.median(ours):.1f} | {statistics.quantiles(ours, n=10)[-1] if len(ours) > 1 else ours[0]:.1f} "
            f"| {share:.0%} |"
        )
    return lines


def start_workers(n: int, url: str, prefix: str, metrics_dir: str) -> list[subprocess.Popen[bytes]]:
    from workers.app import queue_names

    queues = ",".join(queue_names(Settings.load({"redis": {"key_prefix": prefix}})).consume_order())
    env = {**os.environ, "CTXCORE_REDIS__URL": url, "CTXCORE_REDIS__KEY_PREFIX": prefix}
    env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    env.pop("CTXCORE_CONFIG_FILE", None)
    procs = []
    for i in range(n):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "workers.app",
                    "worker",
                    "--pool",
                    "solo",
                    "-Q",
                    queues,
                    "-n",
                    f"bench{i}-{prefix}@%h",
                    "--loglevel",
                    "WARNING",
                    "--without-gossip",
                    "--without-mingle",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return procs


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def throughput(
    settings: Settings, picked: list[tuple[Conversation, int]], workers: int, timeout: float
) -> dict[str, float]:
    """Part 2: compactions by ``workers`` celery worker processes."""
    from workers.app import app, configure, runtime
    from workers.tasks import request_compaction

    prefix = f"{settings.redis.key_prefix}w{workers}"
    settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"key_prefix": prefix})})
    configure(settings)
    rt = runtime()
    keys = load(rt, "tput", picked)
    # The workers record their stages there (prometheus-client's multiprocess mode).
    metrics_dir = tempfile.mkdtemp(prefix="ctxcore-throughput-metrics-")
    procs = start_workers(workers, settings.redis.url, prefix, metrics_dir)
    try:
        deadline = time.monotonic() + 60
        names = {f"bench{i}-{prefix}" for i in range(workers)}
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=0.5) or []
            answered = {name.split("@", 1)[0] for reply in replies for name in reply}
            if names <= answered:
                break
        else:
            raise RuntimeError("the worker processes did not answer a ping within 60 s")
        # Warm-up outside the clock: each worker builds its runtime and loads the tokenizer
        # on its first task.
        warm = load(rt, "warmup", picked[: 2 * workers])
        for key in warm:
            request_compaction(key, reason="warm-up")
        deadline = time.monotonic() + 60
        while any(rt.scheduler.status(k) != "idle" for k in warm) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The workers' stage series, summed over their processes' files.
        from workers.prom_worker import snapshot

        before = snapshot(metrics_dir)
        started = time.perf_counter()
        for key in keys:
            request_compaction(key, reason="bench")
        deadline = time.monotonic() + timeout
        pending = set(keys)
        while pending and time.monotonic() < deadline:
            pending = {k for k in pending if rt.scheduler.status(k) != "idle"}
            if pending:
                time.sleep(0.02)
        elapsed = time.perf_counter() - started
        after = snapshot(metrics_dir)
        snap = {k: v - before.get(k, 0.0) for k, v in after.items()}
        stages = sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_count"))
        stage_sum = sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_sum"))
        stage_count = sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_count"))
        within = sum(1 for k in keys if rt.coordinator.plan(k) is None)
        return {
            "workers": workers,
            "conversations": len(keys),
            "unfinished": len(pending),
            "within_target": within,
            "seconds": elapsed,
            "compactions_per_s": (len(keys) - len(pending)) / elapsed,
            "stages": stages,
            "stages_per_s": stages / elapsed,
            "mean_stage_ms": 1000 * stage_sum / stage_count if stage_count else 0.0,
        }
    finally:
        stop_workers(procs)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def cleanup(url: str, prefixes: list[str]) -> None:
    """Delete exactly the run's keys (Celery's carry the prefix too: global_keyprefix)."""
    import redis

    from workers.keyspace import delete_prefixed_keys

    client = redis.Redis.from_url(url)
    for prefix in prefixes:
        delete_prefixed_keys(client, prefix)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="200 conversations")
    parser.add_argument("--conversations", type=int, help="conversations (default 60, 200 with --long)")
    parser.add_argument(
        "--budget-ratio", type=float, default=0.5, help="budget as a share of each run's tokens"
    )
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="worker process counts")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per throughput run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA / "tau_bench.jsonl")
    args = parser.parse_args()
    n = args.conversations or (200 if args.long else 60)
    if not args.data.exists():
        raise SystemExit(f"no data at {args.data} (set CTXCORE_DATA_DIR)")

    from workers.app import configure, runtime
    from workers.embedded import ensure_redis

    server = ensure_redis(args.redis_url)
    url = server.url if server.started else args.redis_url
    prefix = f"tput{uuid.uuid4().hex[:6]}"
    counter = TiktokenCounter()
    picked = pick(load_conversations(args.data), n, args.budget_ratio, counter)
    settings = Settings.load({"redis": {"url": url, "key_prefix": prefix}})
    try:
        configure(settings)
        rt = runtime()
        print(
            f"{len(picked)} tau-bench runs over their target at {args.budget_ratio} of their tokens; ExtractiveModel"
        )
        for label, tenant in (
            ("cold: every message counted for the first time", "cold"),
            ("warm: token counts cached", "warm"),
        ):
            keys = load(rt, tenant, picked)
            print(f"\nour overhead per stage, {label} (in process, Redis stores, model call timed apart)\n")
            print("\n".join(overhead(rt, keys)))
        print("\nthroughput (celery -A workers.app worker --pool solo subprocesses)\n")
        print(
            "| worker processes | conversations | seconds | compactions/s | stages | stages/s | mean stage ms | within target |"
        )
        print("|---|---|---|---|---|---|---|---|")
        base = 0.0
        for workers in args.workers:
            row = throughput(settings, picked, workers, args.timeout)
            base = base or row["compactions_per_s"]
            print(
                f"| {workers} | {row['conversations']} | {row['seconds']:.2f} | {row['compactions_per_s']:.1f} "
                f"| {int(row['stages'])} | {row['stages_per_s']:.1f} | {row['mean_stage_ms']:.1f} "
                f"| {int(row['within_target'])}/{row['conversations']}"
                + (f" ({row['unfinished']} unfinished)" if row["unfinished"] else "")
                + " |",
                flush=True,
            )
        print(f"\nmachine: {os.cpu_count()} cores")
    finally:
        # throughput() runs each worker count under its own prefix.
        cleanup(url, [prefix, *(f"{prefix}w{workers}" for workers in args.workers)])
        server.stop()


if __name__ == "__main__":
    main()
