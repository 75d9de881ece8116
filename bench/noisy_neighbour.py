"""Noisy neighbour: can one tenant's big appends stall another tenant's windows?

The real ``ctxcore serve`` (one uvicorn process) on Redis db 15 under a run-own key prefix
(deleted at the end, nothing flushed). The quiet tenant runs ``--agents`` closed-loop
agents, each appending a small step then asking for a window of its own conversation. The
noisy tenant sends **maximum-size appends at its byte-rate limit**: bodies just under
``http.max_body_bytes`` (4 MiB) of ``service.max_messages_per_append`` (1,000) messages,
back to back, waiting out each 429's ``Retry-After``, so it gets its
``http.bytes_per_second`` (1 MiB/s by default, plus its bucket's 4 MiB burst at the start
of each of its slices). A second noisy client sends the issue's oversized appends (100,000
small messages, 3.4 MB) at 0.8 requests/s: refused while they stream, they cost a read of
the chunk that crosses the message limit (or a 429 without any parsing, once the byte
budget is spent). Three conditions:

* ``baseline``: the quiet tenant alone;
* ``noisy, limited``: the noisy tenant at the default byte rate;
* ``noisy, unlimited``: the same load from a third tenant whose byte rate is 1 TB/s, for
  comparison: what the limit buys.

The conditions alternate in slices of ``--slice`` seconds (baseline, limited, unlimited,
``--rounds`` times) while the quiet agents run throughout, so the machine's other load (2
shared cores here) falls on every condition alike instead of on whichever phase ran at a
busy minute; a window belongs to the slice it started in, and the first second of each
slice (a noisy request of the slice before may still be in flight) is left out. The
clients are ``bench/rawhttp.py``'s (little CPU of their own); the noisy ones run in a
process of their own.

Printed: per condition, the quiet tenant's window p50/p99 over all its slices and p50 as a
ratio of the baseline's (goal: <= 2 with the limit), each round's ratio, the noisy tenant's
accepted bytes/s and answers by status, and the API process's CPU. Asserts nothing.

    .venv/bin/python bench/noisy_neighbour.py                 # 3 rounds of 3 slices of 6 s
    .venv/bin/python bench/noisy_neighbour.py --rounds 5 --slice 8 --agents 8
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

import redis

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.http_load import cpu_seconds, pct  # noqa: E402
from bench.rawhttp import RawClient  # noqa: E402
from ctxcore.config import Settings, hash_token  # noqa: E402
from tests.chaos.processes import free_port  # noqa: E402
from workers.embedded import ensure_redis  # noqa: E402
from workers.keyspace import delete_prefixed_keys  # noqa: E402

QUIET, NOISY, UNLIMITED = "quiet", "noisy", "unlimited"
CONDITIONS = ("baseline", "noisy, limited", "noisy, unlimited")
NOISY_TENANT = {"noisy, limited": NOISY, "noisy, unlimited": UNLIMITED}
OVERSIZED_PER_SECOND = 0.8
SETTLE = 1.0  # seconds at the start of a slice whose windows are left out
# A refused upload: the server answered (and may close) before the client sent it all.
CLOSED = (OSError, asyncio.IncompleteReadError)


@dataclass
class Slice:
    """One slice of one condition: when, the windows started in it, and the API's CPU."""

    condition: str
    round: int
    start: float
    end: float
    windows: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0


@dataclass
class Noisy:
    """The noisy clients' answers and accepted bytes, per condition."""

    answers: dict[str, Counter[str]] = field(default_factory=dict)
    accepted: Counter[str] = field(default_factory=Counter)
    # Admitted (past the byte-rate check, so charged to the bucket): accepted or refused by count.
    charged: Counter[str] = field(default_factory=Counter)


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


async def quiet_agent(
    http: RawClient, token: str, n: int, slices: list[Slice], quiet_errors: Counter[int]
) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    conv = f"/v1/conversations/quiet-{n}"
    step, until = 0, slices[-1].end
    while time.monotonic() < until:
        batch = [
            {"role": "user", "content": f"check {step}"},
            {"role": "assistant", "content": f"done {step}"},
        ]
        appended = await http.post(f"{conv}/messages", json={"messages": batch}, headers=auth)
        if appended.status_code >= 400:
            quiet_errors[appended.status_code] += 1
        started = time.monotonic()
        window = await http.post(f"{conv}/window", json={"budget_tokens": 16_000}, headers=auth)
        took = (time.monotonic() - started) * 1000
        if window.status_code >= 400:
            quiet_errors[window.status_code] += 1
        for s in slices:
            if s.start + SETTLE <= started < s.end:
                s.windows.append(took)
        step += 1


async def slice_clock(slices: list[Slice], api_pid: int) -> None:
    """The API process's CPU over each slice, read at its boundaries."""
    for s in slices:
        await asyncio.sleep(max(0.0, s.start - time.monotonic()))
        before = cpu_seconds(api_pid)
        await asyncio.sleep(max(0.0, s.end - time.monotonic()))
        s.cpu_seconds = cpu_seconds(api_pid) - before


async def noisy_appender(
    http: RawClient, token: str, body: bytes, label: str, out: Noisy, until: float
) -> None:
    """Maximum-size appends back to back, each 429 waited out: the tenant's byte rate."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    answers = out.answers.setdefault(label, Counter())
    n = 0
    while time.monotonic() < until:
        try:
            answer = await http.post(
                f"/v1/conversations/noisy-{n % 4}/messages", content=body, headers=headers
            )
        except CLOSED:
            answers["max-size closed"] += 1
            await asyncio.sleep(1.0)
            continue
        answers[f"max-size {answer.status_code}"] += 1
        if answer.status_code == 429:
            await asyncio.sleep(
                max(0.0, min(float(answer.headers.get("retry-after", "1")), until - time.monotonic()))
            )
            continue
        if answer.status_code < 300:
            out.accepted[label] += len(body)
        out.charged[label] += len(body)
        n += 1


async def noisy_oversized(
    http: RawClient, token: str, body: bytes, label: str, out: Noisy, until: float
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    answers = out.answers.setdefault(label, Counter())
    while time.monotonic() < until:
        try:
            answer = await http.post("/v1/conversations/noisy-big/messages", content=body, headers=headers)
            answers[f"oversized {answer.status_code}"] += 1
            if answer.status_code != 429:
                out.charged[label] += len(body)
        except CLOSED:
            answers["oversized closed"] += 1  # refused mid-body: the server closed the connection
        await asyncio.sleep(min(1 / OVERSIZED_PER_SECOND, max(0.0, until - time.monotonic())))


def noisy_process(
    port: int,
    tokens: dict[str, str],
    plan: list[tuple[str, float, float]],
    big: bytes,
    oversized: bytes,
    out: Any,
) -> None:
    """The noisy tenants in a process of their own (their uploads never share an event loop,
    or the GIL, with the quiet agents' clock), sending during their slices of ``plan``
    ((condition, start, end) on the shared monotonic clock). Puts a ``Noisy`` on ``out``."""

    async def load() -> Noisy:
        result = Noisy()
        for condition, start, end in plan:
            tenant = NOISY_TENANT.get(condition)
            if tenant is None:
                continue
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            http = RawClient("127.0.0.1", port)
            await asyncio.gather(
                noisy_appender(http, tokens[tenant], big, condition, result, end),
                noisy_oversized(
                    RawClient("127.0.0.1", port), tokens[tenant], oversized, condition, result, end
                ),
            )
        return result

    out.put(asyncio.run(load()))


def config_file(directory: Path, url: str, prefix: str, tokens: dict[str, str], port: int) -> Path:
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
        # The noisy tenant keeps the default byte rate; the unlimited one, for comparison, not.
        f"[tenants.{UNLIMITED}]",
        "bytes_per_second = 1e12",
    ]
    path = directory / "ctxcore.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def wait_healthy(port: int, log: Path) -> None:
    http = RawClient("127.0.0.1", port)
    for _ in range(150):
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except CLOSED:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"ctxcore serve did not start; see {log}")


async def run(
    args: argparse.Namespace, url: str, prefix: str, workdir: Path
) -> tuple[list[Slice], Noisy, Counter[int]]:
    tokens = {tenant: f"bench-{tenant}-{uuid.uuid4().hex}" for tenant in (QUIET, NOISY, UNLIMITED)}
    settings = Settings()
    big, oversized = max_size_body(settings), oversized_body()
    print(
        f"noisy tenant: max-size appends of {len(big):,} bytes ({settings.service.max_messages_per_append} "
        f"messages) at its byte rate, and {len(oversized):,}-byte appends of 100,000 messages at "
        f"{OVERSIZED_PER_SECOND} requests/s; quiet tenant: {args.agents} closed-loop agents; "
        f"{args.rounds} rounds of {len(CONDITIONS)} slices of {args.slice:g} s; {os.cpu_count()} cores",
        flush=True,
    )
    port = free_port()
    config = config_file(workdir, url, prefix, tokens, port)
    log = workdir / "serve.log"
    with log.open("ab") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "serve"],
            env={**os.environ, "CTXCORE_CONFIG_FILE": str(config)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    quiet_errors: Counter[int] = Counter()
    try:
        await wait_healthy(port, log)
        # The noisy process starts (imports, builds nothing: the bodies are passed) before
        # the first slice; a warm-up slice of the quiet agents alone comes first.
        start = time.monotonic() + 3.0
        slices = [
            Slice(
                condition,
                r,
                start + (r * len(CONDITIONS) + i) * args.slice,
                start + (r * len(CONDITIONS) + i + 1) * args.slice,
            )
            for r in range(args.rounds)
            for i, condition in enumerate(CONDITIONS)
        ]
        results: Any = mp.Queue()
        plan = [(s.condition, s.start, s.end) for s in slices]
        noisy = mp.Process(target=noisy_process, args=(port, tokens, plan, big, oversized, results))
        noisy.start()
        http = RawClient("127.0.0.1", port)
        await asyncio.gather(
            slice_clock(slices, api.pid),
            *(quiet_agent(http, tokens[QUIET], n, slices, quiet_errors) for n in range(args.agents)),
        )
        noise: Noisy = results.get(timeout=120)
        noisy.join(30)
    finally:
        api.terminate()
        try:
            api.wait(20)
        except subprocess.TimeoutExpired:
            api.kill()
    return slices, noise, quiet_errors


def report(slices: list[Slice], noise: Noisy, quiet_errors: Counter[int], byte_rate: float) -> None:
    def windows(condition: str, round_: int | None = None) -> list[float]:
        return [
            w for s in slices if s.condition == condition and round_ in (None, s.round) for w in s.windows
        ]

    base = pct(windows("baseline"), 0.5)
    seconds = sum(s.end - s.start for s in slices if s.condition == "baseline")
    print(
        "\n| condition | quiet windows | quiet window p50 ms | p99 | p50 / baseline | per round | noisy MB/s accepted "
        "| charged | noisy answers | API CPU % |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rounds = sorted({s.round for s in slices})
    for condition in CONDITIONS:
        own = windows(condition)
        per_round = ", ".join(
            f"{pct(windows(condition, r), 0.5) / pct(windows('baseline', r), 0.5):.2f}" for r in rounds
        )
        answers = (
            ", ".join(f"{k}: {v}" for k, v in sorted(noise.answers.get(condition, Counter()).items())) or "-"
        )
        cpu = sum(s.cpu_seconds for s in slices if s.condition == condition)
        print(
            f"| {condition} | {len(own)} | {pct(own, 0.5):.1f} | {pct(own, 0.99):.1f} | {pct(own, 0.5) / base:.2f} | "
            f"{per_round} | {noise.accepted[condition] / seconds / 1e6:.2f} | "
            f"{noise.charged[condition] / seconds / 1e6:.2f} | {answers} | {100 * cpu / seconds:.0f} |"
        )
    ratio = pct(windows("noisy, limited"), 0.5) / base
    print(f"quiet errors: {', '.join(f'{k}: {v}' for k, v in sorted(quiet_errors.items())) or 'none'}")
    print(
        f"\nquiet tenant's median window with the noisy tenant at its byte rate ({byte_rate / 1e6:.2f} MB/s): "
        f"{ratio:.2f} x its baseline (goal <= 2: {'met' if ratio <= 2 else 'NOT met'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slice", type=float, default=6.0, help="seconds per slice (default 6)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three conditions (default 3)")
    parser.add_argument("--agents", type=int, default=4, help="the quiet tenant's agents (default 4)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    args = parser.parse_args()
    if args.agents < 1 or args.rounds < 1 or not args.slice > SETTLE:
        parser.error(f"--agents and --rounds must be at least 1 and --slice above {SETTLE:g}")
    server = ensure_redis(args.redis_url)
    url = args.redis_url if not server.started else server.url.rsplit("/", 1)[0] + "/15"
    prefix = f"noisy{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="ctxcore-noisy-") as workdir:
            slices, noise, quiet_errors = asyncio.run(run(args, url, prefix, Path(workdir)))
        report(slices, noise, quiet_errors, Settings().http.bytes_per_second)
    finally:
        delete_prefixed_keys(redis.Redis.from_url(url), prefix)
        if server.started:
            server.stop()


if __name__ == "__main__":
    main()
