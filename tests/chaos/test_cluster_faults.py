"""Cluster faults mid-run: a master killed and restarted on its AOF, a slot resharded.

Each test starts a cluster of its own (never the session's: it kills and migrates) and
appends to conversations with message ids, retrying what failed, as a client of the API
does after a 503. Acknowledged appends must all be there afterwards, exactly once.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from ctxcore.errors import StoreUnavailable
from ctxcore.messages import UserMessage
from ctxcore.state import ConversationKey, RedisMessageLog
from tests.cluster import ClusterUnavailable, ScratchCluster, check_cluster, start_cluster
from tests.conftest import server_unavailable
from workers.redis_clients import cluster_client

pytestmark = [pytest.mark.chaos, pytest.mark.redis_cluster, pytest.mark.slow]

PREFIX = "chaos-cluster"


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
    cli = shutil.which("redis-cli")
    assert cli is not None
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
