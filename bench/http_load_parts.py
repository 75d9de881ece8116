"""The machinery of ``bench/http_load.py``: the processes it starts (``ctxcore serve``, a
Celery worker), the simulated agents and their phases, and the samples they record; the
scenario and its report stay in ``http_load.py``."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ctxcore.client.calls import calls  # noqa: E402
from ctxcore.config import hash_token  # noqa: E402
from ctxcore.messages import AnyMessage, SystemMessage, from_openai, to_openai  # noqa: E402
from ctxcore.state import ConversationKey  # noqa: E402

DATA = Path(os.environ.get("CTXCORE_DATA_DIR", REPO.parent / "shared" / "data")) / "tau_bench.jsonl"
LIMITED = "limited"
TENANTS = ("acme", "globex", "initech", "umbrella")
SEED_BUDGET = 1500
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Phase:
    """Samples of one phase (milliseconds) and its outcome counts."""

    name: str
    agents: int
    window: list[float] = field(default_factory=list)
    append: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    # Failed ``reset`` truncations by status (a compaction covering a step refuses one: 409).
    resets: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    # This process (the agents: the load generator), the Redis server (INFO used_cpu; shared
    # with whatever else uses it) and the whole machine (/proc/stat: cores busy, everyone's).
    client_cpu_seconds: float = 0.0
    redis_cpu_seconds: float = 0.0
    machine_busy_cores: float = 0.0


def machine_busy() -> tuple[float, float]:
    """Busy and total CPU seconds of the whole machine since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / CLK_TCK, sum(fields) / CLK_TCK


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def tau_runs() -> list[list[AnyMessage]]:
    """The tau-bench runs without their system messages."""
    out = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line.strip():
            messages = from_openai(json.loads(line)["messages"])
            out.append([m for m in messages if not isinstance(m, SystemMessage)])
    return out


def steps_of(run: list[AnyMessage]) -> list[list[dict[str, Any]]]:
    """A run cut into appendable steps (an assistant message with its tool results, or one message)."""
    groups: list[list[AnyMessage]] = []
    for m in run:
        if groups and m.role == "tool":
            groups[-1].append(m)
        else:
            groups.append([m])
    return [to_openai(g) for g in groups]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and of its live descendants (``serve --workers N``: the
    supervisor and its N processes)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return own + sum(cpu_seconds(c) for c in children if Path(f"/proc/{c}").exists())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def config_file(directory: Path, url: str, prefix: str, tokens: dict[str, str], port: int) -> Path:
    lines = [
        "[redis]",
        f'url = "{url}"',
        f'key_prefix = "{prefix}"',
        "[http]",
        f"port = {port}",
        # Raised for the run: the bucket refills faster than any agent here asks; the burst is
        # every tenant's, so the limited tenant's 20/s bites once its 50 are spent.
        "requests_per_second = 100000.0",
        "burst = 50",
        "[http.tokens]",
        *(f'"{hash_token(token)}" = "{tenant}"' for tenant, token in tokens.items()),
        f"[tenants.{LIMITED}]",
        "requests_per_second = 20.0",
    ]
    path = directory / "ctxcore.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def start(args: list[str], config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CTXCORE_CONFIG_FILE": str(config)}
    with log.open("ab") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def wait_healthy(client: httpx.AsyncClient, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ctxcore serve exited ({proc.returncode}); see {log}")
        try:
            if (await client.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"ctxcore serve did not answer /healthz within 30 s; see {log}")


async def send(http: Any, token: str, call: Any) -> Any:
    return await http.request(
        call.method,
        call.path,
        json=call.json,
        params=dict(call.params),
        headers={"Authorization": f"Bearer {token}", **dict(call.headers)},
    )


async def agent(
    http: Any,
    token: str,
    conversation: str,
    steps: list[list[dict[str, Any]]],
    budget: int,
    phase: Phase,
    until: float,
    think: float = 0.0,
    reset: tuple[str, int] | None = None,
) -> None:
    """Append a step, ask for a window, until ``until``; every status is counted. With
    ``think`` (seconds) the agent waits that long after each window, as it would for the
    model's reply; the first wait is spread at random so the agents do not step in lock-step.
    With ``reset`` (a log id, n) the log is taken back to that id every n steps (not timed;
    its status counted as ``reset <status>`` when it fails)."""
    i = 0
    if think:
        await asyncio.sleep(random.uniform(0, think))
    while time.monotonic() < until:
        if reset is not None and i and i % reset[1] == 0:
            back = await send(http, token, calls.truncate_after(conversation, reset[0], None))
            if back.status_code != 200:
                phase.resets[back.status_code] += 1
        step = [
            {**m, "message_id": f"{conversation}-{phase.name}-{i}-{k}"}
            for k, m in enumerate(steps[i % len(steps)])
        ]
        i += 1
        started = time.perf_counter()
        response = await send(http, token, calls.append(conversation, step))
        phase.append.append((time.perf_counter() - started) * 1000)
        phase.statuses[response.status_code] += 1
        started = time.perf_counter()
        response = await send(http, token, calls.window(conversation, budget, None, None, None, "openai"))
        phase.window.append((time.perf_counter() - started) * 1000)
        phase.statuses[response.status_code] += 1
        if think:
            await asyncio.sleep(think)


async def seed(
    http: httpx.AsyncClient,
    tokens: dict[str, str],
    runs: list[list[AnyMessage]],
    n: int,
    conversations: str,
    compact: bool,
) -> int:
    """A conversation ``<conversations>-<a>`` per agent holding a tau-bench run; with
    ``compact`` also a window at a small budget, over which the workers compact it (the
    number settled within 120 s is returned: compacted, or their job done with nothing to
    compact; without, n)."""
    for a in range(n):
        tenant = TENANTS[a % len(TENANTS)]
        conversation = f"{conversations}-{a}"
        body = [
            {**m, "message_id": f"seed-{conversations}-{a}-{k}"}
            for k, m in enumerate(to_openai(runs[a % len(runs)]))
        ]
        requests = [calls.append(conversation, body)]
        if compact:
            requests.append(calls.window(conversation, SEED_BUDGET, None, None, None, "openai"))
        for call in requests:
            response = await send(http, tokens[tenant], call)
            if response.status_code >= 400:
                raise RuntimeError(
                    f"seeding {tenant}/{conversation}: {response.status_code} {response.text[:200]}"
                )
    deadline = time.monotonic() + 120
    pending = set(range(n)) if compact else set()
    while pending and time.monotonic() < deadline:
        for a in sorted(pending):
            tenant = TENANTS[a % len(TENANTS)]
            state = (await send(http, tokens[tenant], calls.state(f"{conversations}-{a}", False))).json()
            # Compacted, or its job ran and found nothing to compact (no wait for the deadline).
            if state.get("version", 0) > 0 or state.get("compaction") not in ("queued", "running"):
                pending.discard(a)
        await asyncio.sleep(0.5)
    return n - len(pending)


async def run_phase(
    http: Any,
    tokens: dict[str, str],
    name: str,
    agents: int,
    steps: list[list[list[dict[str, Any]]]],
    budget: int,
    duration: float,
    api_pid: int,
    redis_client: redis.Redis,
    tenants: tuple[str, ...] = TENANTS,
    think: float = 0.0,
    ends: dict[str, str] | None = None,
    every: int = 10,
    conversations: str = "agent",
) -> Phase:
    """One phase, agent ``a`` on conversation ``<conversations>-<a>``; with ``ends``
    (conversation -> log id) each agent takes its conversation back to that id every
    ``every`` steps."""
    phase = Phase(name, agents)
    cpu, own, server = cpu_seconds(api_pid), time.process_time(), redis_cpu(redis_client)
    busy, _ = machine_busy()
    started = time.monotonic()
    until = started + duration
    await asyncio.gather(
        *(
            agent(
                http,
                tokens[tenants[a % len(tenants)]],
                f"{conversations}-{a}",
                steps[a % len(steps)],
                budget,
                phase,
                until,
                think,
                (ends[f"{conversations}-{a}"], every) if ends is not None else None,
            )
            for a in range(agents)
        )
    )
    phase.seconds = time.monotonic() - started
    phase.cpu_seconds = cpu_seconds(api_pid) - cpu
    phase.client_cpu_seconds = time.process_time() - own
    phase.redis_cpu_seconds = redis_cpu(redis_client) - server
    phase.machine_busy_cores = (machine_busy()[0] - busy) / phase.seconds
    return phase


def floor_ms(client: redis.Redis, prefix: str, n: int) -> list[float]:
    """One pipelined round trip of what a window reads (state, tail page, status, budget)."""
    tag = ConversationKey(TENANTS[0], "agent-0").hash_tag
    out = []
    for _ in range(n):
        started = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        pipe.lindex(f"{prefix}:{tag}:state:history", 0)
        pipe.xrevrange(f"{prefix}:{tag}:log", "+", "-", count=128)
        pipe.hgetall(f"{prefix}:{tag}:compaction")
        pipe.get(f"{prefix}:{tag}:budget")
        pipe.execute()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def trivial_ms(http: httpx.AsyncClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        (await http.get("/healthz")).raise_for_status()
        out.append((time.perf_counter() - started) * 1000)
    return out
