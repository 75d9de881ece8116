"""Store outage: the test's own ``redis-server`` (free port, temp dir, ``appendonly yes``,
``appendfsync always``; never the shared 127.0.0.1:6379) is ``kill -9``-ed and restarted
while appends and windows run through ``ContextService`` and the HTTP API.

Promised: while it is down every call fails with ``StoreUnavailable`` (HTTP 503 with
``Retry-After``), never another error and never a partial write; after the restart calls
succeed again; every append acknowledged before a kill is in the log, once, in order, with
the ids it was acknowledged with (clients retry unacknowledged batches: their
``message_id`` makes the retry idempotent).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.errors import StoreUnavailable
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage, to_openai
from ctxcore.state import ConversationKey
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from tests.chaos.helpers import conversation_problems
from tests.chaos.processes import RedisProcess
from workers.http import create_app
from workers.runtime import Runtime, build_service
from workers.service import InlineQueue

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN = "outage-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BUDGET = 3000


@dataclass
class _Client:
    """One appender: acknowledged batches in order, and what went wrong while the store was down."""

    key: ConversationKey
    acked: list[tuple[list[AnyMessage], list[str]]] = field(default_factory=list)
    unavailable: int = 0
    unexpected: list[str] = field(default_factory=list)
    windows: int = 0


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    proc = RedisProcess(tmp_path / "redis")
    proc.start()
    yield proc
    proc.kill()


def _batch(tag: str, n: int) -> list[AnyMessage]:
    return [
        UserMessage(content=f"{tag} question {n}: " + "lorem ipsum " * 20, message_id=f"{tag}-{n}-u"),
        AssistantMessage(content=f"{tag} answer {n}", message_id=f"{tag}-{n}-a"),
    ]


def test_redis_killed_and_restarted_during_appends_and_windows(server: RedisProcess) -> None:
    settings = Settings.load(
        {
            "redis": {"url": server.url, "key_prefix": "outage", "socket_timeout": 1.0},
            "http": {
                "tokens": {hash_token(TOKEN): "tenant-a"},
                "requests_per_second": 10_000,
                "burst": 10_000,
            },
            "engine": {"keep_recent_messages": 4},
        }
    )
    rt = Runtime(settings)
    service = build_service(rt, InlineQueue())
    http = TestClient(create_app(rt, InlineQueue()))
    counter = TiktokenCounter()
    stop = threading.Event()
    down = threading.Event()
    service_client = _Client(ConversationKey("tenant-a", "via-service"))
    http_client = _Client(ConversationKey("tenant-a", "via-http"))

    def run_service() -> None:
        c, n = service_client, 0
        batch = _batch("svc", n)
        while not stop.is_set():
            try:
                ids = service.append(c.key, batch)
                c.acked.append((batch, ids))
                n += 1
                batch = _batch("svc", n)
                window = service.get_window(c.key, BUDGET)
                c.windows += 1
                if counter.count_messages(window.messages) > BUDGET or check_window(window.messages):
                    c.unexpected.append("window does not fit or is invalid")
            except StoreUnavailable:
                c.unavailable += 1
                time.sleep(0.02)  # then retry the same batch: same message ids
            except Exception as exc:
                c.unexpected.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.005)

    def run_http() -> None:
        c, n = http_client, 0
        batch = _batch("http", n)
        path = f"/v1/conversations/{c.key.conversation_id}"
        while not stop.is_set():
            r = http.post(
                f"{path}/messages", json={"messages": to_openai(batch, include_extra=True)}, headers=AUTH
            )
            if r.status_code in (200, 201):
                c.acked.append((batch, r.json()["ids"]))
                n += 1
                batch = _batch("http", n)
                w = http.post(f"{path}/window", json={"budget_tokens": BUDGET}, headers=AUTH)
                if w.status_code == 200:
                    c.windows += 1
                    if w.json()["stats"]["total_tokens"] > BUDGET:
                        c.unexpected.append("window over budget")
                elif w.status_code == 503:
                    c.unavailable += 1
                    if w.headers.get("Retry-After") is None:
                        c.unexpected.append("503 without Retry-After")
                else:
                    c.unexpected.append(f"window: HTTP {w.status_code} {w.text[:200]}")
            elif r.status_code == 503:
                c.unavailable += 1
                if r.headers.get("Retry-After") is None or r.json().get("error") != "store_unavailable":
                    c.unexpected.append(f"bad 503: {r.headers} {r.text[:200]}")
                if server.url.split("//")[1].split("/")[0] in r.text:
                    c.unexpected.append("503 body reveals the store address")
                time.sleep(0.02)
            else:
                c.unexpected.append(f"append: HTTP {r.status_code} {r.text[:200]}")
            time.sleep(0.005)

    threads = [threading.Thread(target=run_service), threading.Thread(target=run_http)]
    for t in threads:
        t.start()
    rng = random.Random(3)
    outages: list[tuple[int, int]] = []
    try:
        for _ in range(3):
            time.sleep(rng.uniform(0.6, 1.2))
            before = (service_client.unavailable, http_client.unavailable)
            server.kill()
            down.set()
            # Down until both clients have met the outage (bounded), not for a fixed time: a
            # slow request on a loaded machine must not make the test miss it.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and (
                service_client.unavailable == before[0] or http_client.unavailable == before[1]
            ):
                time.sleep(0.05)
            time.sleep(0.3)
            # While down: health says so, and direct calls fail with StoreUnavailable.
            health = http.get("/healthz")
            assert health.status_code == 503 and health.headers.get("Retry-After")
            with pytest.raises(StoreUnavailable):
                service.get_window(service_client.key, BUDGET)
            server.start()
            down.clear()
            time.sleep(0.8)
            outages.append((service_client.unavailable - before[0], http_client.unavailable - before[1]))
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    for c in (service_client, http_client):
        assert c.unexpected == [], c.unexpected[:5]
        # Every outage was seen by both clients, and work resumed after each.
        assert c.unavailable > 0 and c.windows > 0
        assert len(c.acked) > 10
    assert all(s > 0 and h > 0 for s, h in outages), outages
    assert http.get("/healthz").status_code == 200

    # Nothing acknowledged is lost: the log is exactly the acknowledged batches, in order,
    # each once, under the ids they were acknowledged with (a batch whose write landed
    # but whose reply was lost was retried and deduplicated).
    for c in (service_client, http_client):
        logged = rt.log.read_after(c.key, None)
        expected = [m for batch, _ in c.acked for m in batch]
        got_ids = [i for _, ids in c.acked for i in ids]
        bare = [m.model_copy(update={"context_message_id": None}) for m in logged]
        # The one batch in flight when the test stopped may or may not have landed.
        assert bare[: len(expected)] == expected
        assert len(bare) - len(expected) in (0, 2)
        assert [m.context_message_id for m in logged[: len(expected)]] == got_ids
        assert conversation_problems(rt.state_store, rt.log, c.key) == []
    http.close()


def test_windows_after_a_restart_load_their_scripts_again(server: RedisProcess) -> None:
    """A restarted server has no scripts: the window's pipelined read loads its own again."""
    rt = Runtime(Settings.load({"redis": {"url": server.url, "key_prefix": "restart"}}))
    service = build_service(rt, InlineQueue())
    key = ConversationKey("tenant-a", "restarted")
    for n in range(3):
        service.append(key, _batch("r", n))
    first = service.get_window(key, BUDGET)  # the window script; the cursor is now known
    reader = service._window_reader
    assert reader is not None
    service.get_window(key, BUDGET)
    server.kill()
    server.start()
    again = service.get_window(key, BUDGET)
    assert again.messages == first.messages
