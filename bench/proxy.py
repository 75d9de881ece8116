"""Benchmark: what the OpenAI-compatible proxy adds to an agent's model call.

The bundled mini-swe-agent runs (one conversation each, until ``--calls`` model calls) are
played with the official ``openai`` SDK twice per turn, side by side in one run: straight to
the local OpenAI-compatible test server (``OpenAIServer``, in this process, answering each
turn with its recorded reply), and through ``ctxcore serve``'s ``POST /v1/chat/completions``
(a subprocess, with a ``ctxcore worker`` subprocess compacting in the background) in front of
the same server. The direct call sends the agent's whole history, as an agent without
ctxcore does; the proxied one sends the same and gets the window forwarded.

Prints p50/p95 of both, the overhead (p50 of the per-turn differences and the difference of
the p50s) and its split from the proxy's ``Server-Timing`` header: ``append`` (parsing the
request, matching it against the hash index, appending its new messages and the reply),
``window``
(``get_window``) and ``forwarding`` (the rest: the extra HTTP hop, authentication, JSON
re-encoding and the upstream call's own overhead). Asserts nothing.

    .venv/bin/python bench/proxy.py                       # 100 calls, Redis db 14 on 6379
    .venv/bin/python bench/proxy.py --stream --redis-url redis://127.0.0.1:6419/14
    .venv/bin/python bench/proxy.py --long                # every call of the three runs (187)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import redis

from ctxcore.config import hash_token
from ctxcore.messages import from_openai, to_openai
from ctxcore.testing import OpenAIServer
from workers.keyspace import delete_prefixed_keys

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "ctxcore" / "samples" / "agent_runs.jsonl"
MODEL = "swe-agent-model"
TOKEN = "bench-proxy-token"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run one shell command in the repository and return its output.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def runs() -> Iterator[tuple[list[dict[str, Any]], list[tuple[dict[str, Any], list[dict[str, Any]]]]]]:
    """Each bundled mini-swe-agent run: its first two messages, then (reply, what follows)."""
    for line in SAMPLES.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if not str(record.get("source", "")).startswith("mini-swe-agent"):
            continue
        steps: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        for message in record["messages"][2:]:
            if message["role"] == "assistant":
                reply = to_openai(from_openai([message]))[0]
                steps.append(({k: v for k, v in reply.items() if k in ("content", "tool_calls")}, []))
            elif steps:
                steps[-1][1].append(message)
        yield record["messages"][:2], steps


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timings(header: str | None) -> dict[str, float]:
    """``Server-Timing`` as name -> milliseconds."""
    out: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name and dur:
            out[name] = float(dur)
    return out


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"ctxcore serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("ctxcore serve did not become healthy in 30 s")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="model calls to play (default 100)")
    parser.add_argument("--long", action="store_true", help="every model call of the bundled runs (187)")
    parser.add_argument("--window", type=int, default=8000, help="the model's window (tokens)")
    parser.add_argument("--reserve", type=int, default=2000, help="max_tokens of each call")
    parser.add_argument(
        "--stream", action="store_true", help="stream the calls (no split: headers come first)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    if args.long:
        args.calls = sum(len(steps) for _, steps in runs())

    prefix = f"benchpx{uuid.uuid4().hex[:8]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with OpenAIServer() as upstream:
        env = {
            **os.environ,
            "CTXCORE_REDIS_URL": args.redis_url,
            "CTXCORE_REDIS__KEY_PREFIX": prefix,
            "CTXCORE_HTTP__TOKENS": json.dumps({hash_token(TOKEN): "bench"}),
            "CTXCORE_HTTP__REQUESTS_PER_SECOND": "10000",
            "CTXCORE_HTTP__BURST": "10000",
            "CTXCORE_PROXY__UPSTREAM_BASE_URL": upstream.base_url,
            "CTXCORE_PROXY__CONTEXT_WINDOW_TOKENS": json.dumps({MODEL: args.window}),
        }
        ctxcore = [sys.executable, "-m", "workers.cli"]
        serve = subprocess.Popen([*ctxcore, "serve", "--port", str(port)], env=env, stderr=subprocess.DEVNULL)
        worker = subprocess.Popen(
            [*ctxcore, "worker", "--hostname", f"{prefix}@%h"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_healthy(url, serve)
            direct_ms, proxied_ms, diffs = [], [], []
            split: dict[str, list[float]] = {"append": [], "window": [], "forwarding": []}
            cpu: dict[str, list[float]] = {"parse": [], "append": [], "window": []}
            calls = 0
            for head, steps in runs():
                conv = f"bench-{uuid.uuid4().hex[:8]}"
                direct = openai.OpenAI(base_url=upstream.base_url, api_key="local", max_retries=0)
                proxied = openai.OpenAI(
                    base_url=f"{url}/v1",
                    api_key=TOKEN,
                    max_retries=0,
                    default_headers={"X-Ctxcore-Conversation": conv},
                )
                history = list(head)
                for reply, following in steps:
                    if calls == args.calls:
                        break
                    timed: list[tuple[float, dict[str, float]]] = []
                    for client in (direct, proxied):
                        upstream.push_reply(reply.get("content"), reply.get("tool_calls"))
                        started = time.perf_counter()
                        raw = client.chat.completions.with_raw_response.create(
                            model=MODEL,
                            messages=history,
                            tools=TOOLS,
                            max_tokens=args.reserve,
                            stream=args.stream,  # type: ignore[arg-type, call-overload]
                        )
                        parsed = raw.parse()
                        if args.stream:
                            for _ in parsed:
                                pass
                        timed.append(
                            (
                                (time.perf_counter() - started) * 1000,
                                timings(raw.headers.get("server-timing")),
                            )
                        )
                    (d, _), (p, server) = timed
                    direct_ms.append(d)
                    proxied_ms.append(p)
                    diffs.append(p - d)
                    if not args.stream:
                        append = (
                            server.get("parse", 0.0) + server.get("append", 0.0) + server.get("reply", 0.0)
                        )
                        window = server.get("window", 0.0)
                        split["append"].append(append)
                        split["window"].append(window)
                        split["forwarding"].append(p - d - append - window)
                        cpu["parse"].append(server.get("parse-cpu", 0.0))
                        cpu["append"].append(server.get("append-cpu", 0.0))
                        cpu["window"].append(server.get("window-cpu", 0.0))
                    history += [{"role": "assistant", **reply}, *following]
                    calls += 1
                direct.close()
                proxied.close()
                if calls == args.calls:
                    break
        finally:
            for process in (serve, worker):
                process.terminate()
            for process in (serve, worker):
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
            client = redis.Redis.from_url(args.redis_url)
            delete_prefixed_keys(client, prefix)
            client.close()

    mode = "streamed" if args.stream else "not streamed"
    print(f"proxy overhead, {calls} model calls of the bundled mini-swe-agent runs ({mode}),")
    print(f"window {args.window} - reserve {args.reserve} = budget {args.window - args.reserve} tokens\n")
    print(f"{'path':<26}{'p50 ms':>10}{'p95 ms':>10}")
    print(f"{'SDK -> test server':<26}{statistics.median(direct_ms):>10.2f}{pct(direct_ms, 0.95):>10.2f}")
    print(
        f"{'SDK -> proxy -> server':<26}{statistics.median(proxied_ms):>10.2f}{pct(proxied_ms, 0.95):>10.2f}"
    )
    print(f"\noverhead p50 (per-turn difference): {statistics.median(diffs):.2f} ms (goal <= 5 ms)")
    print(
        f"difference of the p50s:             {statistics.median(proxied_ms) - statistics.median(direct_ms):.2f} ms"
    )
    if not args.stream:
        print("\nsplit of the overhead (p50 of each part, Server-Timing):")
        for name, values in split.items():
            print(f"  {name:<11}{statistics.median(values):>8.2f} ms   p95 {pct(values, 0.95):.2f} ms")
        print(
            "CPU time of the proxy's thread before the upstream call (a loaded machine's waiting left out):"
        )
        for name, values in cpu.items():
            print(f"  {name:<11}{statistics.median(values):>8.2f} ms   p95 {pct(values, 0.95):.2f} ms")


if __name__ == "__main__":
    main()
