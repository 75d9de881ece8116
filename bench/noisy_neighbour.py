"""Noisy neighbour: can one tenant's big appends stall another tenant's windows?

The real ``ctxcore serve`` (one uvicorn process) on Redis db 15 under a run-own key prefix
(deleted at the end, nothing flushed). The quiet tenant runs ``--agents`` closed-loop
agents, each appending a small step then asking for a window of its own conversation. The
noisy tenant sends **maximum-size appends at its byte-rate limit**: bodies just under
``http.max_body_bytes`` (4 MiB) of ``service.max_messages_per_append`` (1,000) messages,
back to back, waiting out each 429's ``Retry-After``, so it gets exactly its
``http.bytes_per_second`` (1 MiB/s by default). A second noisy client sends the issue's
oversized appends (100,000 small messages, 3.4 MB) at 0.8 requests/s: refused while they
stream, they cost a 64 KiB read each (or a 429 without any read, once the byte budget is
spent). Three phases of ``--duration`` seconds:

* ``baseline``: the quiet tenant alone;
* ``noisy, limited``: both tenants, the noisy one at the default byte rate;
* ``noisy, unlimited``: the same with the byte rate raised to 1 TB/s (another
  ``ctxcore serve``), for comparison: what the limit buys.

Printed: the quiet tenant's window p50/p99 per phase and p50 as a ratio of the baseline
(goal: <= 2 with the limit), the noisy tenant's accepted appends, bytes/s and answers by
status, and the API process's CPU. Asserts nothing.

    .venv/bin/python bench/noisy_neighbour.py                 # 15 s per phase
    .venv/bin/python bench/noisy_neighbour.py --duration 30 --agents 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.http_load import cpu_seconds, pct  # noqa: E402
from ctxcore.config import Settings, hash_token  # noqa: E402
from tests.chaos.helpers import free_port  # noqa: E402
from workers.embedded import ensure_redis  # noqa: E402
from workers.keyspace import delete_prefixed_keys  # noqa: E402

QUIET, NOISY = "quiet", "noisy"
OVERSIZED_PER_SECOND = 0.8


@dataclass
class Phase:
    """The quiet tenant's window latencies (ms) and the noisy tenant's answers."""

    name: str
    windows: list[float] = field(default_factory=list)
    quiet_errors: Counter[int] = field(default_factory=Counter)
    noisy: Counter[str] = field(default_factory=Counter)
    noisy_bytes: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def max_size_body(settings: Settings) -> bytes:
    """``max_messages_per_append`` messages filling the body limit but 1 KiB."""
    limit, count = settings.http.max_body_bytes - 1024, settings.service.max_messages_per_append
    overhead = len(json.dumps({"messages": [{"role": "user", "content": ""}] * count}).encode())
    words = "the build log of the failing test run, line by line " * 200
    each = (limit - overhead) // count
    return json.dumps({"messages": [{"role": "user", "content": words[:each]}] * count}).encode()


def oversized_body() -> bytes:
    """The issue's append: 100,000 small messages (3.4 MB), over the message limit."""
    return json.dumps({"messages": [{"role": "user", "content": f"m{i}"} for i in range(100_000)]}).encode()


async def quiet_agent(http: httpx.AsyncClient, token: str, n: int, phase: Phase, until: float) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    conv = f"/v1/conversations/quiet-{n}"
    step = 0
    while time.monotonic() < until:
        batch = [
            {"role": "user", "content": f"check {step}"},
            {"role": "assistant", "content": f"done {step}"},
        ]
        appended = await http.post(f"{conv}/messages", json={"messages": batch}, headers=auth)
        if appended.status_code >= 400:
            phase.quiet_errors[appended.status_code] += 1
        started = time.perf_counter()
        window = await http.post(f"{conv}/window", json={"budget_tokens": 16_000}, headers=auth)
        phase.windows.append((time.perf_counter() - started) * 1000)
        if window.status_code >= 400:
            phase.quiet_errors[window.status_code] += 1
        step += 1


async def noisy_appender(
    http: httpx.AsyncClient, token: str, body: bytes, phase: Phase, until: float
) -> None:
    """Maximum-size appends back to back, each 429 waited out: the tenant's byte rate."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    n = 0
    while time.monotonic() < until:
        try:
            answer = await http.post(
                f"/v1/conversations/noisy-{n % 4}/messages", content=body, headers=headers
            )
        except httpx.TransportError:
            # Refused before its body was read: the server closed the connection under the upload.
            phase.noisy["max-size closed"] += 1
            await asyncio.sleep(1.0)
            continue
        phase.noisy[f"max-size {answer.status_code}"] += 1
        if answer.status_code == 429:
            await asyncio.sleep(min(float(answer.headers.get("Retry-After", "1")), until - time.monotonic()))
            continue
        if answer.status_code < 300:
            phase.noisy_bytes += len(body)
        n += 1


async def noisy_oversized(
    http: httpx.AsyncClient, token: str, body: bytes, phase: Phase, until: float
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    while time.monotonic() < until:
        try:
            answer = await http.post("/v1/conversations/noisy-big/messages", content=body, headers=headers)
            phase.noisy[f"oversized {answer.status_code}"] += 1
        except httpx.TransportError:
            phase.noisy["oversized closed"] += 1  # refused mid-body: the server closed the connection
        await asyncio.sleep(1 / OVERSIZED_PER_SECOND)


def noisy_process(port: int, token: str, big: bytes, oversized: bytes, seconds: float, out: Any) -> None:
    """The noisy tenant in a process of its own: its uploads never share an event loop (or
    the GIL) with the quiet agents' clock. Puts its answers and accepted bytes on ``out``."""

    async def load() -> Phase:
        phase = Phase("noisy")
        until = time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            await asyncio.gather(
                noisy_appender(http, token, big, phase, until),
                noisy_oversized(http, token, oversized, phase, until),
            )
        return phase

    phase = asyncio.run(load())
    out.put((dict(phase.noisy), phase.noisy_bytes))


def config_file(
    directory: Path, url: str, prefix: str, tokens: dict[str, str], port: int, byte_rate: float
) -> Path:
    lines = [
        "[redis]",
        f'url = "{url}"',
        f'key_prefix = "{prefix}"',
        "[http]",
        f"port = {port}",
        "access_log = false",
        # Request counts never bind here: the byte rate is what is measured.
        "requests_per_second = 100000.0",
        "burst = 1000",
        "[http.tokens]",
        *(f'"{hash_token(token)}" = "{tenant}"' for tenant, token in tokens.items()),
        f"[tenants.{NOISY}]",
        f"bytes_per_second = {byte_rate!r}",
    ]
    path = directory / f"ctxcore-{int(byte_rate)}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def run(args: argparse.Namespace, url: str, prefix: str, workdir: Path) -> list[Phase]:
    tokens = {tenant: f"bench-{tenant}-{uuid.uuid4().hex}" for tenant in (QUIET, NOISY)}
    settings = Settings()
    big, oversized = max_size_body(settings), oversized_body()
    print(
        f"noisy tenant: max-size appends of {len(big):,} bytes ({settings.service.max_messages_per_append} "
        f"messages) at its byte rate, and {len(oversized):,}-byte appends of 100,000 messages at "
        f"{OVERSIZED_PER_SECOND} requests/s; quiet tenant: {args.agents} closed-loop agents; "
        f"{args.duration:g} s per phase; {os.cpu_count()} cores",
        flush=True,
    )
    phases: list[Phase] = []
    for byte_rate, names in (
        (settings.http.bytes_per_second, ("baseline", "noisy, limited")),
        (1e12, ("noisy, unlimited",)),
    ):
        port = free_port()
        config = config_file(workdir, url, prefix, tokens, port, byte_rate)
        log = workdir / "serve.log"
        with log.open("ab") as out:
            api = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "serve"],
                env={**os.environ, "CTXCORE_CONFIG_FILE": str(config)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                for _ in range(150):
                    try:
                        if (await http.get("/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.2)
                else:
                    raise RuntimeError(f"ctxcore serve did not start; see {log}")
                for name in names:
                    phase = Phase(name)
                    cpu, started = cpu_seconds(api.pid), time.monotonic()
                    until = started + args.duration
                    jobs = [quiet_agent(http, tokens[QUIET], n, phase, until) for n in range(args.agents)]
                    noisy: Any = None
                    results: Any = mp.Queue()
                    if name != "baseline":
                        args_ = (port, tokens[NOISY], big, oversized, args.duration, results)
                        noisy = mp.Process(target=noisy_process, args=args_)
                        noisy.start()
                    await asyncio.gather(*jobs)
                    if noisy is not None:
                        answers, accepted = results.get(timeout=120)
                        noisy.join(30)
                        phase.noisy.update(answers)
                        phase.noisy_bytes = accepted
                    phase.seconds = time.monotonic() - started
                    phase.cpu_seconds = cpu_seconds(api.pid) - cpu
                    phases.append(phase)
                    print(f"  {name}: done", flush=True)
        finally:
            api.terminate()
            try:
                api.wait(20)
            except subprocess.TimeoutExpired:
                api.kill()
    return phases


def report(phases: list[Phase], byte_rate: float) -> None:
    base = pct(phases[0].windows, 0.5)
    print(
        "\n| phase | quiet window p50 ms | p99 | p50 / baseline | quiet errors | noisy MB/s accepted | noisy answers | API CPU % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for p in phases:
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(p.noisy.items())) or "-"
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(p.quiet_errors.items())) or "0"
        print(
            f"| {p.name} | {pct(p.windows, 0.5):.1f} | {pct(p.windows, 0.99):.1f} | "
            f"{pct(p.windows, 0.5) / base:.2f} | {errors} | {p.noisy_bytes / p.seconds / 1e6:.2f} | {answers} | "
            f"{100 * p.cpu_seconds / p.seconds:.0f} |"
        )
    limited = next(p for p in phases if p.name == "noisy, limited")
    ratio = pct(limited.windows, 0.5) / base
    print(
        f"\nquiet tenant's median window with the noisy tenant at its byte rate ({byte_rate / 1e6:.2f} MB/s): "
        f"{ratio:.2f} x its baseline (goal <= 2: {'met' if ratio <= 2 else 'NOT met'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per phase (default 15)")
    parser.add_argument("--agents", type=int, default=4, help="the quiet tenant's agents (default 4)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    if args.agents < 1 or not args.duration > 0:
        parser.error("--agents must be at least 1 and --duration above 0")
    server = ensure_redis(args.redis_url)
    url = args.redis_url if not server.started else server.url.rsplit("/", 1)[0] + "/15"
    prefix = f"noisy{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="ctxcore-noisy-") as workdir:
            phases = asyncio.run(run(args, url, prefix, Path(workdir)))
        report(phases, Settings().http.bytes_per_second)
    finally:
        delete_prefixed_keys(redis.Redis.from_url(url), prefix)
        if server.started:
            server.stop()


if __name__ == "__main__":
    main()
