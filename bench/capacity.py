"""Capacity inputs: Redis commands, bytes and CPU per append, per window and per compaction stage.

    .venv/bin/python bench/capacity.py [--port 6396] [--conversations 20] [--rounds 30]
        [--steps 2] [--concurrency 2] [--json]

Runs against a ``redis-server`` of its own (``--port``, ``--save "" --appendonly no``),
started here and stopped at the end by its own handle, so that no other client is counted.
The workload is ``bench/soak.py``'s, op for op: the soak's settings (budget 2,500 tokens,
4 recent messages kept), its user/assistant pair per append, its window after every
append, its compaction queue (the fair scheduler plus a Celery drain token), and a real
``celery -A workers.app worker`` (prefork, offline ``ExtractiveModel``) running the stages.

Each round: the worker is paused (SIGSTOP of its process group), then every conversation
gets ``--steps`` append + window pairs through ``ContextService``, each op between two
``INFO commandstats stats cpu`` readings; then the worker is resumed and the round's
compactions drain, between two readings. A reading's own cost (the INFO reply is counted
in the next reading's output bytes) is measured back to back and subtracted, and so is the
idle check's (measured while the worker is paused). The worker's idle background (kombu's
BRPOP polling) is measured apart, per second. Finally ``MEMORY USAGE`` of every key and
``used_memory`` give the bytes per conversation. Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import redis  # noqa: E402
from capacity_redis import Monitor, RedisServer, memory_by_key  # noqa: E402
from redis_cost import Cost, read  # noqa: E402
from soak_workload import BUDGET, WORKER_LIMITS, SoakQueue, soak_settings  # noqa: E402

from ctxcore.messages import AssistantMessage, UserMessage  # noqa: E402
from ctxcore.state import ConversationKey  # noqa: E402
from tests.chaos.processes import WorkerProcess, broker_idle, worker_env  # noqa: E402
from workers.prom_worker import snapshot  # noqa: E402
from workers.runtime import Runtime, build_service  # noqa: E402

FIELDS = ("cmds", "bytes_in", "bytes_out", "usec", "cpu_s")


def _batch(rng: random.Random, tag: str) -> list[Any]:
    """The soak's append: one user/assistant pair (same words, same sizes)."""
    words = " ".join(rng.choice(("deploy", "cache", "error", "retry", "index", "token")) for _ in range(60))
    return [
        UserMessage(content=f"{tag} please look at {words}", message_id=f"{tag}-u"),
        AssistantMessage(content=f"{tag} result: {words} {words}", message_id=f"{tag}-a"),
    ]


def _cpu_seconds(worker: WorkerProcess) -> float:
    """User + system CPU of the worker's main process and pool children."""
    total = 0
    assert worker.proc is not None
    for pid in [worker.proc.pid, *worker.children()]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def measure(args: argparse.Namespace, server: RedisServer, workdir: Path) -> dict[str, Any]:
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    rt = Runtime(soak_settings(server.url, prefix))
    queue = SoakQueue(rt)
    service = build_service(rt, queue)
    probe = redis.Redis.from_url(server.url)
    keys = [ConversationKey(f"tenant-{i % 5}", f"conv-{i:04d}") for i in range(args.conversations)]
    # The worker's processes record their stages there (prometheus-client's multiprocess mode).
    metrics_dir = workdir / "metrics"
    metrics_dir.mkdir(exist_ok=True)
    env = worker_env(server.url, prefix, **WORKER_LIMITS)
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    worker = WorkerProcess(env, workdir / "worker.log", concurrency=args.concurrency, name="capacity")
    rng = random.Random(7)

    # A reading's own cost, back to back.
    def calibrate() -> Cost:
        """A reading's own cost, back to back (its reply grows with the command names seen,
        so this is measured again every round, while the worker is paused)."""
        cost = Cost()
        for _ in range(20):
            a = read(probe)
            cost.add(a, read(probe))
        return cost

    info = calibrate()

    # The idle checks read the scheduler through a connection of their own (MONITOR skips it).
    watch = Runtime(rt.settings)
    watch.__dict__["redis"] = redis.Redis.from_url(server.url, single_connection_client=True)
    watch.redis.ping()
    own_ports = {watch.redis.connection._sock.getsockname()[1]}  # type: ignore[union-attr]

    def idle_now() -> bool:
        return broker_idle(probe, prefix) and all(watch.scheduler.status(k) == "idle" for k in keys)

    worker.start()
    ping_deadline = time.monotonic() + 60
    while "ready" not in (workdir / "worker.log").read_text():
        if time.monotonic() > ping_deadline:
            raise SystemExit(
                f"capacity: the worker did not start: {(workdir / 'worker.log').read_text()[-2000:]}"
            )
        time.sleep(0.2)
    time.sleep(1.0)
    try:
        # The worker's idle background, per second.
        idle = Cost()
        a, t0 = read(probe), time.monotonic()
        time.sleep(args.idle_seconds)
        idle.add(a, read(probe), info)
        idle_seconds = time.monotonic() - t0
        idle_per_s = idle.per(idle_seconds)
        os.killpg(worker.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        # The idle check's own cost, measured while nothing else runs.
        check = Cost()
        for _ in range(5):
            a = read(probe)
            idle_now()
            check.add(a, read(probe), info)

        appends = Cost()
        windows: dict[str, Cost] = {}
        drains = Cost()
        stage_wall = worker_cpu = 0.0
        n = 0
        base: dict[str, float] = {}
        spy: Monitor | None = None
        for round_no in range(args.rounds):
            info = calibrate()
            if round_no == args.from_round:
                # Steady state from here: the earlier rounds ran, unmeasured (the soak's warm-up).
                appends, windows, drains, stage_wall, worker_cpu = Cost(), {}, Cost(), 0.0, 0.0
                base = snapshot(str(metrics_dir))
            if round_no == args.rounds - args.monitor_rounds:
                spy = Monitor(server.url, prefix, keys, own_ports)
                spy_start = read(probe)
            for key in rng.sample(keys, len(keys)):
                for _ in range(args.steps):
                    n += 1
                    batch = _batch(rng, f"k{n}")
                    a = read(probe)
                    service.append(key, batch)
                    b = read(probe)
                    appends.add(a, b, info)
                    before = queue.requests
                    window = service.get_window(key, BUDGET)
                    c = read(probe)
                    kind = (
                        "hit, no compaction due"
                        if queue.requests == before
                        else f"over trigger: {window.compaction}"
                    )
                    windows.setdefault(kind, Cost()).add(b, c, info)
            # Resume the worker and drain this round's compactions.
            cpu0 = _cpu_seconds(worker)
            a, t0 = read(probe), time.monotonic()
            os.killpg(worker.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            checks = 0
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                time.sleep(0.05)
                checks += 1
                if idle_now():
                    break
            os.killpg(worker.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            b, elapsed = read(probe), time.monotonic() - t0
            worker_cpu += _cpu_seconds(worker) - cpu0
            stage_wall += elapsed
            drains.add(a, b, info, ops=0)
            # Subtract the idle checks and the worker's idle polling over the drain.
            drains.add(b, b, check, ops=0, times=checks)
            for f in FIELDS[:4]:
                setattr(drains, f, getattr(drains, f) - idle_per_s[f] * elapsed)
            drains.cpu_s -= idle_per_s["cpu_s"] * elapsed
        shares = spy.stop() if spy is not None else {}
        if spy is not None:
            span = read(probe)
            shares["commandstats_same_span"] = sum(span.cmds.values()) - sum(spy_start.cmds.values())
        snap = {k: v - base.get(k, 0.0) for k, v in snapshot(str(metrics_dir)).items()}
        stages = sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_count"))
        stage_seconds = sum(v for k, v in snap.items() if k.startswith("ctxcore_stage_seconds_sum"))
        by_kind: dict[str, float] = {}
        for k, v in snap.items():
            if k.startswith("ctxcore_stage_seconds_count") and v:
                kind = k.split('stage="', 1)[1].split('"', 1)[0]
                by_kind[kind] = by_kind.get(kind, 0) + v
        jobs = sum(1 for k in keys if (s := rt.state_store.load(k)) is not None and s.version >= 1)
        memory = memory_by_key(probe, prefix, keys)
    finally:
        if worker.proc is not None and worker.alive:
            os.killpg(worker.proc.pid, signal.SIGCONT)
        worker.stop()
    return {
        "conversations": len(keys),
        "appends": appends.ops,
        "append": appends.per() | {"top": appends.top()},
        "windows": {
            kind: c.per() | {"n": c.ops, "top": c.top()}
            for kind, c in sorted(windows.items(), key=lambda kv: -kv[1].ops)
        },
        "window_all": _merge(windows.values()).per(),
        "stages": int(stages),
        "stages_by_kind": by_kind,
        "versions_after": jobs,
        "stage": drains.per(stages) | {"top": drains.top(stages)},
        "stage_seconds_mean": stage_seconds / max(stages, 1),
        "worker_cpu_s_per_stage": worker_cpu / max(stages, 1),
        "drain_wall_s": stage_wall,
        "worker_idle_per_s": idle_per_s | {"top": idle.top(idle_seconds)},
        "memory": memory,
        "key_shares_last_round": shares,
        "last_round_turns": len(keys) * args.steps * args.monitor_rounds,
        "monitor_rounds": args.monitor_rounds,
        "from_round": args.from_round,
        "rounds": args.rounds,
        "info_reading_overhead": info.per(),
    }


def _merge(costs: Any) -> Cost:
    out = Cost()
    for c in costs:
        out.ops += c.ops
        for f in FIELDS:
            setattr(out, f, getattr(out, f) + getattr(c, f))
    return out


def _table(fig: dict[str, Any]) -> str:
    rows = [("append (pair of messages)", fig["appends"], fig["append"])]
    rows += [(f"window: {k}", v["n"], v) for k, v in fig["windows"].items()]
    rows += [("window: all", fig["appends"], fig["window_all"] | {"top": ""})]
    rows += [("compaction stage (worker, Celery incl.)", fig["stages"], fig["stage"])]
    rows += [("worker idle, per second", 0, fig["worker_idle_per_s"])]
    out = [
        "| operation | n | commands | bytes in | bytes out | Redis usec (commandstats) | Redis CPU ms | commands by name |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, n, c in rows:
        out.append(
            f"| {name} | {n} | {c['cmds']:.2f} | {c['bytes_in']:,.0f} | {c['bytes_out']:,.0f} | "
            f"{c['usec']:.0f} | {c['cpu_s'] * 1000:.3f} | {c.get('top', '')} |"
        )
    m = fig["memory"]
    sh = fig["key_shares_last_round"]
    turns = max(fig["last_round_turns"], 1)
    out += [
        "",
        f"last {fig['monitor_rounds']} rounds under MONITOR ({turns} turns and their drains): commands on a conversation's keys "
        f"{sh.get('conversation', 0) / turns:.1f}/turn, on its tenant's keys {sh.get('tenant', 0) / turns:.1f}/turn, "
        f"on its tenant's scheduler ring {sh.get('ring', 0) / turns:.1f}/turn, "
        f"shared {sh.get('shared', 0) / turns:.1f}/turn; of all of them, round trips "
        f"{sh.get('round_trips', 0) / turns:.1f}/turn and commands run inside scripts {sh.get('in_script', 0) / turns:.1f}/turn "
        f"(commandstats over the same span, the bench's idle checks included: {sh.get('commandstats_same_span', 0) / turns:.1f}/turn)",
        "  round trips per turn by class: "
        + ", ".join(
            f"{c} {sh.get(c + '_round_trips', 0) / turns:.2f}"
            for c in ("conversation", "tenant", "ring", "shared")
        ),
        f"  tenant keys: {sh.get('tenant_keys')}",
        f"  ring keys: {sh.get('ring_keys')}",
        f"  shared keys: {sh.get('shared_keys')}",
        "",
        f"rounds {fig['from_round']}..{fig['rounds'] - 1} measured; stages {fig['stages']} ({fig['stages_by_kind']}), conversations compacted {fig['versions_after']}/{fig['conversations']}; "
        f"stages per append {fig['stages'] / max(fig['appends'], 1):.4f}",
        f"worker-side stage time (ctxcore_stage_seconds mean) {fig['stage_seconds_mean'] * 1000:.1f} ms; "
        f"worker CPU per stage (main + pool, drain/Celery incl.) {fig['worker_cpu_s_per_stage'] * 1000:.1f} ms",
        f"memory: {m['keys']} keys; per conversation (MEMORY USAGE of its keys) mean {m['per_conversation_mean']:,.0f} B, "
        f"max {m['per_conversation_max']:,} B; tenant keys {m['tenant_keys_total']:,} B; shared {m['shared_keys_total']:,} B; "
        f"used_memory {m['used_memory']:,} B",
        "largest key kinds (P prefix, T tenant, C conversation): "
        + ", ".join(f"{k} {v:,}" for k, v in list(m["by_key_kind"].items())[:8]),
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=6396, help="the bench's own redis-server")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--steps", type=int, default=1, help="append + window pairs per conversation per round"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="the worker's prefork pool (1: a round's queued stages run one at a time, so the "
        "stage time is the uncontended one Little's law needs, not a burst's)",
    )
    parser.add_argument("--from-round", type=int, default=6, help="measure from this round on (steady state)")
    parser.add_argument("--monitor-rounds", type=int, default=10, help="the last rounds, under MONITOR")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="ctxcore-capacity-"))
    server = RedisServer(args.port, workdir)
    server.start()
    try:
        figures = measure(args, server, workdir)
    finally:
        server.stop()
    print(json.dumps(figures, indent=1) if args.json else _table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
