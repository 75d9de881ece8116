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
from tests.chaos.processes import REPO, free_port
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


def held_ports(*ports: int) -> list[socket.socket]:
    """Sockets listening on ``ports`` (on every interface: taken for 127.0.0.1 too)."""
    held = []
    for port in ports:
        sock = socket.socket()
        sock.bind(("0.0.0.0", port))
        sock.listen()
        held.append(sock)
    return held


def free_run(n: int) -> int:
    """A port p with p .. p + n - 1 all free now."""
    for _ in range(50):
        base = free_port()
        try:
            for sock in held_ports(*range(base, base + n)):
                sock.close()
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


def listening_address(port: int) -> str:
    """The local address a socket listening on ``port`` is bound to (/proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":
            return socket.inet_ntoa(bytes.fromhex(address)[::-1])
    raise AssertionError(f"nothing listens on {port}")


def test_a_taken_metrics_port_moves_the_node_to_the_next_free_one_never_the_drains(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = free_run(6)
    settings = Settings.load({"worker": {"metrics_port": base}})
    held = held_ports(base)  # another worker's; base + 1 (a drain node's) stays free
    try:
        with caplog.at_level("INFO", logger="workers.prom_worker"):
            # Each call stands for a node process of its own (one call per process).
            assert start_node_metrics(settings) == base + 2
            disable_multiprocess()
            assert start_node_metrics(settings, "drain") == base + 1
            disable_multiprocess()
            assert start_node_metrics(settings, "drain") == base + 3
    finally:
        disable_multiprocess()
        for sock in held:
            sock.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings[0] == (
        f"worker metrics: port {base} is in use (another worker on this host?); this all node "
        f"serves on 127.0.0.1:{base + 2} instead"
    )
    assert warnings[1].startswith(f"worker metrics: port {base + 1} is in use")
    for port in (base + 1, base + 2, base + 3):
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).status == 200


def test_every_metrics_port_taken_starts_without_metrics_logged_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = free_run(4)
    settings = Settings.load({"worker": {"metrics_port": base, "metrics_port_tries": 2}})
    held = held_ports(base, base + 2)
    try:
        with caplog.at_level("INFO", logger="workers.prom_worker"):
            assert start_node_metrics(settings) is None
    finally:
        disable_multiprocess()
        for sock in held:
            sock.close()
    (error,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert error.getMessage().startswith(
        f"worker metrics: every port tried on 127.0.0.1 is in use ({base}, {base + 2}): this all "
        "node starts WITHOUT metrics"
    )


def test_worker_metrics_listen_on_127_0_0_1_unless_widened() -> None:
    base = free_run(2)
    try:
        assert start_node_metrics(Settings.load({"worker": {"metrics_port": base}})) == base
        wide = Settings.load({"worker": {"metrics_port": base + 1, "metrics_host": "0.0.0.0"}})
        assert start_node_metrics(wide, "all") == base + 1
    finally:
        disable_multiprocess()
    assert listening_address(base) == "127.0.0.1"
    assert listening_address(base + 1) == "0.0.0.0"


def test_an_address_that_cannot_be_served_fails_the_start_naming_it() -> None:
    settings = Settings.load({"worker": {"metrics_port": free_port(), "metrics_host": "192.0.2.1"}})
    with pytest.raises(ConfigError, match=r"worker.metrics_host 192.0.2.1 port \d+: cannot serve"):
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


@pytest.mark.redis
@pytest.mark.slow
def test_two_ctxcore_workers_with_the_same_settings_both_start_and_serve_metrics(
    redis_url: str, tmp_path: Path
) -> None:
    """Scaling out on one host without a settings file per worker: the second worker's
    metrics take the next free port of its kind, both on 127.0.0.1."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    port = free_run(3)
    env = {
        **os.environ,
        "CTXCORE_REDIS_URL": redis_url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "CTXCORE_WORKER__CONCURRENCY": "1",
        "CTXCORE_WORKER__METRICS_PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    env.pop("CTXCORE_CONFIG_FILE", None)
    procs, logs = [], []
    try:
        for n in range(2):
            logs.append(tmp_path / f"worker{n}.log")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "workers.cli", "worker", "--loglevel", "INFO"],
                    env=env,
                    cwd=REPO,
                    stdout=logs[-1].open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            # One after the other, as an operator starts them: the first takes the port.
            deadline = time.monotonic() + 60
            while "worker metrics on 127.0.0.1:" not in logs[-1].read_text():
                assert procs[-1].poll() is None and time.monotonic() < deadline, logs[-1].read_text()[-3000:]
                time.sleep(0.2)
        time.sleep(1)
        assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs]
        for p in (port, port + 2):
            assert urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).status == 200
            assert listening_address(p) == "127.0.0.1"
        second = logs[1].read_text()
        assert (
            f"port {port} is in use (another worker on this host?); this all node serves on 127.0.0.1:{port + 2}"
            in second
        )
        assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == ["all", f"all-{port + 2}"]
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        client = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(client, prefix)
        client.close()
