"""The workers' Prometheus series: multiprocess mode, the node's server, bounded labels."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from ctxcore.messages import AssistantMessage, UserMessage
from ctxcore.state import ConversationKey
from tests.chaos.helpers import REPO, free_port
from workers.keyspace import delete_prefixed_keys
from workers.prom_worker import disable_multiprocess, enable_multiprocess, node_registry, start_node_metrics
from workers.scheduler import FairScheduler
from workers.service import ContextService


def compact_one(service: ContextService, key: ConversationKey) -> None:
    """Twelve long steps, then a window: the conversation is over its trigger and a job queues."""
    text = "a long reply about the build and its failing tests " * 40
    for i in range(12):
        service.append(key, [UserMessage(content=f"step {i}"), AssistantMessage(content=text)])
    service.get_window(key, 1500, [])


def wait_idle(scheduler: FairScheduler, key: ConversationKey, seconds: float) -> bool:
    """True once the scheduler has nothing queued or running for ``key`` (within ``seconds``)."""
    deadline = time.time() + seconds
    while time.time() < deadline and scheduler.status(key) != "idle":
        time.sleep(0.1)
    return scheduler.status(key) == "idle"


@pytest.fixture()
def metrics_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ctxcore-test-metrics-") as directory:
        enable_multiprocess(directory)
        try:
            yield directory
        finally:
            disable_multiprocess()


@pytest.mark.redis
def test_a_stage_run_in_a_real_worker_moves_the_stage_histogram(redis_url: str, metrics_dir: str) -> None:
    from celery.contrib.testing.worker import start_worker

    from workers.app import app, configure, queue_names, runtime
    from workers.runtime import build_service
    from workers.tasks import CeleryQueue

    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = Settings.load(
        {
            "redis": {"url": redis_url, "key_prefix": prefix},
            "worker": {"retry_delays": [0.1], "lock_timeout": 10},
            "engine": {"keep_recent_messages": 2},
        }
    )
    configure(settings)
    key = ConversationKey("acme", f"conv-{uuid.uuid4().hex[:6]}")
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=1,
            perform_ping_check=False,
            queues=queue_names(settings).consume_order(),
            shutdown_timeout=20,
        ):
            rt = runtime()
            compact_one(build_service(rt, CeleryQueue()), key)
            assert wait_idle(rt.scheduler, key, 60)
    finally:
        client = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(client, prefix)
        client.close()

    families = {f.name: f for f in node_registry(metrics_dir).collect()}
    counts = [s for s in families["ctxcore_stage_seconds"].samples if s.name == "ctxcore_stage_seconds_count"]
    assert sum(s.value for s in counts) >= 1, counts
    assert {s.labels["outcome"] for s in counts} <= {"compressed", "skipped", "conflict", "failed"}
    # Bounded labels only: stage kinds, outcomes, error kinds, hold reasons and buckets; never
    # a conversation, and a tenant only on the summariser tokens each tenant spends (issue 34:
    # tenants are the deployment's, not the callers' to multiply).
    for family in families.values():
        for sample in family.samples:
            if sample.name == "ctxcore_summariser_tokens_total":
                assert set(sample.labels) == {"tenant"} and sample.labels["tenant"] == "acme", sample
                continue
            assert set(sample.labels) <= {"stage", "outcome", "kind", "reason", "le"}, sample
            assert not any(key.conversation_id in v or "acme" in v for v in sample.labels.values()), sample
    assert sum(s.value for s in families["ctxcore_summariser_tokens"].samples) > 0


def test_the_node_serves_its_processes_metrics_on_metrics_port() -> None:
    port = free_port()
    settings = Settings.load({"worker": {"metrics_port": port}})
    try:
        assert start_node_metrics(settings) == port
        from workers.prom_worker import stage_metrics

        stage_metrics().stage_seconds.labels("l0_to_l1", "compressed").observe(0.2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        disable_multiprocess()
    assert "# TYPE ctxcore_stage_seconds histogram" in body
    assert 'ctxcore_stage_seconds_bucket{le="0.25",outcome="compressed",stage="l0_to_l1"} 1.0' in body


def test_a_metrics_port_in_use_fails_the_start_naming_it() -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        settings = Settings.load({"worker": {"metrics_port": port}})
        with pytest.raises(ConfigError, match=rf"worker.metrics_port {port} is already in use"):
            start_node_metrics(settings)


def test_metrics_port_zero_serves_nothing() -> None:
    assert start_node_metrics(Settings.load({"worker": {"metrics_port": 0}})) is None


@pytest.mark.redis
def test_a_prefork_ctxcore_worker_serves_its_childrens_stages(redis_url: str, tmp_path: Path) -> None:
    """``ctxcore worker`` as deployed: the stage runs in a forked pool child, the node's
    server (the parent) sums the child's files."""
    from workers.app import configure
    from workers.runtime import Runtime, build_service
    from workers.tasks import CeleryQueue

    prefix = f"t{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {
        **os.environ,
        "CTXCORE_REDIS_URL": redis_url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "CTXCORE_ENGINE__KEEP_RECENT_MESSAGES": "2",
        "CTXCORE_WORKER__CONCURRENCY": "2",
        "CTXCORE_WORKER__METRICS_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    env.pop("CTXCORE_CONFIG_FILE", None)
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--loglevel", "INFO"],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    settings = Settings.load(
        {"redis": {"url": redis_url, "key_prefix": prefix}, "engine": {"keep_recent_messages": 2}}
    )
    configure(settings)
    rt = Runtime(settings)
    key = ConversationKey("acme", f"conv-{uuid.uuid4().hex[:6]}")
    try:
        compact_one(build_service(rt, CeleryQueue()), key)
        assert wait_idle(rt.scheduler, key, 90), (tmp_path / "worker.log").read_text()[-3000:]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        delete_prefixed_keys(rt.redis, prefix)
        configure(Settings())
    counts = [
        float(line.rpartition(" ")[2])
        for line in body.splitlines()
        if line.startswith("ctxcore_stage_seconds_count{")
    ]
    assert sum(counts) >= 1, body
    # The node's directory: $PROMETHEUS_MULTIPROC_DIR/<node>, written by the pool children only.
    files = sorted(p.name for p in (tmp_path / "metrics" / "all").glob("*.db"))
    assert files and all(name.startswith(("histogram_", "counter_")) for name in files), files
    assert not any(name.endswith(f"_{proc.pid}.db") for name in files), files


def test_a_pool_child_exiting_is_marked_dead(metrics_dir: str) -> None:
    """Celery's ``worker_process_shutdown`` in the child: its live-gauge files go (what
    ``multiprocess.mark_process_dead`` removes; counters and histograms stay summed)."""
    from celery.signals import worker_process_shutdown

    import workers.app  # noqa: F401  (connects the handler, as in a worker)

    live = Path(metrics_dir) / "gauge_livesum_4242.db"
    live.write_bytes(b"")
    kept = Path(metrics_dir) / "histogram_4242.db"
    kept.write_bytes(b"")
    worker_process_shutdown.send(sender=None, pid=4242, exitcode=0)
    assert not live.exists() and kept.exists()
