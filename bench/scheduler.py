"""Fair-scheduler throughput on a Redis Cluster: 1 ring against 16 rings, side by side.

    .venv/bin/python bench/scheduler.py [--nodes host:port,...] [--seconds 6] [--procs 4]
        [--rounds 2] [--driver python|redis-benchmark] [--json]

Without ``--nodes`` a scratch three-master cluster is started (tests/cluster.py) and stopped
afterwards. Each configuration runs ``--procs`` client processes for ``--seconds``, 64
tenants spread over the processes, each loop one enqueue, one drain and one finish (the
``FairScheduler`` API a worker uses). The configurations alternate for ``--rounds`` rounds.

Reported per configuration: scheduling ops/s (enqueue + drain + finish), each master's share
of the scheduler's script calls (``INFO commandstats`` deltas: ``evalsha`` + ``eval``), each
master's CPU (``INFO cpu`` deltas over wall time) and the client processes' CPU. When the
clients use about as much CPU as the machine has for them, they, not the masters, are the
bottleneck, and the verdict says so.

``--driver redis-benchmark`` takes the Python clients out: per ring, two ``redis-benchmark``
processes run the scheduler's own scripts (``EVALSHA`` of the enqueue script with random
conversations, and of the pop script) straight at the master owning the ring's slot, with
the same ``KEYS`` the scheduler passes; 64 connections in all, split over the rings. Ops/s
is then script calls per second. Everything written is deleted afterwards; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from ctxcore.state import ConversationKey
from workers import scheduler_scripts as lua
from workers.keyspace import delete_prefixed_keys
from workers.redis_clients import cluster_client
from workers.scheduler import FairScheduler

TENANTS = 64
# redis-benchmark pipeline depth: enough requests in flight that the masters, not the round
# trips, set the pace.
PIPELINE = 16


def _masters(nodes: list[str]) -> list[redis.Redis]:
    client = cluster_client(nodes)
    try:
        names = sorted({n.name for n in client.get_primaries()})  # type: ignore[attr-defined]
    finally:
        client.close()
    return [redis.Redis(host=n.rsplit(":", 1)[0], port=int(n.rsplit(":", 1)[1])) for n in names]


def _sample(masters: list[redis.Redis]) -> list[tuple[int, float]]:
    """Per master: script calls so far and CPU seconds used so far."""
    out = []
    for m in masters:
        stats = m.info("commandstats")
        calls = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
        cpu = m.info("cpu")
        out.append((calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])))
    return out


def _client(nodes: list[str], prefix: str, rings: int, tenants: list[str], until: float, out: Any) -> None:
    client = cluster_client(nodes)
    sched = FairScheduler(client, prefix, lease_seconds=600, rings=rings)
    ops = n = 0
    while time.time() < until:
        tenant = tenants[n % len(tenants)]
        key = ConversationKey(tenant, f"c{n}")
        n += 1
        requested = sched.request(key)
        job = sched.next_job(requested.token if requested.token is not None else sched.ring_of(tenant))
        ops += 2
        if job is not None:
            sched.finish(job.key)
            ops += 1
    client.close()
    out.put(ops)


def run(
    nodes: list[str], rings: int, procs: int, seconds: float, masters: list[redis.Redis]
) -> dict[str, Any]:
    """One configuration: ops/s, per-master command share and CPU, client CPU."""
    prefix = f"bench-sched-{uuid.uuid4().hex[:8]}"
    setup = cluster_client(nodes)
    FairScheduler(setup, prefix, rings=rings).check()
    setup.close()
    tenants = [f"tenant-{i:02d}" for i in range(TENANTS)]
    queue: Any = mp.get_context("fork").Queue()
    before, cpu_before = _sample(masters), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    until = started + seconds
    workers = [
        mp.get_context("fork").Process(
            target=_client, args=(nodes, prefix, rings, tenants[i::procs], until, queue)
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    ops = sum(queue.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join()
    wall = time.time() - started
    after, cpu_after = _sample(masters), resource.getrusage(resource.RUSAGE_CHILDREN)
    calls = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    total = max(sum(calls), 1)
    client_cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    cleaner = cluster_client(nodes)
    delete_prefixed_keys(cleaner, prefix)
    cleaner.close()
    return {
        "rings": rings,
        "ops_per_s": ops / wall,
        "master_share": [c / total for c in calls],
        "master_cpu": [(a[1] - b[1]) / wall for a, b in zip(after, before, strict=True)],
        "client_cpu": client_cpu / wall,
    }


def run_redis_benchmark(
    nodes: list[str], rings: int, seconds: float, masters: list[redis.Redis]
) -> dict[str, Any]:
    """One configuration driven by ``redis-benchmark``: the enqueue and pop scripts per ring."""
    import shutil
    import subprocess

    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise SystemExit("redis-benchmark is not installed (Debian: redis-tools)")
    prefix = f"bench-sched-{uuid.uuid4().hex[:8]}"
    client = cluster_client(nodes)
    sched = FairScheduler(client, prefix, rings=rings)
    sha = {name: client.script_load(getattr(lua, name)) for name in ("ENQUEUE", "POP")}  # every master
    per_ring = max(1, 32 // rings)  # connections per script per ring: 64 in all
    requests = max(1000, int(seconds * 4000 * per_ring))
    commands: list[list[str]] = []
    for ring in range(rings):
        tenant = next(t for t in (f"tenant-{i:02d}" for i in range(1000)) if sched.ring_of(t) == ring)
        keys = sched._keys(ring, tenant)  # the scheduler's own KEYS for this tenant
        node = client.get_node_from_key(keys[0])  # type: ignore[attr-defined]
        base = [binary, "-h", node.host, "-p", str(node.port), "-c", str(per_ring), "-n", str(requests)]
        base += ["-r", "100000000", "-q", "-P", str(PIPELINE)]
        enqueue = [
            "EVALSHA",
            sha["ENQUEUE"],
            str(len(keys)),
            *keys,
            f"{tenant}/__rand_int__",
            tenant,
            "__rand_int__",
        ]
        commands.append([*base, *enqueue, "1000000000", "30", "2"])
        commands.append(
            [*base, "EVALSHA", sha["POP"], str(len(keys)), *keys, tenant, "1000000000", "600", "2"]
        )
    before, cpu_before = _sample(masters), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    procs = [
        subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    failed = [err for proc in procs if (err := proc.communicate()[1].strip()) or proc.returncode]
    wall = time.time() - started
    if failed:
        # A script error is answered fast: counting it would inflate ops/s.
        raise SystemExit(f"redis-benchmark reported errors: {failed[0][:300]}")
    after, cpu_after = _sample(masters), resource.getrusage(resource.RUSAGE_CHILDREN)
    calls = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    total = max(sum(calls), 1)
    client_cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    delete_prefixed_keys(client, prefix)
    client.close()
    return {
        "rings": rings,
        "ops_per_s": requests * len(commands) / wall,
        "master_share": [c / total for c in calls],
        "master_cpu": [(a[1] - b[1]) / wall for a, b in zip(after, before, strict=True)],
        "client_cpu": client_cpu / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="", help="host:port,... of a running cluster (default: start one)")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--driver", choices=("python", "redis-benchmark"), default="python")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scratch = None
    if args.nodes:
        nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    else:
        from tests.cluster import start_cluster

        scratch = start_cluster(Path(tempfile.mkdtemp(prefix="bench-cluster-")))
        nodes = scratch.nodes
    try:
        masters = _masters(nodes)
        results: dict[int, list[dict[str, Any]]] = {1: [], 16: []}
        for _ in range(args.rounds):
            for rings in (1, 16):
                if args.driver == "python":
                    results[rings].append(run(nodes, rings, args.procs, args.seconds, masters))
                else:
                    results[rings].append(run_redis_benchmark(nodes, rings, args.seconds, masters))
    finally:
        if scratch is not None:
            scratch.stop()
    report(results, args.json)


def _mean(rows: list[dict[str, Any]], field: str) -> Any:
    """The rounds' mean; per-master lists busiest first (a round's new prefix may put one
    ring on another master)."""
    first = rows[0][field]
    if isinstance(first, list):
        ranked = [sorted(r[field], reverse=True) for r in rows]
        return [sum(r[i] for r in ranked) / len(rows) for i in range(len(first))]
    return sum(r[field] for r in rows) / len(rows)


def report(results: dict[int, list[dict[str, Any]]], as_json: bool) -> None:
    """Print each configuration's means and the verdict against the goals."""
    summary = {
        rings: {f: _mean(rows, f) for f in ("ops_per_s", "master_share", "master_cpu", "client_cpu")}
        for rings, rows in results.items()
    }
    speedup = summary[16]["ops_per_s"] / max(summary[1]["ops_per_s"], 1e-9)
    cores = os.cpu_count() or 1
    client_bound = summary[16]["client_cpu"] >= 0.6 * cores
    verdict = {
        "speedup_16_vs_1": speedup,
        "max_master_share_16": max(summary[16]["master_share"]),
        "goal_share_le_0.45": max(summary[16]["master_share"]) <= 0.45,
        "goal_speedup_ge_1.5": speedup >= 1.5,
        "cores": cores,
        "clients_are_the_bottleneck": client_bound,
    }
    if as_json:
        print(json.dumps({"summary": summary, "verdict": verdict, "runs": results}, indent=2))
        return
    for rings, s in summary.items():
        share = " ".join(f"{x:5.1%}" for x in s["master_share"])
        cpu = " ".join(f"{x:5.2f}" for x in s["master_cpu"])
        print(
            f"rings={rings:2d}  {s['ops_per_s']:8.0f} ops/s  master share [{share}]  "
            f"master CPU [{cpu}] cores (busiest first)  clients {s['client_cpu']:.2f} cores"
        )
    print(
        f"16 vs 1 ring: {speedup:.2f}x (goal >= 1.5x); busiest master {verdict['max_master_share_16']:.1%} "
        f"of scheduler commands with 16 rings (goal <= 45%)"
    )
    if client_bound:
        print(
            f"note: the client processes used {summary[16]['client_cpu']:.2f} of {cores} cores: the "
            "Python clients, not the masters, limit this run"
        )


if __name__ == "__main__":
    main()
