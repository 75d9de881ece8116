"""The workers' Prometheus metrics (prometheus-client): stage durations and failure counters.

Celery's prefork pool runs stages in child processes, so a worker node uses
prometheus-client's multiprocess mode: every process writes its values to memory-mapped
files in the node's ``PROMETHEUS_MULTIPROC_DIR`` and the node serves their sum on
``worker.metrics_port`` (``start_node_metrics``, called by ``ctxcore worker`` before the pool
forks). Each child's files are marked dead when it exits (Celery's
``worker_process_shutdown``, in ``workers/app.py``).

Labels come from closed sets (stage kinds, stage outcomes, error kinds): no tenant, no
conversation. ``GET /v1/usage`` is billing data and stays in Redis (``workers/usage.py``).
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess, start_http_server, values

from ctxcore.config import Settings
from ctxcore.errors import ConfigError

__all__ = [
    "STAGE_BUCKETS",
    "StageMetrics",
    "disable_multiprocess",
    "enable_multiprocess",
    "mark_process_dead",
    "metrics_ports",
    "node_registry",
    "snapshot",
    "stage_metrics",
    "start_node_metrics",
]

log = logging.getLogger(__name__)

ENV = "PROMETHEUS_MULTIPROC_DIR"

# Stages take from milliseconds (a rule pass) to minutes (a summariser call near
# worker.hard_time_limit, 150 s by default).
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class StageMetrics:
    """The series recorded where stages run, in a registry of their own (read in-process by
    tests; a node serves every process's values through ``node_registry``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.stage_seconds = Histogram(
            "ctxcore_stage_seconds",
            "Wall time of pipeline stages (lock and run), by stage kind and outcome.",
            ["stage", "outcome"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.tokens_saved = Counter(
            "ctxcore_tokens_saved", "Tokens removed from conversation views by compaction.", registry=r
        )
        self.failures = Counter("ctxcore_failures", "Failed stages, by error kind.", ["kind"], registry=r)
        self.holds = Counter(
            "ctxcore_compaction_paused",
            "Jobs that ended holding their conversation (no job until it re-arms), by reason: "
            "no_progress and budget_exhausted pause it, newest_step leaves it idle.",
            ["reason"],
            registry=r,
        )
        self.summariser_tokens = Counter(
            "ctxcore_summariser_tokens",
            "Summariser tokens (input + output) settled after each call, by tenant.",
            ["tenant"],
            registry=r,
        )
        self.cas_conflicts = Counter(
            "ctxcore_cas_conflicts", "Compare-and-swap saves lost to another writer.", registry=r
        )
        self.circuit_open = Counter(
            "ctxcore_circuit_open", "Calls refused by an open circuit breaker.", registry=r
        )
        self.jobs_requeued = Counter(
            "ctxcore_jobs_requeued",
            "Running jobs queued again by the reconciler: no heartbeat and no pending stage.",
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        """This process's value of a sample (0 when never recorded)."""
        return self.registry.get_sample_value(name, labels) or 0.0


class _State:
    metrics: StageMetrics | None = None


_state = _State()


def stage_metrics() -> StageMetrics:
    """This process's series, built on first use: after ``enable_multiprocess``, so their
    values go to the node's files."""
    if _state.metrics is None:
        _state.metrics = StageMetrics()
    return _state.metrics


def enable_multiprocess(directory: str | None = None) -> str:
    """Make this process (and the children it forks) record into ``directory``.

    ``directory`` defaults to ``$PROMETHEUS_MULTIPROC_DIR``, else a new temporary directory
    removed at exit. Files left there by an earlier run are removed (their processes are
    gone; the sum would count them again). Returns the directory.
    """
    path = directory or os.environ.get(ENV)
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        for stale in Path(path).glob("*.db"):
            stale.unlink(missing_ok=True)
    else:
        path = _node_directory(None, "")
    os.environ[ENV] = path
    # prometheus-client chooses its value class once, at import; the choice must follow the
    # directory set now (series built from here on write to it; children inherit both).
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]  # untyped upstream
    _state.metrics = None
    return path


def disable_multiprocess() -> None:
    """Back to in-process values (tests that enabled multiprocess mode restore this)."""
    os.environ.pop(ENV, None)
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]  # untyped upstream
    _state.metrics = None


def node_registry(directory: str) -> CollectorRegistry:
    """A registry summing every process's files in ``directory``."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]  # untyped upstream
    return registry


def snapshot(directory: str) -> dict[str, float]:
    """Every sample summed over ``directory``'s processes, keyed ``name{label="value",...}``
    (labels sorted): what benches and chaos runs compare before and after."""
    out: dict[str, float] = {}
    for family in node_registry(directory).collect():
        for sample in family.samples:
            inner = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{inner}}}" if inner else sample.name] = sample.value
    return out


def mark_process_dead(pid: int) -> None:
    """A pool child exited: drop its live-gauge files (its counters and histograms stay in
    the node's sum, as Prometheus expects of counters)."""
    if os.environ.get(ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]  # untyped upstream


def metrics_ports(settings: Settings, node: str) -> list[int]:
    """The ports a node tries, in order: ``worker.metrics_port`` (a drain node: the next
    one), then every second port after it, ``worker.metrics_port_tries`` of them in all; a
    stages or ``all`` node never takes a drain node's port, nor a drain node theirs."""
    first = settings.worker.metrics_port + (1 if node == "drain" else 0)
    return [p for p in range(first, first + 2 * settings.worker.metrics_port_tries, 2) if p <= 65535]


def start_node_metrics(settings: Settings, node: str = "all") -> int | None:
    """Multiprocess mode and the node's metrics server on ``worker.metrics_host`` (127.0.0.1
    by default) at the first free port of ``metrics_ports``; returns it (None: port 0, off,
    or every port taken, logged at ERROR: the worker runs without metrics).

    ``$PROMETHEUS_MULTIPROC_DIR``, when set, holds one directory per node kind (``all``,
    ``stages``, ``drain``), so the two nodes of ``--node all`` keep their own files; a node
    that took another port than its first uses ``<kind>-<port>``, so a second worker on the
    host never removes the first one's files. ``ConfigError`` when the address cannot be
    served at all (not a local address, no permission).
    """
    if settings.worker.metrics_port == 0:
        return None
    host = settings.worker.metrics_host
    ports = metrics_ports(settings, node)
    base = os.environ.get(ENV)
    for port in ports:
        registry = CollectorRegistry()
        try:
            start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                continue
            raise ConfigError(
                f"worker.metrics_host {host} port {port}: cannot serve the worker's metrics: {exc}"
            ) from exc
        directory = _node_directory(base, node if port == ports[0] else f"{node}-{port}")
        # After the bind: a node refused for its port leaves another node's files alone.
        enable_multiprocess(directory)
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]  # untyped upstream
        if port != ports[0]:
            log.warning(
                "worker metrics: port %d is in use (another worker on this host?); this %s node "
                "serves on %s:%d instead",
                ports[0],
                node,
                host,
                port,
            )
        log.info("worker metrics on %s:%d/metrics (the processes' files in %s)", host, port, directory)
        return port
    log.error(
        "worker metrics: every port tried on %s is in use (%s): this %s node starts WITHOUT "
        "metrics; set worker.metrics_port to a free range or raise worker.metrics_port_tries "
        "(0 serves none)",
        host,
        ", ".join(map(str, ports)),
        node,
    )
    # Recorded into a private directory nobody serves: never another node's files.
    enable_multiprocess(_node_directory(None, node))
    return None


def _node_directory(base: str | None, name: str) -> str:
    """``<base>/<name>``, else a new temporary directory removed at exit."""
    if not base:
        directory = tempfile.mkdtemp(prefix="ctxcore-metrics-")
        atexit.register(shutil.rmtree, directory, True)
        return directory
    directory = str(Path(base) / name)
    Path(directory).mkdir(parents=True, exist_ok=True)
    return directory
