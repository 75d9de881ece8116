"""Benchmark: the SQL window read, one statement against the stores one by one.

The agent pattern of ``fast_path.py`` on SQL stores: a conversation of ``--messages`` logged
messages (tau-bench runs, as ``fast_path_flat.py`` builds them) whose saved state covers all
but its newest 50, one step appended before each window. Per backend, p50/p99 of
``get_window`` with ``SqlWindowReader`` (one ``UNION ALL`` statement, outside a
transaction; the budget upserted only when it changed) and with the reads the service made
before it (state, budget upsert, pinned entries, tail: each its own transaction), windows
alternating between the two on the same conversation, and the statements each sent.
SQLite (a temporary file) always runs; PostgreSQL when it answers. Tables are dropped
afterwards. Asserts nothing.

    .venv/bin/python bench/sql_window.py [--windows 300] [--postgres-url URL]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy
from fast_path import step
from fast_path_flat import BUDGET, DEFAULT_DATA, conversation, covered_state, tau_tools
from store_latency import percentiles

from ctxcore.config import Settings
from ctxcore.state import ConversationKey, SqlMessageLog, SqlStateStore
from ctxcore.state.sql.schema import Tables
from workers.service import ContextService, InlineQueue


def measure(name: str, url: str, prefix: str, windows: int, messages: int) -> None:
    state = SqlStateStore(url, table_prefix=prefix)
    state.setup()
    log = SqlMessageLog(engine=state.engine, table_prefix=prefix)
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    try:
        one = ContextService(Settings(), state, log, None, InlineQueue())
        each = ContextService(Settings(), state, log, None, InlineQueue())
        each._window_reader = None  # the stores one by one, as before the one statement
        system, body = conversation(DEFAULT_DATA / "tau_bench.jsonl", messages)
        key = ConversationKey("bench", f"sql-{uuid.uuid4().hex[:6]}")
        ids: list[str] = []
        for i in range(0, len(body), 1000):
            chunk = body[i : i + 1000]
            counts = one.append_counts(body[max(0, i - 64) : i], chunk)
            assert counts is not None
            ids += log.counted().append_counted(key, chunk, counts)
        assert state.save(key, covered_state(body, ids, 50), 0)
        tools = tau_tools()
        samples: dict[str, list[int]] = {"one statement": [], "store by store": []}
        sent: dict[str, int] = dict.fromkeys(samples, 0)
        services: dict[str, ContextService] = {"one statement": one, "store by store": each}
        for s in services.values():
            s.get_window(key, BUDGET, system, tools)  # warm-up
        sqlalchemy.event.listen(state.engine, "before_cursor_execute", count)
        nominal = ids[-1]
        for n in range(windows):
            if n % 20 == 0:
                log.truncate_after(key, nominal)  # back to the nominal tail
            one.append(key, step(n))
            for label in list(services) if n % 2 else list(reversed(services)):
                statements.clear()
                started = time.perf_counter_ns()
                services[label].get_window(key, BUDGET, system, tools)
                samples[label].append(time.perf_counter_ns() - started)
                sent[label] += len(statements)
        sqlalchemy.event.remove(state.engine, "before_cursor_execute", count)
        for label, values in samples.items():
            p50, p99 = percentiles(values)
            print(
                f"| {name} | {label} | {len(values)} | {p50:.2f} | {p99:.2f} | {sent[label] / len(values):.1f} |"
            )
    finally:
        with state.engine.begin() as conn:
            for table in reversed(list(Tables.for_prefix(prefix).__dict__.values())):
                conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table.name}"')
        state.close()


def answers(url: str) -> bool:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect():
            return True
    except sqlalchemy.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=300, help="windows per read shape (default 300)")
    parser.add_argument("--messages", type=int, default=2_000, help="logged messages (default 2,000)")
    parser.add_argument("--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    print(
        f"get_window on SQL stores, {args.messages:,} logged messages, tail ~50 after the cursor, "
        f"budget {BUDGET:,}; milliseconds\n"
    )
    print("| backend | read | windows | p50 | p99 | statements per window |\n|---|---|---|---|---|---|")
    runs: list[tuple[str, Callable[[str], str]]] = [("sqlite", lambda d: f"sqlite:///{d}/bench.db")]
    if answers(args.postgres_url):
        runs.append(("postgres", lambda _: args.postgres_url))
    else:
        print(f"(PostgreSQL at {args.postgres_url} does not answer: skipped)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, url in runs:
            measure(name, url(tmp), f"bench_{uuid.uuid4().hex[:8]}_", args.windows, args.messages)


if __name__ == "__main__":
    main()
