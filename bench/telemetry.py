"""Benchmark: what telemetry costs the fast path (issue 39). Asserts nothing.

One conversation of 200 logged messages (a user question, then agent steps: a tool call and
its result) on Redis 127.0.0.1:6379 db 10 (a unique key prefix, deleted afterwards). Each
sample is one step appended (``append_span`` + ``ContextService.append``) and one window
(``window_span`` + ``get_window`` + ``describe_window``), as the HTTP routes run them; the
conversation is trimmed back every 20 steps. Modes, interleaved in rounds so a noisy
neighbour hits them alike:

* ``before``: ``append`` and ``get_window`` called bare, as the routes did before telemetry;
* ``off``:    the routes' code with telemetry off (``NO_TRACER``);
* ``on-ok``:  an OTLP/HTTP endpoint that answers 200 at once (a local stand-in collector);
* ``on-hang``: an endpoint that accepts connections and never answers (the exporter waits
  its timeout, 10 s, per batch; the batch queue holds ``telemetry.max_queue_size`` spans,
  then drops them);
* ``on-refused``: a closed port.

Prints p50/p95/p99 of the append and the window per mode, and what the exporter did.

    .venv/bin/python bench/telemetry.py                # 6 rounds x 200 samples per mode
    .venv/bin/python bench/telemetry.py --rounds 2     # quicker
"""

from __future__ import annotations

import argparse
import http.server
import os
import platform
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import redis

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey
from ctxcore.telemetry import NO_TRACER, Tracer
from workers.embedded import ensure_redis
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime, build_service
from workers.service import ContextService, InlineQueue
from workers.telemetry.otel import otlp_tracer
from workers.telemetry.spans import append_span, describe_append, describe_window, window_span

BUDGET = 16_000
STEPS_PER_TRIM = 20
# Small enough that the hung exporter's queue fills within the run: past it spans are dropped.
HANG_QUEUE = 256


def step(i: int) -> list[AnyMessage]:
    call = ToolCall(
        id=f"b-{i}", name="get_reservation_details", arguments=f'{{"reservation_id": "R{i:05d}"}}'
    )
    result = f'{{"reservation_id": "R{i:05d}", "status": "confirmed", "cabin": "economy", "passengers": 2}}'
    return [
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(tool_call_id=call.id, content=result),
    ]


class _Collector(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def collector() -> tuple[str, Callable[[], None]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1/traces", server.shutdown


def hanging() -> tuple[str, socket.socket]:
    """A port that completes the TCP handshake (the backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces", sock


def refused() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1/traces"


def sample(service: ContextService, tracer: Tracer | None, key: ConversationKey, i: int) -> tuple[int, int]:
    messages = step(i)
    t0 = time.perf_counter_ns()
    if tracer is None:
        service.append(key, messages)
        t1 = time.perf_counter_ns()
        service.get_window(key, BUDGET)
    else:
        with append_span(tracer, key, len(messages)) as span:
            ids = service.append(key, messages)
            describe_append(span, ids, False)
        t1 = time.perf_counter_ns()
        with window_span(tracer, key, BUDGET, "api") as span:
            result = service.get_window(key, BUDGET)
            describe_window(span, result)
    return t1 - t0, time.perf_counter_ns() - t1


def overhead(tracers: dict[str, Tracer | None]) -> None:
    """The span machinery alone, per window (no Redis): ``window_span`` + ``describe_window``
    on a served window's result, best of 5 x 2,000."""
    from ctxcore.assemble import WindowResult
    from ctxcore.window import ContextStats

    result = WindowResult([], ContextStats(total_messages=40, total_tokens=9000), 3)
    key = ConversationKey("bench", "overhead")
    for m in ("off", "on-ok", "on-hang"):
        tracer = tracers[m]
        assert tracer is not None
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(2000):
                with window_span(tracer, key, BUDGET, "api") as span:
                    describe_window(span, result)
            best = min(best, (time.perf_counter_ns() - t0) / 2000 / 1000)
        print(f"span overhead per window, {m}: {best:.2f} us")


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--samples", type=int, default=200, help="per mode and round")
    args = parser.parse_args()
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")  # export often: the hang shows sooner
    embedded = ensure_redis("redis://127.0.0.1:6379/10")
    prefix = f"benchtel{uuid.uuid4().hex[:6]}"
    settings = Settings.load({"redis": {"url": embedded.url, "key_prefix": prefix}})
    rt = Runtime(settings)
    service = build_service(rt, InlineQueue())
    ok_url, stop_collector = collector()
    hang_url, hang_sock = hanging()
    tracers: dict[str, Tracer | None] = {
        "before": None,
        "off": NO_TRACER,
        "on-ok": otlp_tracer(Settings.load({"telemetry": {"otlp_endpoint": ok_url}}).telemetry),
        "on-hang": otlp_tracer(
            Settings.load({"telemetry": {"otlp_endpoint": hang_url, "max_queue_size": HANG_QUEUE}}).telemetry
        ),
        "on-refused": otlp_tracer(Settings.load({"telemetry": {"otlp_endpoint": refused()}}).telemetry),
    }
    appends: dict[str, list[int]] = {m: [] for m in tracers}
    windows: dict[str, list[int]] = {m: [] for m in tracers}
    keys = {m: ConversationKey("bench", f"tel-{m}") for m in tracers}
    try:
        for key in keys.values():
            service.append(key, [UserMessage(content="Look up my reservations, please.")])
            for i in range(99):
                service.append(key, step(i))
        anchor = {m: rt.log.last_id(k) for m, k in keys.items()}
        for m, key in keys.items():  # warm every path once
            sample(service, tracers[m], key, 10_000)
            rt.log.truncate_after(key, anchor[m] or "")
        order = list(keys)
        for r in range(args.rounds):
            for i in range(args.samples):
                # Interleaved, the starting mode rotating: drift and neighbours hit all alike.
                for m in order[i % len(order) :] + order[: i % len(order)]:
                    key = keys[m]
                    if i % STEPS_PER_TRIM == 0:
                        rt.log.truncate_after(key, anchor[m] or "")
                    a, w = sample(service, tracers[m], key, 1_000_000 + r * 10_000 + i)
                    appends[m].append(a)
                    windows[m].append(w)
        print(
            f"# {platform.node()} {os.cpu_count()} cpus, python {platform.python_version()}, "
            f"{args.rounds} rounds x {args.samples} samples per mode, budget {BUDGET}, tail 200-240 messages"
        )
        print(
            f"{'mode':<11} {'window p50':>10} {'p95':>7} {'p99':>7}   {'append p50':>10} {'p95':>7} {'p99':>7}  (ms)"
        )
        for m in tracers:
            w, a = windows[m], appends[m]
            print(
                f"{m:<11} {pct(w, 0.5):>10.3f} {pct(w, 0.95):>7.3f} {pct(w, 0.99):>7.3f}   "
                f"{pct(a, 0.5):>10.3f} {pct(a, 0.95):>7.3f} {pct(a, 0.99):>7.3f}"
            )
        base = statistics.median(windows["before"])
        for m in tracers:
            print(f"window p50 {m} / before: {statistics.median(windows[m]) / base:.3f}")
        print(f"spans per mode: {2 * args.rounds * args.samples + 2}; on-hang's queue holds {HANG_QUEUE}")
        overhead(tracers)
    finally:
        client = redis.Redis.from_url(embedded.url)
        delete_prefixed_keys(client, prefix)
        client.close()
        stop_collector()
        hang_sock.close()
        embedded.stop()
        os._exit(0)  # the hanging exporter's thread would hold the exit for its timeout


if __name__ == "__main__":
    main()
