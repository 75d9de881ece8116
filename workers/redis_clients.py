"""The process's Redis clients: a plain Redis, or one ``RedisCluster`` for ``redis.cluster_nodes``.

With ``redis.cluster_nodes`` set, every ctxcore key (state, log, offloads, archives, locks,
compaction status, scheduler, rate limiter, circuit breaker and usage) lives on the
cluster, and ``redis.url`` names only Celery's broker and result backend. That one must be a
plain Redis: kombu's Redis transport has no cluster mode, so start-up refuses a ``redis.url``
whose server reports ``cluster_enabled:1``.

``RedisCluster`` offers the command API of ``redis.Redis`` (scripts, pipelines, locks); the
stores are typed against ``redis.Redis`` and take either. It follows MOVED and ASK itself
and retries TRYAGAIN and connection errors a few times (a failover, a resharding) before the
error reaches a store, which turns it into ``StoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ctxcore.config import RedisSettings
from ctxcore.errors import ConfigError, StoreUnavailable

__all__ = [
    "SLOTS",
    "check_plain_broker",
    "check_ready",
    "cluster_client",
    "is_cluster",
    "redis_client",
    "settings_client",
    "uncovered_slots",
]

SLOTS = 16384


def redis_client(url: str, socket_timeout: float = 5.0) -> redis.Redis:
    """A client that fails fast: redis-py retries by default, which turns an outage into
    seconds of hanging instead of a clear ``StoreUnavailable``."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 2.0),
        retry=Retry(NoBackoff(), 0),
    )


def _node(text: str) -> ClusterNode:
    host, _, port = text.rpartition(":")
    # redis-py leaves ClusterNode.__init__ unannotated.
    return ClusterNode(host.strip("[]"), int(port))  # type: ignore[no-untyped-call]


def uncovered_slots(client: RedisCluster) -> list[tuple[int, int]]:
    """Slot ranges no master serves, as inclusive ``(first, last)`` pairs."""
    covered = client.nodes_manager.slots_cache
    out: list[tuple[int, int]] = []
    for slot in range(SLOTS):
        if covered.get(slot):
            continue
        if out and out[-1][1] == slot - 1:
            out[-1] = (out[-1][0], slot)
        else:
            out.append((slot, slot))
    return out


def cluster_client(nodes: Sequence[str], socket_timeout: float = 5.0) -> redis.Redis:
    """One ``RedisCluster`` over the seed ``nodes`` (``host:port``), checked to cover every slot.

    Raises ``StoreUnavailable`` when no seed answers and ``ConfigError`` when slots are
    unassigned (naming them). Connection errors are retried twice with a short backoff (a
    replica taking over); anything longer reaches the caller as ``StoreUnavailable``.
    """
    try:
        client = RedisCluster(
            startup_nodes=[_node(n) for n in nodes],
            require_full_coverage=False,
            socket_timeout=socket_timeout,
            socket_connect_timeout=min(socket_timeout, 2.0),
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
        )
    except (RedisClusterException, redis.RedisError) as exc:
        raise StoreUnavailable(f"Redis Cluster at {', '.join(nodes)} unavailable: {exc}") from exc
    missing = uncovered_slots(client)
    if missing:
        client.close()
        ranges = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in missing)
        raise ConfigError(
            f"Redis Cluster at {', '.join(nodes)} does not cover slots {ranges}: "
            "assign them (redis-cli --cluster fix) before starting ctxcore"
        )
    # RedisCluster has redis.Redis's command API; the stores are typed against the latter.
    return cast(redis.Redis, client)


def is_cluster(client: object) -> bool:
    """True for a ``RedisCluster`` client (some calls differ: e.g. cross-slot pipelines)."""
    return isinstance(client, RedisCluster)


def check_ready(client: redis.Redis) -> None:
    """Raise ``StoreUnavailable`` unless ``client`` can serve now (one call either way).

    A plain Redis must answer PING. On a cluster, PING is answered even while the cluster is
    down (a master lost past ``cluster-node-timeout``, no replica to promote: every keyed
    command gets CLUSTERDOWN), so the check is ``CLUSTER INFO`` of the client's default node:
    it must answer and report ``cluster_state:ok``.
    """
    try:
        if not is_cluster(client):
            client.ping()
            return
        state = cast(RedisCluster, client).cluster_info().get("cluster_state")
    except (redis.RedisError, RedisClusterException) as exc:
        raise StoreUnavailable(f"Redis unavailable: {exc}") from exc
    if state != "ok":
        raise StoreUnavailable(f"Redis Cluster state is {state}, not ok (CLUSTERDOWN)")


def check_plain_broker(url: str, socket_timeout: float = 5.0) -> None:
    """Raise ``ConfigError`` when ``url`` (Celery's broker) is a Redis Cluster node.

    A broker that does not answer is left for Celery to report.
    """
    client = redis_client(url, socket_timeout)
    try:
        info = client.info("cluster")
    except redis.RedisError:
        return
    finally:
        client.close()
    if int(info.get("cluster_enabled", 0)) == 1:
        raise ConfigError(
            f"redis.url {url} is a Redis Cluster node, but Celery's broker and result backend need "
            "a plain Redis (kombu has no cluster mode): put the cluster's nodes in "
            "redis.cluster_nodes and point redis.url at a plain Redis"
        )


def settings_client(settings: RedisSettings) -> redis.Redis:
    """The ctxcore client of ``settings``: the cluster when ``cluster_nodes`` is set (after
    checking that ``url`` is a plain Redis), else a plain client on ``url``."""
    check_plain_broker(settings.url, settings.socket_timeout)
    if settings.cluster_nodes:
        return cluster_client(settings.cluster_nodes, settings.socket_timeout)
    return redis_client(settings.url, settings.socket_timeout)
