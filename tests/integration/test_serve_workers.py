"""``ctxcore serve --workers N``: N API processes on one port. Windows and appends
interleaved over fresh connections land on both processes, and no window depends on which
process served the request before it; ``/metrics`` sums every process's series."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from ctxcore.config import Settings, hash_token
from ctxcore.errors import ConfigError
from tests.chaos.processes import REPO, free_port
from workers.keyspace import delete_prefixed_keys

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TOKEN = "serve-workers-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROUNDS = 30


@pytest.fixture
def two_processes(redis_url: str, tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    prefix = f"ctxcore-test-{uuid.uuid4().hex}"
    port = free_port()
    metrics = tmp_path / "metrics"
    env = {
        **os.environ,
        "CTXCORE_REDIS_URL": redis_url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "CTXCORE_HTTP__TOKENS": f'{{"{hash_token(TOKEN)}": "acme"}}',
        "CTXCORE_HTTP__REQUESTS_PER_SECOND": "1000",
        "CTXCORE_HTTP__BURST": "1000",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
    }
    env.pop("CTXCORE_CONFIG_FILE", None)
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "serve", "--workers", "2", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        yield base, metrics / "api", proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        client = redis.Redis.from_url(redis_url)
        delete_prefixed_keys(client, prefix)
        client.close()


def _served_by(metrics_dir: Path) -> set[int]:
    """The API processes that wrote metrics (the pid in each file's name)."""
    return {int(p.stem.rsplit("_", 1)[1]) for p in metrics_dir.glob("counter_*.db")}


def _window(base: str) -> list[dict[str, str]]:
    with httpx.Client(base_url=base, headers=AUTH) as one:
        window = one.post("/v1/conversations/c1/window", json={"budget_tokens": 100_000})
    assert window.status_code == 200, window.text
    return [{"role": m["role"], "content": m["content"]} for m in window.json()["messages"]]


def test_two_processes_serve_interleaved_windows_and_appends_alike(
    two_processes: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    base, metrics_dir, proc = two_processes
    sent: list[dict[str, str]] = []
    # A connection per request: the kernel hands each to either process.
    with httpx.Client(
        base_url=base, headers=AUTH, limits=httpx.Limits(max_keepalive_connections=0)
    ) as client:
        for n in range(ROUNDS):
            batch = [
                {"role": "user", "content": f"question {n}"},
                {"role": "assistant", "content": f"answer {n}"},
            ]
            appended = client.post("/v1/conversations/c1/messages", json={"messages": batch})
            assert appended.status_code == 201, appended.text
            sent += batch
            window = client.post("/v1/conversations/c1/window", json={"budget_tokens": 100_000})
            assert window.status_code == 200, window.text
            got = [{"role": m["role"], "content": m["content"]} for m in window.json()["messages"]]
            assert got == sent  # every append so far, whichever process took it
        # One request at a time, the kernel may hand every connection to the same process:
        # windows in parallel until both have served one (each writes its own files).
        deadline = time.monotonic() + 30
        with ThreadPoolExecutor(8) as pool:
            while len(_served_by(metrics_dir)) < 2 and time.monotonic() < deadline:
                for window in pool.map(lambda _: _window(base), range(16)):
                    assert window == sent
        body = client.get("/metrics").text
    # Both processes served, and /metrics sums them.
    children = _served_by(metrics_dir)
    assert len(children) == 2 and proc.pid not in children, children
    samples = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in body.splitlines()
        if line.startswith(("ctxcore_appends_total", "ctxcore_windows_total"))
    }
    assert samples['ctxcore_appends_total{status="201"}'] == ROUNDS
    assert samples['ctxcore_windows_total{status="200"}'] == ROUNDS


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_zero_or_negative_workers_are_refused(workers: str, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.cli import main

    with pytest.raises(SystemExit) as done:
        main(["serve", "--workers", workers])
    assert done.value.code == 2 and "argument --workers: must be greater than 0" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"http\.workers"):
        Settings.load({"http": {"workers": int(workers)}})
