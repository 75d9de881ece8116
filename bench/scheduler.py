"""Fair-scheduler throughput on a Redis Cluster: 1 ring against 16 rings, side by side.

    .venv/bin/python bench/scheduler.py [--nodes host:port,...] [--seconds 6] [--procs 4]
        [--rounds 2] [--driver python|redis-benchmark] [--json] [--save FILE]

Without ``--nodes`` a scratch three-master cluster is started (tests/cluster.py) and stopped
afterwards. Each configuration runs ``--procs`` client processes for ``--seconds``, 64
tenants spread over the processes, each loop one enqueue, one drain and one finish (the
``FairScheduler`` API a worker uses). The configurations alternate for ``--rounds`` rounds.

Reported per configuration: scheduling ops/s (enqueue + drain + finish), each master's share
of the scheduler's script calls (``INFO commandstats`` deltas: ``evalsha`` + ``eval``), each
master's CPU (``INFO cpu`` deltas over wall time) and the client processes' CPU. When the
clients use about as much CPU as the machine has for them, they, not the masters, are the
bottleneck, and the verdict says so.

``--driver redis-benchmark`` takes the Python clients out (they are the bottleneck: one
synchronous round trip per call). 16 streams, each one tenant with two ``redis-benchmark``
processes (2 connections, 16 requests pipelined each), run the scheduler's own scripts
(``EVALSHA`` of the enqueue script with random conversations, and of the pop script) with the
``KEYS`` the scheduler passes, straight at the master owning the ring's slot: stream i is in
ring ``i % rings``, so both configurations have the same clients and only the rings' layout
differs. (``redis-benchmark --cluster`` is not used: its ``{tag}`` placeholder sends each
request to a random slot of a node, i.e. no rings at all.) Ops/s is script calls per second
counted by the masters over ``--seconds`` of steady state after a 1 s warm-up; a failed call
(``commandstats`` ``failed_calls``) fails the run. Also reported: the machine's other load
(``/proc/stat`` busy time less the masters' and clients'), the share of the streams each
master holds (the layout alone), and calls per CPU second of the busiest master, i.e. what
the configuration would serve if that master had a core of its own (on 2 shared cores, three
masters cannot each have one). Everything written is deleted afterwards; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
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
# redis-benchmark: 16 streams (a tenant each) of 2 processes with 2 connections each, 16
# requests pipelined per connection: enough in flight that the masters, not the round trips,
# set the pace, and the same client processes whether the tenants share 1 ring or 16.
STREAMS = 16
CONNECTIONS = 2
PIPELINE = 16
WARMUP = 1.0


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


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores, ``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _failed_calls(masters: list[redis.Redis]) -> int:
    total = 0
    for m in masters:
        stats = m.info("commandstats")
        for c in ("evalsha", "eval"):
            entry = stats.get(f"cmdstat_{c}", {})
            total += int(entry.get("failed_calls", 0)) + int(entry.get("rejected_calls", 0))
    return total


def run_redis_benchmark(
    nodes: list[str], rings: int, seconds: float, masters: list[redis.Redis]
) -> dict[str, Any]:
    """One configuration driven by ``redis-benchmark``: the enqueue and pop scripts per stream.

    The same clients in both configurations: ``STREAMS`` streams, each one tenant with one
    ``redis-benchmark`` process for the enqueue script and one for the pop script, stream i in
    ring ``i % rings``; only where the rings' keys live differs. Measured in steady state
    over ``seconds`` after a warm-up, from the masters' own counters, then the processes are
    stopped (no tail of finishing processes in the figure)."""
    import shutil
    import subprocess

    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise SystemExit("redis-benchmark is not installed (Debian: redis-tools)")
    prefix = f"bench-sched-{uuid.uuid4().hex[:8]}"
    client = cluster_client(nodes)
    sched = FairScheduler(client, prefix, rings=rings)
    sha = {name: client.script_load(getattr(lua, name)) for name in ("ENQUEUE", "POP")}  # every master
    tenants = (f"tenant-{i:02d}" for i in range(10_000))
    commands: list[list[str]] = []
    streams_on: dict[str, int] = {m.get_connection_kwargs()["port"]: 0 for m in masters}
    for stream in range(STREAMS):
        ring = stream % rings
        tenant = next(t for t in tenants if sched.ring_of(t) == ring)
        keys = sched._keys(ring, tenant)  # the scheduler's own KEYS for this tenant
        node = client.get_node_from_key(keys[0])  # type: ignore[attr-defined]
        streams_on[node.port] += 1
        base = [binary, "-h", node.host, "-p", str(node.port), "-c", str(CONNECTIONS)]
        base += ["-n", "2000000000", "-r", "100000000", "-q", "-P", str(PIPELINE)]
        enqueue = ["EVALSHA", sha["ENQUEUE"], str(len(keys)), *keys, f"{tenant}/__rand_int__", tenant]
        commands.append([*base, *enqueue, "__rand_int__", "1000000000", "30", "2"])
        pop = ["EVALSHA", sha["POP"], str(len(keys)), *keys, tenant, "1000000000", "600", "2"]
        commands.append([*base, *pop])
    failed_before = _failed_calls(masters)
    procs = [
        subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    try:
        time.sleep(WARMUP)  # every connection open, every pipeline full
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise SystemExit(f"redis-benchmark exited early: {dead[0].communicate()[1][-300:]}")
        before, busy_before = _sample(masters), _machine_busy()
        clients_before = sum(_proc_cpu(p.pid) for p in procs)
        started = time.monotonic()
        time.sleep(seconds)
        after, busy_after = _sample(masters), _machine_busy()
        clients_after = sum(_proc_cpu(p.pid) for p in procs)
        wall = time.monotonic() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.communicate()
    if _failed_calls(masters) > failed_before:
        # A script error is answered fast: counting it would inflate ops/s.
        raise SystemExit("the scheduler's scripts failed under redis-benchmark (commandstats failed_calls)")
    calls = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    total = max(sum(calls), 1)
    master_cpu = [(a[1] - b[1]) / wall for a, b in zip(after, before, strict=True)]
    client_cpu = (clients_after - clients_before) / wall
    machine = (busy_after - busy_before) / wall
    delete_prefixed_keys(client, prefix)
    client.close()
    return {
        "rings": rings,
        "ops_per_s": sum(calls) / wall,
        "master_share": [c / total for c in calls],
        # The layout alone: the share of the streams (tenants, rings) each master serves.
        "master_streams": [n / STREAMS for n in streams_on.values()],
        "master_cpu": master_cpu,
        "client_cpu": client_cpu,
        "other_cpu": max(0.0, machine - sum(master_cpu) - client_cpu),
        # What the busiest master would serve on a core of its own: calls per CPU second.
        "ops_per_busiest_master_core": sum(calls) / wall / max(max(master_cpu), 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="", help="host:port,... of a running cluster (default: start one)")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--driver", choices=("python", "redis-benchmark"), default="python")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--save", default="", help="also write the JSON report to this file")
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
    report(results, args.json, args.save)


def _mean(rows: list[dict[str, Any]], field: str) -> Any:
    """The rounds' mean; per-master lists busiest first (a round's new prefix may put one
    ring on another master)."""
    first = rows[0][field]
    if isinstance(first, list):
        ranked = [sorted(r[field], reverse=True) for r in rows]
        return [sum(r[i] for r in ranked) / len(rows) for i in range(len(first))]
    return sum(r[field] for r in rows) / len(rows)


def report(results: dict[int, list[dict[str, Any]]], as_json: bool, save: str = "") -> None:
    """Print each configuration's means, the rounds' ratios and the verdict against the goals."""
    fields = [f for f in results[1][0] if f != "rings"]
    summary = {rings: {f: _mean(rows, f) for f in fields} for rings, rows in results.items()}
    speedup = summary[16]["ops_per_s"] / max(summary[1]["ops_per_s"], 1e-9)
    rounds = [
        b["ops_per_s"] / max(a["ops_per_s"], 1e-9) for a, b in zip(results[1], results[16], strict=True)
    ]
    cores = os.cpu_count() or 1
    client_bound = summary[16]["client_cpu"] >= 0.6 * cores
    verdict: dict[str, Any] = {
        "speedup_16_vs_1": speedup,
        "speedup_per_round": rounds,
        "speedup_median_round": statistics.median(rounds),
        "max_master_share_16": max(summary[16]["master_share"]),
        "goal_share_le_0.45": max(summary[16]["master_share"]) <= 0.45,
        "goal_speedup_ge_1.5": speedup >= 1.5,
        "cores": cores,
        "clients_are_the_bottleneck": client_bound,
    }
    if "ops_per_busiest_master_core" in summary[1]:
        per_core = [summary[r]["ops_per_busiest_master_core"] for r in (1, 16)]
        verdict["speedup_per_busiest_master_core"] = per_core[1] / max(per_core[0], 1e-9)
    document = json.dumps({"summary": summary, "verdict": verdict, "runs": results}, indent=2)
    if save:
        Path(save).write_text(document + "\n")
    if as_json:
        print(document)
        return
    for rings, s in summary.items():
        share = " ".join(f"{x:5.1%}" for x in s["master_share"])
        cpu = " ".join(f"{x:5.2f}" for x in s["master_cpu"])
        line = (
            f"rings={rings:2d}  {s['ops_per_s']:8.0f} ops/s  master share [{share}]  "
            f"master CPU [{cpu}] cores (busiest first)  clients {s['client_cpu']:.2f} cores"
        )
        if "master_streams" in s:
            line += f"  (streams [{' '.join(f'{x:5.1%}' for x in s['master_streams'])}])"
        if "other_cpu" in s:
            line += f"  other load {s['other_cpu']:.2f} cores  {s['ops_per_busiest_master_core']:7.0f} ops/s per busiest-master core"
        print(line)
    print(
        f"16 vs 1 ring: {speedup:.2f}x (goal >= 1.5x; rounds {' '.join(f'{r:.2f}' for r in rounds)}, "
        f"median {verdict['speedup_median_round']:.2f}x); busiest master "
        f"{verdict['max_master_share_16']:.1%} of scheduler commands with 16 rings (goal <= 45%)"
    )
    if "speedup_per_busiest_master_core" in verdict:
        print(
            f"per core of the busiest master (calls / its CPU seconds): "
            f"{verdict['speedup_per_busiest_master_core']:.2f}x (what the masters could give on a core each)"
        )
    if client_bound:
        print(
            f"note: the client processes used {summary[16]['client_cpu']:.2f} of {cores} cores: the "
            "Python clients, not the masters, limit this run"
        )


if __name__ == "__main__":
    main()
