"""Cluster faults mid-run: a master killed and restarted on its AOF, a slot resharded.

Each test starts a cluster of its own (never the session's: it kills and migrates) and
appends to conversations with message ids, retrying what failed, as a client of the API
does after a 503. Acknowledged appends must all be there afterwards, exactly once. One test
goes through the real HTTP app, for as long as the surviving masters answer CLUSTERDOWN.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from redis.crc import key_slot

from ctxcore.config import Settings, hash_token
from ctxcore.errors import StoreUnavailable
from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, RedisMessageLog
from tests.cluster import ClusterUnavailable, ScratchCluster, check_cluster, start_cluster
from tests.conftest import server_unavailable
from workers.http import create_app
from workers.redis_clients import cluster_client
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = [pytest.mark.chaos, pytest.mark.redis_cluster, pytest.mark.slow]

PREFIX = "chaos-cluster"
TOKEN = "cluster-fault-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture()
def durable_cluster(tmp_path: Path) -> Iterator[ScratchCluster]:
    try:
        cluster = start_cluster(tmp_path / "cluster", durable=True)
    except ClusterUnavailable as exc:
        server_unavailable(f"no Redis Cluster for the cluster fault tests: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _conversation_on(client: redis.Redis, node: str, slots: range | None = None) -> ConversationKey:
    """A conversation whose slot is served by ``node`` (and lies in ``slots`` when given)."""
    for n in range(100_000):
        key = ConversationKey("acme", f"c{n}")
        slot = key_slot(f"{PREFIX}:{key.hash_tag}:log".encode())
        if slots is not None and slot not in slots:
            continue
        if client.get_node_from_key(f"{PREFIX}:{key.hash_tag}:log").name == node:  # type: ignore[attr-defined]
            return key
    raise AssertionError(f"no conversation found on {node}")


def _append_until_acked(log: RedisMessageLog, key: ConversationKey, n: int, errors: list[str]) -> None:
    message = UserMessage(content=f"m{n}", message_id=f"id-{n}")
    deadline = time.monotonic() + 60
    while True:
        try:
            log.append(key, [message])
            return
        except StoreUnavailable as exc:
            errors.append(str(exc))
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _check_log(log: RedisMessageLog, key: ConversationKey, count: int) -> None:
    ids = [m.message_id for m in log.read_after(key, None)]
    assert ids == [f"id-{n}" for n in range(count)], ids[:20]


def test_a_killed_master_is_store_unavailable_then_nothing_acknowledged_is_lost(
    durable_cluster: ScratchCluster,
) -> None:
    client = cluster_client(durable_cluster.nodes, socket_timeout=1.0)
    log = RedisMessageLog(client, PREFIX)
    victim = durable_cluster.nodes[0]
    key = _conversation_on(client, victim)
    for n in range(50):
        log.append(key, [UserMessage(content=f"m{n}", message_id=f"id-{n}")])
    durable_cluster.kill(0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        log.append(key, [UserMessage(content="m50", message_id="id-50")])
    assert time.monotonic() - started < 10  # fails fast: an error, not a hang
    errors: list[str] = []
    restarter = threading.Timer(1.0, durable_cluster.restart, args=(0,))
    restarter.start()
    for n in range(50, 100):
        _append_until_acked(log, key, n, errors)
    restarter.join()
    check_cluster(durable_cluster.nodes)
    assert errors, "the appends never met the outage"
    _check_log(log, key, 100)
    client.close()


def test_a_slot_resharded_mid_run_writes_nothing_twice(durable_cluster: ScratchCluster) -> None:
    cli = durable_cluster.cli
    client = cluster_client(durable_cluster.nodes)
    source = durable_cluster.nodes[0]
    first = min(s for s, nodes in client.nodes_manager.slots_cache.items() if nodes[0].name == source)
    key = _conversation_on(client, source, range(first, first + 50))
    target = next(n for n in durable_cluster.nodes if n != source)
    log = RedisMessageLog(client, PREFIX)
    errors: list[str] = []
    stop = threading.Event()
    acked: list[int] = []

    def writer() -> None:
        n = 0
        while not stop.is_set() or n < 200:
            _append_until_acked(log, key, n, errors)
            acked.append(n)
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(0.2)
    reshard = [
        cli,
        "--cluster",
        "reshard",
        source,
        "--cluster-from",
        _id(source),
        "--cluster-to",
        _id(target),
    ]
    moved = subprocess.run(
        [*reshard, "--cluster-slots", "100", "--cluster-yes"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    stop.set()
    thread.join(timeout=120)
    assert moved.returncode == 0, moved.stdout[-500:]
    client.nodes_manager.initialize()
    assert client.get_node_from_key(f"{PREFIX}:{key.hash_tag}:log").name == target  # type: ignore[attr-defined]
    _check_log(log, key, len(acked))
    client.close()


def _id(node: str) -> str:
    """The cluster node id of ``host:port``."""
    host, port = node.rsplit(":", 1)
    conn = redis.Redis(host=host, port=int(port), decode_responses=True)
    try:
        return str(conn.execute_command("CLUSTER MYID"))
    finally:
        conn.close()


def _cluster_state(node: str) -> str:
    host, port = node.rsplit(":", 1)
    conn = redis.Redis(host=host, port=int(port), socket_connect_timeout=1, socket_timeout=2)
    try:
        return str(conn.cluster("info").get("cluster_state"))
    except redis.RedisError:
        return "unreachable"
    finally:
        conn.close()


def test_the_api_answers_503_while_a_master_is_down_and_loses_nothing_acknowledged(
    tmp_path: Path, redis_url: str
) -> None:
    """The HTTP app on a cluster whose master is SIGKILLed: 503 with ``Retry-After`` (never
    another error) for the dead master's conversation at once and, once the survivors mark
    it failed (``cluster-node-timeout`` 2 s) and answer CLUSTERDOWN, for every conversation;
    after the restart on its AOF every acknowledged append is in the log exactly once."""
    try:
        cluster = start_cluster(tmp_path / "cluster", durable=True, node_timeout_ms=2000)
    except ClusterUnavailable as exc:
        server_unavailable(f"no Redis Cluster for the cluster fault tests: {exc}")
    settings = Settings.load(
        {
            "redis": {
                "url": redis_url,
                "key_prefix": PREFIX,
                "cluster_nodes": cluster.nodes,
                "socket_timeout": 1,
            },
            "http": {"tokens": {hash_token(TOKEN): "acme"}, "requests_per_second": 1000, "burst": 1000},
        }
    )
    runtime = Runtime(settings)
    api = TestClient(create_app(runtime, InlineQueue()))  # a 5xx other than 503 would raise here
    try:
        victim, survivor = cluster.nodes[0], cluster.nodes[1]
        on_victim = _conversation_on(runtime.redis, victim).conversation_id
        on_survivor = _conversation_on(runtime.redis, survivor).conversation_id
        acked: dict[str, list[str]] = {on_victim: [], on_survivor: []}
        unavailable: list[str] = []

        def append(conv: str, n: int) -> int:
            body = {"messages": [{"role": "user", "content": f"m{n}", "message_id": f"id-{n}"}]}
            r = api.post(f"/v1/conversations/{conv}/messages", json=body, headers=AUTH)
            _check_answer(r.status_code, r.headers, r.text, unavailable, f"append {conv} {n}")
            if r.status_code in (200, 201):  # 200: a replay of a batch whose reply was lost
                acked[conv].append(f"id-{n}")
                return 201
            return r.status_code

        def window(conv: str) -> int:
            r = api.post(f"/v1/conversations/{conv}/window", json={"budget_tokens": 2000}, headers=AUTH)
            _check_answer(r.status_code, r.headers, r.text, unavailable, f"window {conv}")
            return r.status_code

        for n in range(10):
            assert append(on_victim, n) == 201 and append(on_survivor, n) == 201
        assert window(on_victim) == 200
        cluster.kill(0)
        # The dead master's conversation: 503 at once (connection refused), not a hang.
        started = time.monotonic()
        assert append(on_victim, 10) == 503 and window(on_victim) == 503
        assert time.monotonic() - started < 20
        # Until the survivors mark the master failed, the other conversation may still be served.
        n = 10
        deadline = time.monotonic() + 60
        while _cluster_state(survivor) != "fail":
            assert time.monotonic() < deadline, "the survivors never marked the killed master failed"
            if append(on_survivor, n) == 201:
                n += 1
            time.sleep(0.1)
        # CLUSTERDOWN on the surviving masters: every conversation is 503, health too.
        assert append(on_survivor, n) == 503 and window(on_survivor) == 503
        health = api.get("/healthz")
        assert health.status_code == 503 and health.headers["Retry-After"] == "1"
        cluster.restart(0)
        # The client retries what was not acknowledged, with the same message ids.
        for conv, start in ((on_victim, 10), (on_survivor, n)):
            for m in range(start, start + 10):
                retry_deadline = time.monotonic() + 60
                while append(conv, m) != 201:
                    assert time.monotonic() < retry_deadline, f"append {m} never acknowledged"
                    time.sleep(0.2)
        check_cluster(cluster.nodes, timeout=30)
        assert window(on_victim) == 200 and window(on_survivor) == 200
        assert api.get("/healthz").status_code == 200
        assert unavailable, "no request met the outage"
        for conv, ids in acked.items():
            r = api.get(f"/v1/conversations/{conv}/messages", params={"limit": 1000}, headers=AUTH)
            assert r.status_code == 200
            logged = [m["message_id"] for m in r.json()["messages"]]
            assert logged == ids == [f"id-{i}" for i in range(len(ids))], (conv, logged, ids)
    finally:
        api.close()
        runtime.redis.close()
        cluster.stop()


def _check_answer(status: int, headers: Any, body: str, unavailable: list[str], what: str) -> None:
    """Served, or 503 with ``Retry-After: 1`` and no internal address; never another status."""
    assert status in (200, 201, 503), (what, status, body)
    if status == 503:
        assert headers["Retry-After"] == "1", what
        assert "127.0.0.1" not in body, (what, body)
        unavailable.append(what)
