"""HTTP load: the real ``ctxcore serve`` and real Celery workers on real Redis, loopback only.

One ``ctxcore serve`` process (uvicorn, one worker process) and one ``celery -A workers.app
worker`` (prefork, ``--concurrency`` children, the offline summariser) on Redis db 15 under
a run-own key prefix (deleted at the end, nothing flushed). Simulated agents (asyncio in
this process on ``bench/rawhttp.py``'s light client, ``--client httpx`` for httpx; one
conversation each, spread over four tenants) append a step and then ask for a window, in a
loop, for ``--duration`` seconds per phase:

* ``idle``: pre-compacted conversations (a tau-bench run each, compacted by the workers
  before the phase) and small steps under a 32k budget: the workers have nothing to do. As in
  ``fast_path.py``, each agent takes its conversation back to where the phase found it
  (``DELETE .../messages?after=``, not timed) every ``--steps`` steps, so the tail after the
  cursor stays that of a conversation the workers keep up with; ``--grow`` lets it grow
  instead (by ~700 raw messages a phase at one agent: a long raw tail, nothing compacted);
* ``busy``: conversations of their own (a tau-bench run each, not compacted before), tool
  outputs of tau-bench runs as steps and an 8k budget, so windows go over the trigger and
  the workers compact during the phase.

Each phase runs with 1, 8 and 32 agents sending back to back (a closed loop: at 32 agents the
API's two cores are saturated, so latency there is mostly queueing), then once more with 32
*paced* agents that wait ``--think`` seconds (default 1) after each window, as an agent waits
for its model; the idle phases (paced included) run before the busy ones. Per phase: p50/p95/p99 of window and append,
requests/s, errors by status, and the API process's CPU (user+sys from /proc) per window
request. In the same run: a trivial route (``GET /healthz``, itself one Redis PING) and the
Redis floor (one pipelined round trip of what a window reads, from this process) with one
client. The per-tenant rate limit is raised for the run; a last short phase sends 8 agents
at a tenant limited to 20 requests/s (burst 50) on purpose and counts its 429s. Asserts nothing.

    .venv/bin/python bench/http_load.py                      # 10 s per phase
    .venv/bin/python bench/http_load.py --duration 30 --concurrency 2
    .venv/bin/python bench/http_load.py --api-processes 1,2   # serve --workers 1 vs 2
    .venv/bin/python bench/http_load.py --api-processes 1,2,1,2 --duration 15 --reconnect 20

``--api-processes`` runs only the 32 closed-loop idle agents per count and reports, per step,
the API's CPU, this process's (the load generator's), the Redis server's and the machine's
busy cores (everyone's: the cores are shared), with throughput and window p50/p99.
``--reconnect N`` closes each agent connection after N requests: keep-alive connections stay
with the API process that accepted them, and on a busy machine that split is lopsided.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.http_load_parts import (  # noqa: E402
    LIMITED,
    SEED_BUDGET,
    TENANTS,
    Phase,
    config_file,
    floor_ms,
    pct,
    run_phase,
    seed,
    start,
    steps_of,
    tau_runs,
    trivial_ms,
    wait_healthy,
)
from bench.rawhttp import RawClient  # noqa: E402
from ctxcore.config import Settings  # noqa: E402
from ctxcore.state import ConversationKey  # noqa: E402
from ctxcore.state.redis import RedisMessageLog  # noqa: E402
from tests.chaos.processes import free_port, worker_command  # noqa: E402
from workers.app import queue_names  # noqa: E402
from workers.embedded import ensure_redis  # noqa: E402
from workers.keyspace import delete_prefixed_keys  # noqa: E402

AGENTS = (1, 8, 32)


def row(p: Phase) -> str:
    windows = len(p.window)
    requests = windows + len(p.append)
    errors = ", ".join(f"{s}: {c}" for s, c in sorted(p.statuses.items()) if s >= 400) or "0"
    cpu = p.cpu_seconds * 1000 / windows if windows else float("nan")
    return (
        f"| {p.name} | {p.agents} | {pct(p.window, 0.5):.1f} | {pct(p.window, 0.95):.1f} | {pct(p.window, 0.99):.1f} | "
        f"{pct(p.append, 0.5):.1f} | {pct(p.append, 0.95):.1f} | {pct(p.append, 0.99):.1f} | "
        f"{requests / p.seconds:.0f} | {errors} | {cpu:.2f} |"
    )


async def measure(
    args: argparse.Namespace, url: str, prefix: str, workdir: Path, processes: int = 1, scaling: bool = False
) -> Phase | None:
    """The run (module docstring) with ``processes`` API processes; ``scaling``: only the
    32 closed-loop idle agents, returned for the comparison across process counts."""
    tokens = {tenant: f"bench-{tenant}-{uuid.uuid4().hex}" for tenant in (*TENANTS, LIMITED)}
    port = free_port()
    config = config_file(workdir, url, prefix, tokens, port)
    settings = Settings.load({"redis": {"url": url, "key_prefix": prefix}})
    queues = ",".join(queue_names(settings).consume_order())
    log = workdir / "processes.log"
    api = start([sys.executable, "-m", "workers.cli", "serve", "--workers", str(processes)], config, log)
    worker = start(
        worker_command(
            queues, "http-load@%h", pool="prefork", concurrency=args.concurrency, loglevel="WARNING"
        ),
        config,
        log,
    )
    runs = tau_runs()
    small = [
        [
            {"role": "user", "content": f"status check {i}: still there?"},
            {"role": "assistant", "content": f"Yes, check {i} done."},
        ]
        for i in range(10)
    ]
    big = [steps_of(run) for run in runs]
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30, limits=limits) as http:
            await wait_healthy(http, api, log)
            print(
                f"ctxcore serve: {processes} uvicorn process(es) (pid {api.pid}); celery worker: prefork, concurrency "
                f"{args.concurrency}; Redis {url}; {args.duration:g} s per phase; {os.cpu_count()} cores\n",
                flush=True,
            )
            compacted = await seed(http, tokens, runs, max(AGENTS), "agent", compact=True)
            print(
                f"  {compacted} of {max(AGENTS)} idle conversations pre-compacted or with nothing to "
                f"compact under the {SEED_BUDGET:,}-token seed budget",
                flush=True,
            )
            # The busy phases grow conversations of their own (the idle ones keep their tails).
            if not scaling:
                await seed(http, tokens, runs, max(AGENTS), "busy", compact=False)
            trivial = await trivial_ms(http, 500)
            client = redis.Redis.from_url(url)
            floor = floor_ms(client, prefix, 500)
            # The agents' client (``--client``): httpx, or the light one (bench/rawhttp.py).
            agents_http: Any = (
                http if args.client == "httpx" else RawClient("127.0.0.1", port, args.reconnect)
            )
            redis_log = RedisMessageLog(client, prefix)

            def log_ends() -> dict[str, str] | None:
                """Where each conversation's log ends now (None with ``--grow``)."""
                if args.grow:
                    return None
                ends = {}
                for a in range(max(AGENTS)):
                    last = redis_log.last_id(ConversationKey(TENANTS[a % len(TENANTS)], f"agent-{a}"))
                    if last is None:
                        raise RuntimeError(f"agent-{a} has no log after seeding")
                    ends[f"agent-{a}"] = last
                return ends

            phases = []
            if scaling:
                return await run_phase(
                    agents_http,
                    tokens,
                    "idle",
                    max(AGENTS),
                    [small],
                    32_000,
                    args.duration,
                    api.pid,
                    client,
                    ends=log_ends(),
                    every=args.steps,
                )
            for name, steps, budget, conversations in (
                ("idle", [small], 32_000, "agent"),
                ("busy", big, 8_000, "busy"),
            ):
                # Back to back at 1, 8 and 32 agents, then 32 agents that wait for their model
                # between steps (``--think``): the latency an agent sees when the API is not
                # saturated by back-to-back requests. The idle phases run first, while the
                # workers have nothing to do.
                for agents, think in [*((a, 0.0) for a in AGENTS), (max(AGENTS), args.think)]:
                    label = f"{name} paced" if think else name
                    phases.append(
                        await run_phase(
                            agents_http,
                            tokens,
                            label,
                            agents,
                            steps,
                            budget,
                            args.duration,
                            api.pid,
                            client,
                            think=think,
                            ends=log_ends() if name == "idle" else None,
                            every=args.steps,
                            conversations=conversations,
                        )
                    )
                    print(f"  {label}, {agents} agents: done", flush=True)
            limited = await run_phase(
                agents_http,
                tokens,
                "limited",
                8,
                [small],
                32_000,
                min(args.duration, 3.0),
                api.pid,
                client,
                (LIMITED,),
            )
    finally:
        for proc in (api, worker):
            proc.terminate()
        for proc in (api, worker):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()

    t50, f50 = pct(trivial, 0.5), pct(floor, 0.5)
    print(
        f"\ntrivial route (GET /healthz, 1 client) p50 {t50:.2f} ms, p99 {pct(trivial, 0.99):.2f}; "
        f"Redis floor (one pipelined round trip, in process) p50 {f50:.3f} ms, p99 {pct(floor, 0.99):.3f}\n"
    )
    print(
        "| phase | agents | window p50 | p95 | p99 | append p50 | p95 | p99 | requests/s | errors by status | API CPU ms per window |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in [*phases, limited]:
        print(row(p))
    one = next(p for p in phases if p.name == "idle" and p.agents == 1)
    ratio = pct(one.window, 0.5) / (t50 + f50)
    print(
        f"\n1 agent, idle: window p50 / (trivial + floor) = {ratio:.2f} (goal <= 2: {'met' if ratio <= 2 else 'NOT met'})"
    )
    for p in phases:
        if p.agents == max(AGENTS) and not p.name.endswith("paced"):
            bad = sum(c for s, c in p.statuses.items() if s >= 400)
            print(
                f"{p.agents} agents, {p.name}: p99 window {pct(p.window, 0.99):.1f} ms, {bad} errors"
                + (
                    " (goal idle p99 <= 25 ms: " + ("met" if pct(p.window, 0.99) <= 25 else "NOT met") + ")"
                    if p.name == "idle"
                    else ""
                )
            )
    for p in phases:
        if p.name.endswith("paced"):
            print(
                f"{p.agents} agents, {p.name} ({args.think:g} s between steps): window p50 "
                f"{pct(p.window, 0.5):.1f} ms, p99 {pct(p.window, 0.99):.1f} ms"
            )
    print(
        f"limited tenant: {limited.statuses.get(429, 0)} answers 429 of {sum(limited.statuses.values())} (on purpose)"
    )
    failed = Counter[int]()
    for p in phases:
        failed.update(p.resets)
    if not args.grow:
        print(
            f"idle tails taken back every {args.steps} steps; failed resets by status: "
            + (", ".join(f"{s}: {c}" for s, c in sorted(failed.items())) or "none")
        )
    return None


async def compare_processes(args: argparse.Namespace, url: str, workdir: Path) -> None:
    """``--api-processes 1,2``: 32 closed-loop idle agents against each process count, each
    with a serve, a worker and conversations of its own (same load): the API's CPU per
    step (summed over its processes), throughput and window p99, and p99 as a ratio of
    the first count's. A count may repeat (``1,2,1,2``)."""
    rows: list[tuple[int, Phase]] = []
    for i, processes in enumerate(args.api_processes):
        prefix = f"httpload{uuid.uuid4().hex[:8]}"
        run_dir = workdir / f"run{i}-api{processes}"
        run_dir.mkdir()
        try:
            phase = await measure(args, url, prefix, run_dir, processes, scaling=True)
        finally:
            delete_prefixed_keys(redis.Redis.from_url(url), prefix)
        if phase is None:
            raise RuntimeError("measure(scaling=True) returned no phase")
        rows.append((processes, phase))
    connections = f" reconnecting every {args.reconnect} requests" if args.reconnect else " (keep-alive)"
    print(
        f"\n{max(AGENTS)} closed-loop agents (idle), {args.duration:g} s each, {args.client} client{connections}, "
        f"{os.cpu_count()} cores; a step is an append and a window; CPU in ms per step\n"
    )
    print(
        "| API processes | API CPU | load generator CPU | Redis CPU | machine busy (cores, everyone's) "
        "| steps/s | window p50 | window p99 | p99 / first | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = pct(rows[0][1].window, 0.99)
    for processes, p in rows:
        steps = len(p.window)
        bad = sum(c for st, c in p.statuses.items() if st >= 400)
        print(
            f"| {processes} | {p.cpu_seconds * 1000 / steps:.2f} | {p.client_cpu_seconds * 1000 / steps:.2f} | "
            f"{p.redis_cpu_seconds * 1000 / steps:.2f} | {p.machine_busy_cores:.2f} | {steps / p.seconds:.0f} | "
            f"{pct(p.window, 0.5):.1f} | {pct(p.window, 0.99):.1f} | {pct(p.window, 0.99) / base:.2f} | {bad} |"
        )
    counts = sorted({n for n, _ in rows})
    if len(counts) > 1:
        # Counts repeated (``1,2,1,2``: alternating, so the machine's other load hits both):
        # each count's p99 over all its windows.
        p99 = {n: pct([w for m, p in rows if m == n for w in p.window], 0.99) for n in counts}
        ratio = p99[counts[-1]] / p99[counts[0]]
        print(
            f"\np99 at {counts[-1]} processes / at {counts[0]} (all their runs' windows): "
            f"{p99[counts[-1]]:.1f} / {p99[counts[0]]:.1f} ms = {ratio:.3f} "
            f"(goal <= 0.5: {'met' if ratio <= 0.5 else 'NOT met'})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase (default 10)")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery worker children (default 2)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument(
        "--think",
        type=float,
        default=1.0,
        help="seconds each agent of the paced phases waits after a window, for its model (default 1)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        help="idle phases: steps before an agent takes its conversation back to the phase's start (default 10)",
    )
    parser.add_argument(
        "--grow", action="store_true", help="idle phases: let the tails grow instead (no taking back)"
    )
    parser.add_argument(
        "--client",
        choices=("raw", "httpx"),
        default="raw",
        help="the agents' HTTP client: raw (bench/rawhttp.py, little CPU of its own) or httpx (default raw)",
    )
    parser.add_argument(
        "--reconnect",
        type=int,
        default=None,
        help="raw client: close each connection after this many requests, so N API processes "
        "share the agents again (default: keep-alive for the whole phase)",
    )
    parser.add_argument(
        "--api-processes",
        type=lambda text: [int(n) for n in text.split(",")],
        default=None,
        help="e.g. 1,2: only the 32 closed-loop idle agents, against `ctxcore serve --workers N` "
        "for each N, compared (API CPU per step, throughput, p99)",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.reconnect is not None and args.reconnect < 1:
        parser.error("--reconnect must be at least 1")
    if args.api_processes is not None and (not args.api_processes or min(args.api_processes) < 1):
        parser.error("--api-processes takes counts of at least 1, e.g. 1,2")
    server = ensure_redis(args.redis_url)
    url = args.redis_url if not server.started else server.url.rsplit("/", 1)[0] + "/15"
    prefix = f"httpload{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="ctxcore-http-load-") as workdir:
            if args.api_processes is not None:
                asyncio.run(compare_processes(args, url, Path(workdir)))
            else:
                asyncio.run(measure(args, url, prefix, Path(workdir)))
    finally:
        delete_prefixed_keys(redis.Redis.from_url(url), prefix)
        if server.started:
            server.stop()


if __name__ == "__main__":
    main()
