"""A scratch three-master Redis Cluster for the tests marked ``redis_cluster``.

``start_cluster`` runs three ``redis-server --cluster-enabled yes`` processes on free loopback
ports (bus ports chosen too, with ``--cluster-port``: Redis 7.0; the binary is the newest
``redis-server`` >= 7.0 found, whatever the PATH order: ``tests.redis_binaries``), config files in a temp dir,
joins them with ``redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`` and waits
for ``cluster_state:ok`` on every node. ``ScratchCluster.stop`` ends the servers by their own
process handles. ``CTXCORE_TEST_REDIS_CLUSTER=host:port,...`` names a running cluster to use
instead.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.redis_binaries import CLUSTER_VERSION, NoSuitableRedis, RedisBinary, pick_redis_server

__all__ = ["ClusterUnavailable", "ScratchCluster", "check_cluster", "start_cluster"]


class ClusterUnavailable(Exception):
    """No cluster can be started or reached here (the reason is the message)."""


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_cluster(nodes: list[str], timeout: float = 10.0) -> None:
    """Wait until every node reports ``cluster_state:ok`` (``ClusterUnavailable`` otherwise)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        states = []
        for node in nodes:
            host, port = node.rsplit(":", 1)
            client = redis.Redis(host=host, port=int(port), socket_connect_timeout=1, socket_timeout=2)
            try:
                states.append(client.cluster("info").get("cluster_state") == "ok")
            except redis.RedisError as exc:
                last = f"{node}: {exc}"
                states.append(False)
            finally:
                client.close()
        if all(states):
            return
        time.sleep(0.1)
    raise ClusterUnavailable(f"Redis Cluster {','.join(nodes)} not ok after {timeout:.0f}s ({last})")


@dataclass
class ScratchCluster:
    """Running cluster nodes (``host:port``) and the server processes this run started."""

    nodes: list[str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    # The redis-cli that joined the nodes (a version that can drive them), for tests that reshard.
    cli: str = "redis-cli"

    def kill(self, index: int) -> None:
        """SIGKILL one server (a crash: nothing flushed beyond what its AOF already holds)."""
        self.processes[index].kill()
        self.processes[index].wait(timeout=5)

    def restart(self, index: int) -> None:
        """Start a killed server again with its own config (its nodes.conf and AOF)."""
        self.processes[index] = subprocess.Popen(
            self.commands[index], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _wait_listening(ScratchCluster([self.nodes[index]], [self.processes[index]]), self.commands[index][0])

    def stop(self) -> None:
        """Stop the servers this run started (never any other)."""
        for proc in self.processes:
            proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def start_cluster(
    workdir: Path, masters: int = 3, durable: bool = False, node_timeout_ms: int | None = None
) -> ScratchCluster:
    """Start and join ``masters`` cluster-enabled servers under ``workdir`` (``durable``:
    ``appendonly yes`` with ``appendfsync always``, so an acknowledged write survives a kill;
    ``node_timeout_ms``: ``cluster-node-timeout``, after which the others mark a silent master
    failed and, without a replica to promote, answer CLUSTERDOWN; Redis's default is 15 s)."""
    binary = cluster_binary()
    server, cli = binary.server, binary.cli
    assert cli is not None  # cluster_binary asks for one
    ports = _free_ports(2 * masters)
    cluster = ScratchCluster([f"127.0.0.1:{p}" for p in ports[:masters]], cli=cli)
    try:
        for port, bus in zip(ports[:masters], ports[masters:], strict=True):
            node_dir = workdir / str(port)
            node_dir.mkdir(parents=True)
            args = [server, "--port", str(port), "--cluster-port", str(bus), "--cluster-enabled", "yes"]
            args += ["--cluster-config-file", str(node_dir / "nodes.conf"), "--dir", str(node_dir)]
            args += ["--bind", "127.0.0.1", "--save", ""]
            args += ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
            if node_timeout_ms is not None:
                args += ["--cluster-node-timeout", str(node_timeout_ms)]
            cluster.commands.append(args)
            proc = subprocess.Popen(
                args,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            cluster.processes.append(proc)
        _wait_listening(cluster, binary.describe())
        created = subprocess.run(
            [cli, "--cluster", "create", *cluster.nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise ClusterUnavailable(
                f"{cli} --cluster create failed (servers: {binary.describe()}): {created.stdout[-500:]}"
            )
        check_cluster(cluster.nodes, timeout=30)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def cluster_binary() -> RedisBinary:
    """The ``redis-server`` (>= 7.0) and ``redis-cli`` a scratch cluster runs on;
    ``ClusterUnavailable`` saying which binaries and versions were found when none fits."""
    try:
        return pick_redis_server(CLUSTER_VERSION, need_cli=True, why="--cluster-port for the bus ports")
    except NoSuitableRedis as exc:
        raise ClusterUnavailable(str(exc)) from exc


def _wait_listening(cluster: ScratchCluster, server: str) -> None:
    deadline = time.monotonic() + 10
    for node, proc in zip(cluster.nodes, cluster.processes, strict=True):
        host, port = node.rsplit(":", 1)
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise ClusterUnavailable(f"{server} lacks cluster support or failed to start: {err[-300:]}")
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"{server} on {node} did not listen within 10s")
            time.sleep(0.05)
