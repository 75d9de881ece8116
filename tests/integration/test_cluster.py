"""ctxcore on a real three-master Redis Cluster: client start-up, scheduler, lock, limiter.

The store contract suites run on the cluster through the ``redis_cluster`` backend
(tests/conftest.py) and the circuit breaker's through its ``client`` fixture.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from ctxcore.config import Settings
from ctxcore.errors import ConfigError, StoreUnavailable
from ctxcore.state import ConversationKey
from tests.cluster import ClusterUnavailable, _free_ports, cluster_binary
from tests.conftest import server_unavailable
from workers import scheduler_scripts
from workers.locks import LockBusy, conversation_lock
from workers.ratelimit import RateLimiter
from workers.redis_clients import check_plain_broker, cluster_client, settings_client
from workers.scheduler import FairScheduler, ring_tags

pytestmark = pytest.mark.redis_cluster


@pytest.fixture()
def cluster(cluster_redis: tuple[redis.Redis, str]) -> tuple[redis.Redis, str]:
    """A cluster client and this test's key prefix."""
    return cluster_redis


def test_sixteen_rings_spread_over_the_three_masters(cluster: tuple[redis.Redis, str]) -> None:
    client, prefix = cluster
    tags = ring_tags(prefix, 16)
    for i, tag in enumerate(tags):
        assert i * 1024 <= key_slot(tag.encode()) < (i + 1) * 1024
    per_master = Counter(client.get_node_from_key(t).name for t in tags)  # type: ignore[attr-defined]
    # Two rings' slot ranges straddle a master boundary (5461, 10923): 5 +- 1 each, never more.
    assert len(per_master) == 3 and all(4 <= n <= 6 for n in per_master.values()), per_master


def test_scheduler_round_trip_on_the_cluster(cluster: tuple[redis.Redis, str]) -> None:
    client, prefix = cluster
    sched = FairScheduler(client, prefix)
    key = ConversationKey("acme", "busy")
    first = sched.request(key)
    assert first.created and first.token == sched.ring_of("acme")
    assert [bool(sched.request(key)) for _ in range(5)] == [False] * 5
    job = sched.next_job(first.token)
    assert job is not None and job.key == key and not job.resend
    assert not sched.request(key) and sched.status(key) == "running"
    assert sched.finish(key) == 1 and sched.status(key) == "queued"
    assert sched.depth() == 1
    assert sched.next_job(None) is not None and sched.finish(key) == 0 and sched.status(key) == "idle"
    sched.request(ConversationKey("acme", "gone"))
    sched.forget(ConversationKey("acme", "gone"))
    assert sched.depth() == 0 and sched.next_job(None) is None


def test_the_status_is_mirrored_into_the_conversations_compaction_hash(
    cluster: tuple[redis.Redis, str],
) -> None:
    from workers.failures import FailureStore

    client, prefix = cluster
    failures = FailureStore(client, prefix)
    sched = FairScheduler(client, prefix, mirror=failures.key)
    key = ConversationKey("acme", "mirrored")
    seen = [failures.get(key).scheduler_status]
    sched.request(key)
    seen.append(failures.get(key).scheduler_status)
    job = sched.next_job(sched.ring_of("acme"))
    assert job is not None
    seen.append(failures.get(key).scheduler_status)
    sched.request(key)  # dirty: still running
    seen.append(failures.get(key).scheduler_status)
    sched.finish(key)  # the follow-up is queued
    seen.append(failures.get(key).scheduler_status)
    assert sched.next_job(sched.ring_of("acme")) is not None and sched.finish(key) == 0
    seen.append(failures.get(key).scheduler_status)
    assert seen == ["idle", "queued", "running", "running", "queued", "idle"]
    # A late writer (an older seq of the ring) changes nothing.
    mirror = client.register_script(scheduler_scripts.MIRROR)
    assert mirror(keys=[failures.key(key)], args=["queued:1", 1]) == 0
    assert failures.get(key).scheduler_status == "idle" == sched.status(key)


def test_fairness_one_tenant_with_ten_thousand_jobs(cluster: tuple[redis.Redis, str]) -> None:
    """Tokens are consumed in send order (one FIFO, like the Celery jobs queue); the quiet
    tenants' first jobs start within rings x ring_tokens drains."""
    client, prefix = cluster
    sched = FairScheduler(client, prefix)
    tokens: deque[int | None] = deque()
    pipe_keys = [ConversationKey("heavy", f"c{n}") for n in range(10_000)]
    for key in pipe_keys:
        requested = sched.request(key)
        if requested.token is not None:
            tokens.append(requested.token)
    assert len(tokens) == sched.ring_tokens  # the heavy ring's tokens are capped
    for tenant in ("light-1", "light-2"):
        requested = sched.request(ConversationKey(tenant, "only"))
        if requested.token is not None:
            tokens.append(requested.token)
    started: dict[str, int] = {}
    drains = 0
    while tokens and len(started) < 3:
        ring = tokens.popleft()
        drains += 1
        job = sched.next_job(ring)
        if job is None:
            continue
        started.setdefault(job.key.tenant_id, drains)
        if job.resend:
            tokens.append(job.ring)
    limit = sched.rings * sched.ring_tokens
    assert started.get("light-1", limit + 1) <= limit and started.get("light-2", limit + 1) <= limit, started


def test_a_different_ring_count_is_refused(cluster: tuple[redis.Redis, str]) -> None:
    client, prefix = cluster
    FairScheduler(client, prefix, rings=16).check()
    with pytest.raises(ConfigError, match=r"scheduler_rings is 8 .* 16 rings"):
        FairScheduler(client, prefix, rings=8).check()


def test_lock_and_rate_limiter_on_the_cluster(cluster: tuple[redis.Redis, str]) -> None:
    client, prefix = cluster
    key = ConversationKey("acme", "locked")
    with conversation_lock(client, prefix, key, timeout=5):
        busy = pytest.raises(LockBusy)
        with busy, conversation_lock(client, prefix, key):
            pass
    with conversation_lock(client, prefix, key):
        pass
    limiter = RateLimiter(client, prefix)
    assert [limiter.take("t1", rate=0.001, burst=2).allowed for _ in range(3)] == [True, True, False]
    assert limiter.take("t2", rate=0.001, burst=1).allowed
    assert limiter.key("t1") == f"{{{prefix}:rate:t1}}"  # each tenant's bucket is its own slot


def test_settings_build_a_cluster_client_and_refuse_a_cluster_broker(
    redis_cluster_nodes: list[str], redis_url: str
) -> None:
    settings = Settings.from_env(
        {"CTXCORE_REDIS__CLUSTER_NODES": ",".join(redis_cluster_nodes), "CTXCORE_REDIS_URL": redis_url}
    )
    assert settings.redis.cluster_nodes == tuple(redis_cluster_nodes)
    client = settings_client(settings.redis)
    try:
        assert client.ping()
    finally:
        client.close()
    with pytest.raises(ConfigError, match="is a Redis Cluster node"):
        check_plain_broker(f"redis://{redis_cluster_nodes[0]}/0")


def test_a_cluster_without_full_coverage_is_refused(tmp_path: Path) -> None:
    try:
        server = cluster_binary().server
    except ClusterUnavailable as exc:
        server_unavailable(f"no redis-server for a cluster node: {exc}")
    port, bus = _free_ports(2)
    args = [server, "--port", str(port), "--cluster-port", str(bus), "--cluster-enabled", "yes"]
    args += ["--cluster-config-file", str(tmp_path / "nodes.conf"), "--dir", str(tmp_path)]
    args += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        node = redis.Redis(port=port)
        for _ in range(100):
            try:
                node.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        node.execute_command("CLUSTER ADDSLOTSRANGE", 0, 99)
        with pytest.raises(ConfigError, match=r"does not cover slots 100-16383"):
            cluster_client([f"127.0.0.1:{port}"])
        node.close()
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_no_seed_answering_is_store_unavailable() -> None:
    (port,) = _free_ports(1)
    with pytest.raises(StoreUnavailable, match="unavailable"):
        cluster_client([f"127.0.0.1:{port}"], socket_timeout=0.5)


@pytest.fixture()
def cluster_settings(redis_cluster_nodes: list[str], redis_url: str) -> Iterator[Settings]:
    """Settings on the cluster, with Celery's broker on the plain Redis; this test's keys
    are deleted from both afterwards."""
    from workers.keyspace import delete_prefixed_keys

    prefix = f"t{uuid.uuid4().hex[:8]}"
    yield Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix, "cluster_nodes": redis_cluster_nodes},
            "worker": {"retry_delays": [0.1, 0.2, 0.4], "lock_timeout": 10},
            "engine": {"keep_recent_messages": 4},
        }
    )
    for client in (redis.Redis.from_url(redis_url), cluster_client(redis_cluster_nodes)):
        try:
            delete_prefixed_keys(client, prefix)
        finally:
            client.close()


def test_distributed_end_to_end_on_the_cluster(cluster_settings: Settings) -> None:
    """The distributed e2e test with ctxcore's keys on the cluster, Celery on the plain Redis."""
    from tests.integration.test_distributed import test_end_to_end_swe_run_turn_by_turn
    from tests.workers_fixture import in_process_worker

    with in_process_worker(cluster_settings) as rt:
        assert type(rt.redis).__name__ == "RedisCluster"
        test_end_to_end_swe_run_turn_by_turn(rt)


def test_start_up_refuses_a_cluster_broker_and_a_changed_ring_count(
    redis_cluster_nodes: list[str], cluster: tuple[redis.Redis, str], redis_url: str
) -> None:
    from workers.runtime import check_startup

    _, prefix = cluster
    as_broker = Settings.load({"redis": {"url": f"redis://{redis_cluster_nodes[0]}/0", "key_prefix": prefix}})
    with pytest.raises(ConfigError, match="is a Redis Cluster node"):
        check_startup(as_broker)
    on_cluster = {"url": redis_url, "key_prefix": prefix, "cluster_nodes": redis_cluster_nodes}
    check_startup(Settings.load({"redis": on_cluster}))
    with pytest.raises(ConfigError, match=r"scheduler_rings is 4 but .* 16 rings"):
        check_startup(Settings.load({"redis": on_cluster, "worker": {"scheduler_rings": 4}}))


def test_usage_lives_per_tenant_and_is_read_by_another_process(
    cluster: tuple[redis.Redis, str],
) -> None:
    from workers.usage import Usage

    client, prefix = cluster
    writer = Usage(client, prefix)
    writer.add("t1", 1, 10, 5)
    writer.add("t2", 2, 20, 10)
    assert writer.key("t1") == f"{{{prefix}:usage:t1}}"
    reader = Usage(client, prefix)  # another process
    assert reader.of("t1") == {"calls": 1, "input_tokens": 10, "output_tokens": 5}
    assert reader.of("t2") == {"calls": 2, "input_tokens": 20, "output_tokens": 10}
