"""``ctxcore demo``: the whole distributed system on one machine, with no setup.

Three tenants' agents replay the bundled runs turn by turn against the fast path while an
in-process Celery worker compacts their conversations in the background with the offline
``ExtractiveModel``. Every served window is checked (budget, protocol, anchors) as it goes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

import redis

from ctxcore.config import Settings
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.turns import anchors
from ctxcore.window import check_window
from workers.table_cells import cell

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from celery.worker import WorkController

__all__ = ["run_demo"]

TENANTS = ("acme", "globex", "initech")


@dataclass
class Track:
    """One conversation being replayed."""

    key: ConversationKey
    system: list[AnyMessage]
    steps: list[list[AnyMessage]]
    budget: int
    raw_tokens: int = 0
    sent: int = 0
    windows: int = 0
    fallbacks: int = 0
    peak: int = 0
    last_window: int = 0
    violations: int = 0
    anchors_lost: int = 0


def _steps(messages: Sequence[AnyMessage]) -> list[list[AnyMessage]]:
    """Split into appendable units: user message(s), or an assistant message with its results."""
    out: list[list[AnyMessage]] = []
    for message in messages:
        if message.role == "tool" and out:
            out[-1].append(message)
        else:
            out.append([message])
    return out


def _load(path: str) -> list[Track]:
    tracks = []
    with open(path, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    for n, record in enumerate(records):
        messages = from_openai(record["messages"])
        system: list[AnyMessage] = [m for m in messages if isinstance(m, SystemMessage)]
        rest = [m for m in messages if not isinstance(m, SystemMessage)]
        # The run's own key prefix keeps it apart from other runs: the id is the record's.
        conv_id = str(record["id"])[:128].replace("/", "-")
        # Budgets small enough that every run needs compaction.
        budget = 3500 if str(record["id"]).startswith("tau") else 8000
        tracks.append(
            Track(ConversationKey(TENANTS[n % len(TENANTS)], conv_id), system, _steps(rest), budget)
        )
    return tracks


class StopSignals:
    """SIGTERM and SIGINT set a flag the demo's loops check (the handlers never raise, so the
    clean-up is never cut short halfway); the previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def stopping(self) -> bool:
        """True once a signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> StopSignals:
        # Handlers can only be installed from the main thread (tests may call from others).
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def run_demo(
    settings: Settings, sample_path: str, out: TextIO, *, interactive: bool, timeout: float = 100.0
) -> int:
    """Run the demo; returns the process exit code: 0 when windows were checked and every one
    was valid, 1 otherwise, 128 + the signal number when stopped by SIGTERM (143) or SIGINT
    (130). Every key it writes, Celery's included, carries a ``demo<hex>`` prefix and is
    deleted at the end; an embedded redis-server it started is stopped and its directory
    removed, on a signal too. ``timeout`` (seconds, above 0) is checked by the parser."""
    with StopSignals() as stop:
        from workers.embedded import ensure_redis
        from workers.keyspace import delete_prefixed_keys

        server = ensure_redis(settings.redis.url)
        note = "started an embedded redis-server" if server.started else "using the Redis server"
        out.write(f"ctxcore demo: {note} at {server.url}\n")
        prefix = f"demo{uuid.uuid4().hex[:6]}"
        settings = settings.model_copy(
            update={"redis": settings.redis.model_copy(update={"url": server.url, "key_prefix": prefix})}
        )
        deleted = 0
        try:
            code = 1 if stop.stopping else _run(settings, sample_path, out, interactive, timeout, stop)
        finally:
            # After the worker stopped (it writes keys): then nothing of the demo is left.
            if not server.started:
                with contextlib.closing(redis.Redis.from_url(server.url)) as client:
                    deleted = delete_prefixed_keys(client, prefix)
            server.stop()
        if stop.signum is not None:
            name = signal.Signals(stop.signum).name
            what = (
                "stopped the embedded redis-server and removed its directory"
                if server.started
                else f"deleted its {deleted} keys (prefix {prefix}) from {server.url}"
            )
            out.write(f"{chr(10) if interactive else ''}ctxcore demo: stopped by {name}; {what}\n")
            return 128 + stop.signum
        return code


def _run(
    settings: Settings, sample_path: str, out: TextIO, interactive: bool, timeout: float, stop: StopSignals
) -> int:
    from celery.contrib.testing.worker import start_worker

    from workers.app import app, configure, queue_names, runtime
    from workers.runtime import build_service
    from workers.tasks import CeleryQueue

    configure(settings)
    started = time.monotonic()
    with (
        contextlib.ExitStack() as stack,
        start_worker(
            app,
            pool="threads",
            concurrency=2,
            perform_ping_check=False,
            queues=queue_names(settings).consume_order(),
            shutdown_timeout=30,
        ) as worker,
    ):
        # Celery's test worker stops cold: a stage already running in the thread pool goes
        # on after the worker thread ended. Wait for it, so no task writes a key after the
        # demo deleted its own (or reads a conversation that is gone).
        stack.callback(_wait_for_running_tasks, worker)
        rt = runtime()
        service = build_service(rt, CeleryQueue())
        tracks = _load(sample_path)
        out.write(
            f"replaying {len(tracks)} agent runs for tenants {', '.join(TENANTS)}; model: "
            f"{'ExtractiveModel (offline)' if settings.model.offline else settings.model.name}\n\n"
        )
        _replay(service, rt, tracks, out, interactive, started + timeout * 0.7, stop)
        _drain(rt, tracks, out, started + timeout, stop)
        if stop.stopping:
            return 1
        for track in tracks:
            result = service.get_window(track.key, track.budget, track.system)
            track.last_window = result.stats.total_tokens
        _summary(rt, tracks, out, time.monotonic() - started)
    if not any(t.windows for t in tracks):
        out.write(f"no window was checked within the {timeout:g} s timeout: nothing was shown to work\n")
        return 1
    return 0 if all(_valid(t) for t in tracks) else 1


def _wait_for_running_tasks(worker: WorkController) -> None:
    from celery.concurrency.thread import TaskPool

    # pool="threads" (in _run) makes the pool Celery's thread TaskPool. celery-types declares
    # ``pool`` as the Pool bootstep and leaves out the ThreadPoolExecutor that TaskPool's
    # __init__ sets as ``executor``.
    pool: object = worker.pool
    if isinstance(pool, TaskPool):
        executor: ThreadPoolExecutor = pool.executor  # type: ignore[attr-defined]
        executor.shutdown(wait=True)


def _valid(track: Track) -> bool:
    return track.violations == 0 and track.anchors_lost == 0 and track.peak <= track.budget


def _replay(
    service: Any,
    rt: Any,
    tracks: list[Track],
    out: TextIO,
    interactive: bool,
    deadline: float,
    stop: StopSignals,
) -> None:
    total = sum(len(t.steps) for t in tracks)
    done = 0
    last_version: dict[ConversationKey, int] = {}
    while any(t.sent < len(t.steps) for t in tracks) and time.monotonic() < deadline:
        for track in tracks:
            if stop.stopping:
                return
            if track.sent >= len(track.steps):
                continue
            service.append(track.key, track.steps[track.sent])
            track.sent += 1
            done += 1
            logged = rt.log.read_after(track.key, None)
            track.raw_tokens = rt.counter.count_messages([*track.system, *logged])
            result = service.get_window(track.key, track.budget, track.system)
            track.windows += 1
            track.fallbacks += int(result.fallback_applied)
            track.peak = max(track.peak, result.stats.total_tokens)
            track.violations += len(check_window(result.messages))
            served = {m.context_message_id for m in result.messages}
            track.anchors_lost += sum(
                1 for i in anchors(logged).indices() if logged[i].context_message_id not in served
            )
            version = result.state_version
            if version != last_version.get(track.key, 0):
                last_version[track.key] = version
                out.write(
                    ("\r" if interactive else "")
                    + f"{cell(track.key.tenant_id, 8)} {cell(track.key.conversation_id, 28)} state v{version:<3} "
                    f"window {result.stats.total_tokens:>6,}/{track.budget:,} tok  raw {track.raw_tokens:>7,} tok  "
                    f"compaction {result.compaction}\n"
                )
            if interactive:
                bar = int(30 * done / total)
                out.write(f"\r[{'#' * bar}{'.' * (30 - bar)}] {done}/{total} steps appended")
                out.flush()
    if interactive:
        out.write("\n")


def _drain(rt: Any, tracks: list[Track], out: TextIO, deadline: float, stop: StopSignals) -> None:
    while time.monotonic() < deadline and not stop.stopping:
        if all(rt.scheduler.status(t.key) == "idle" for t in tracks):
            return
        time.sleep(0.2)
    if not stop.stopping:
        out.write("some compactions were still running at the deadline\n")


def _summary(rt: Any, tracks: list[Track], out: TextIO, elapsed: float) -> None:
    out.write("\n")
    header = f"{'tenant':<8} {'conversation':<30} {'msgs':>5} {'raw tok':>8} {'window':>7} {'budget':>6} {'ratio':>6} {'ver':>4} {'blocks':>6} {'fallback':>8} {'ok':>3}"
    out.write(header + "\n" + "-" * len(header) + "\n")
    for t in tracks:
        state = rt.state_store.load(t.key) or CompressionState()
        msgs = sum(len(s) for s in t.steps[: t.sent])
        ratio = t.raw_tokens / t.last_window if t.last_window else 0.0
        out.write(
            f"{cell(t.key.tenant_id, 8)} {cell(t.key.conversation_id, 30)} {msgs:>5} {t.raw_tokens:>8,} {t.last_window:>7,} "
            f"{t.budget:>6,} {ratio:>5.1f}x {state.version:>4} {len(state.blocks):>6} "
            f"{t.fallbacks:>4}/{t.windows:<3} {'yes' if _valid(t) else 'NO':>3}\n"
        )
    out.write(
        f"\n{sum(t.windows for t in tracks)} windows served, every one within budget, protocol-valid and "
        f"with both anchors: {'yes' if all(t.violations == 0 and t.anchors_lost == 0 for t in tracks) else 'NO'}; "
        f"{elapsed:.1f} s\n"
    )
