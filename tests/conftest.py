"""Shared fixtures: real Redis and PostgreSQL servers, and the store backends built on them.

A server that does not answer skips its tests locally; with ``CI=true`` it fails them, so a
CI run can never pass by skipping. Override the servers with ``CTXCORE_TEST_REDIS_URL`` and
``CTXCORE_TEST_POSTGRES_URL``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import NoReturn

import pytest
import redis
import sqlalchemy
from hypothesis import settings as hypothesis_settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxcore.state import (
    ConversationKey,
    FilesystemOffloadStore,
    MemoryMessageLog,
    MemoryOffloadStore,
    MemoryStateStore,
    MessageLog,
    OffloadStore,
    RedisMessageLog,
    RedisOffloadStore,
    RedisStateStore,
    SqlMessageLog,
    SqlOffloadStore,
    SqlStateStore,
    StateStore,
)
from ctxcore.state.journal import JOURNAL_LIMIT, MemoryStageJournal, StageJournal
from ctxcore.state.redis.journal import RedisStageJournal
from ctxcore.state.sql.journal import SqlStageJournal
from tests.cluster import ClusterUnavailable, ScratchCluster, check_cluster, start_cluster
from tests.rabbitmq import RABBITMQ_URL, delete_deployment, rabbitmq_problem
from workers.keyspace import delete_prefixed_keys
from workers.redis_clients import cluster_client

# Property tests: 100 examples; in CI the examples are derandomized, so a landing is judged on
# the same inputs every time (exploration with fresh seeds happens on developers' runs and in
# the opt-in "long" profile).
hypothesis_settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=os.environ.get("CI", "").strip().lower() == "true"
)
hypothesis_settings.register_profile("long", max_examples=10_000, deadline=None)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REDIS_URL = os.environ.get("CTXCORE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "CTXCORE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def server_unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it when ``CI=true`` (a CI run must exercise every backend)."""
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{reason} (CI=true: the server is required, not skipped)", pytrace=False)
    pytest.skip(reason)


def fast_fail_redis(url: str) -> redis.Redis:
    """A client that gives up at once: redis-py 8 retries failed connections by default."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5, retry=Retry(NoBackoff(), 0))


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of a Redis server that answers PING."""
    client = fast_fail_redis(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        server_unavailable(f"no Redis server at {REDIS_URL}: {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture(scope="session")
def redis_cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """``host:port`` of a three-master Redis Cluster: ``CTXCORE_TEST_REDIS_CLUSTER`` when set,
    else one started for the whole run (see ``tests.cluster``) and stopped after it."""
    given = os.environ.get("CTXCORE_TEST_REDIS_CLUSTER", "").strip()
    if given:
        nodes = [n.strip() for n in given.split(",") if n.strip()]
        try:
            check_cluster(nodes, timeout=5)
        except ClusterUnavailable as exc:
            server_unavailable(f"CTXCORE_TEST_REDIS_CLUSTER: {exc}")
        yield nodes
        return
    try:
        cluster: ScratchCluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    except ClusterUnavailable as exc:
        server_unavailable(f"no Redis Cluster for the redis_cluster tests: {exc}")
    try:
        yield cluster.nodes
        crossslot = cross_slot_errors(cluster.nodes)
    finally:
        cluster.stop()
    if crossslot:
        # Every ctxcore call on the cluster must stay in one slot (issue 22's goal: 0 CROSSSLOT).
        pytest.fail(f"the cluster answered CROSSSLOT {crossslot} times during the run", pytrace=False)


def cross_slot_errors(nodes: list[str]) -> int:
    """CROSSSLOT errors the nodes answered since they started (``INFO errorstats``)."""
    total = 0
    for node in nodes:
        host, port = node.rsplit(":", 1)
        client = redis.Redis(host=host, port=int(port), socket_connect_timeout=1, socket_timeout=5)
        try:
            total += int(client.info("errorstats").get("errorstat_CROSSSLOT", {}).get("count", 0))
        finally:
            client.close()
    return total


@pytest.fixture
def cluster_redis(redis_cluster_nodes: list[str]) -> Iterator[tuple[redis.Redis, str]]:
    """A ``RedisCluster`` client (as the runtime builds it) and a key prefix unique to this
    test, whose keys are deleted afterwards."""
    client = cluster_client(redis_cluster_nodes)
    prefix = f"ctxcore-test-{uuid.uuid4().hex}"
    try:
        yield client, prefix
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The SQLAlchemy URL of a PostgreSQL server that accepts a connection."""
    engine = sqlalchemy.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sqlalchemy.exc.SQLAlchemyError as exc:
        server_unavailable(f"no PostgreSQL server at {POSTGRES_URL}: {str(exc).splitlines()[0]}")
    finally:
        engine.dispose()
    return POSTGRES_URL


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The AMQP URL of a RabbitMQ server that accepts a connection."""
    problem = rabbitmq_problem(RABBITMQ_URL)
    if problem is not None:
        server_unavailable(problem)
    return RABBITMQ_URL


@pytest.fixture
def rabbitmq_prefix(rabbitmq_url: str) -> Iterator[str]:
    """A key prefix unique to this test; the queues and exchanges it names on RabbitMQ are
    deleted afterwards (``tests.rabbitmq.delete_deployment``), nothing else."""
    prefix = f"ctxcore-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_deployment(prefix, rabbitmq_url)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix unique to this test; its keys (``<prefix>:*`` and hash-tagged
    ``{<prefix>:*``) are removed afterwards by SCAN + DEL, nothing else."""
    prefix = f"ctxcore-test-{uuid.uuid4().hex}"
    yield prefix
    client = fast_fail_redis(redis_url)
    try:
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


@pytest.fixture(scope="session")
def postgres_engine(postgres_url: str) -> Iterator[tuple[sqlalchemy.Engine, str]]:
    """One engine and a table prefix unique to this session, schema set up; tables dropped after."""
    prefix = f"ctxcore_test_{uuid.uuid4().hex[:8]}_"
    store = SqlStateStore(postgres_url, table_prefix=prefix)
    store.setup()
    yield store.engine, prefix
    drop_postgres_tables(store.engine, prefix)
    store.close()


def sql_engine_for(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[sqlalchemy.Engine, str]:
    """The engine and table prefix for a fixture parametrised ``"sqlite"`` (a file in
    ``tmp_path``, set up and closed after the test) or ``"postgres"`` (the session's)."""
    if request.param == "postgres":
        engine, prefix = request.getfixturevalue("postgres_engine")
        return engine, prefix
    setup = SqlStateStore(f"sqlite:///{tmp_path / 'ctx.db'}")
    setup.setup()
    request.addfinalizer(setup.close)
    return setup.engine, setup.table_prefix


def drop_postgres_tables(engine: sqlalchemy.Engine, prefix: str) -> None:
    """Drop every table whose name starts with ``prefix``."""
    with engine.begin() as conn:
        names = conn.execute(
            sqlalchemy.text(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND left(table_name, :n) = :prefix"
            ),
            {"n": len(prefix), "prefix": prefix},
        ).scalars()
        for name in list(names):
            conn.exec_driver_sql(f'DROP TABLE "{name}"')


class Backend:
    """The stores of one backend for one test (built on first use, shared within the test)."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = kind
        self._request = request
        self._tmp_path = tmp_path

    @cached_property
    def _redis(self) -> tuple[redis.Redis, str]:
        if self.kind == "redis_cluster":
            client, prefix = self._request.getfixturevalue("cluster_redis")
            return client, prefix
        client = redis.Redis.from_url(self._request.getfixturevalue("redis_url"))
        self._request.addfinalizer(client.close)
        return client, self._request.getfixturevalue("redis_prefix")

    @cached_property
    def _sql(self) -> tuple[sqlalchemy.Engine, str]:
        if self.kind == "postgres":
            engine, prefix = self._request.getfixturevalue("postgres_engine")
            return engine, prefix
        store = SqlStateStore(f"sqlite:///{self._tmp_path / 'ctxcore.db'}")
        store.setup()
        self._request.addfinalizer(store.close)
        return store.engine, store.table_prefix

    @cached_property
    def state(self) -> StateStore:
        """This backend's ``StateStore``."""
        if self.kind == "memory":
            return MemoryStateStore()
        if self.kind in ("redis", "redis_cluster"):
            return RedisStateStore(*self._redis)
        engine, prefix = self._sql
        return SqlStateStore(engine=engine, table_prefix=prefix)

    @cached_property
    def log(self) -> MessageLog:
        """This backend's ``MessageLog``."""
        if self.kind == "memory":
            return MemoryMessageLog()
        if self.kind in ("redis", "redis_cluster"):
            return RedisMessageLog(*self._redis)
        engine, prefix = self._sql
        return SqlMessageLog(engine=engine, table_prefix=prefix)

    def independent_log(self) -> MessageLog:
        """Another ``MessageLog`` over the same data with its own client / engine, as another
        process would have (memory: the same object, there is no other process)."""
        if self.kind == "memory":
            return self.log
        if self.kind == "redis":
            client = redis.Redis.from_url(self._request.getfixturevalue("redis_url"))
            self._request.addfinalizer(client.close)
            return RedisMessageLog(client, self._redis[1])
        if self.kind == "redis_cluster":
            other = cluster_client(self._request.getfixturevalue("redis_cluster_nodes"))
            self._request.addfinalizer(other.close)
            return RedisMessageLog(other, self._redis[1])
        engine, prefix = self._sql
        log = SqlMessageLog(engine.url, table_prefix=prefix)
        self._request.addfinalizer(log.close)
        return log

    def offloads(self, ttl_seconds: float | None = None) -> OffloadStore:
        """A new ``OffloadStore`` of this backend over the test's data."""
        if self.kind == "memory":
            return MemoryOffloadStore()
        if self.kind == "filesystem":
            return FilesystemOffloadStore(self._tmp_path / "offloads")
        if self.kind in ("redis", "redis_cluster"):
            return RedisOffloadStore(*self._redis, ttl_seconds=ttl_seconds)
        engine, prefix = self._sql
        return SqlOffloadStore(engine=engine, table_prefix=prefix, ttl_seconds=ttl_seconds)

    def journal(self, limit: int = JOURNAL_LIMIT) -> StageJournal:
        """A new ``StageJournal`` of this backend over the test's data."""
        if self.kind == "memory":
            return MemoryStageJournal(limit)
        if self.kind in ("redis", "redis_cluster"):
            return RedisStageJournal(*self._redis, limit=limit)
        engine, prefix = self._sql
        return SqlStageJournal(engine=engine, table_prefix=prefix, limit=limit)


BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("redis_cluster", id="redis_cluster", marks=pytest.mark.redis_cluster),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each store backend in turn: memory, Redis, Redis Cluster, SQLite (a file in tmp_path),
    PostgreSQL."""
    return Backend(request.param, request, tmp_path)


@pytest.fixture
def tenant() -> str:
    """A tenant id unique to this test (the PostgreSQL tables are shared by the session)."""
    return f"tenant-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def conv_key(tenant: str) -> ConversationKey:
    """A conversation of this test's tenant."""
    return ConversationKey(tenant, "conv-1")


def pytest_report_header() -> str:
    """Which ``redis-server`` the tests' own servers run on (chosen by version, not PATH order)."""
    from tests.redis_binaries import NoSuitableRedis, found_redis_servers, pick_redis_server

    try:
        chosen = pick_redis_server().describe()
    except NoSuitableRedis as exc:
        chosen = str(exc)
    seen = ", ".join(f"{p} ({'.'.join(map(str, v)) if v else '?'})" for p, v in found_redis_servers())
    return f"redis-server for the tests' own servers: {chosen}; found: {seen}"
