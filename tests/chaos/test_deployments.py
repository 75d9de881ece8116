"""Two deployments (two ``redis.key_prefix`` values) on one Redis database stay apart.

Real ``celery -A workers.app worker`` processes of deployments A and B and ``ctxcore flower``
of A share one Redis database: a ping through one deployment's app is answered only by its
workers; each deployment's drain tokens and stages run only on its own workers (their logs
name only their own task ids) and compact only its own conversation of the same id; A's
Flower lists only A's worker and A's tasks; every key in the database (ours, kombu's
queues/unacked/bindings, the results) carries one deployment's prefix. Then A's worker is
killed during a model call: B's worker (restore scan every 2 s, visibility timeout 3 s)
never restores A's unacknowledged stage; A's restarted worker does, and finishes the job.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from tests.chaos.helpers import agent_round, block_responder
from tests.chaos.processes import REPO, WorkerProcess, free_port, worker_env
from workers.runtime import Runtime

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(180)]

LIMITS = {"retry_delays": [0.1, 0.2], "lock_timeout": 5, "visibility_timeout": 3}
BUDGET = 3000
NAMES = ("a", "b")


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout}s")


def _ping(settings: Settings) -> set[str]:
    from workers.app import app, configure

    configure(settings)
    return {name for reply in app.control.ping(timeout=1.0) for name in reply}


def _flower_json(port: int, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


def _fill(settings: Settings, key: ConversationKey, seed: str) -> None:
    rt = Runtime(settings)
    rng = random.Random(seed)
    for r in range(4):
        rt.log.append(key, agent_round(rng, f"{seed}-{r}", steps=3))
    rt.state_store.set_budget(key, BUDGET)


def _compacted(settings: Settings, key: ConversationKey) -> bool:
    rt = Runtime(settings)
    return rt.scheduler.status(key) == "idle" and rt.coordinator.plan(key) is None


def _flower(port: int, redis_url: str, prefix: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CTXCORE_REDIS_URL": redis_url,
        "CTXCORE_REDIS__KEY_PREFIX": prefix,
        "FLOWER_UNAUTHENTICATED_API": "true",
        "CTXCORE_FLOWER__HOST": "127.0.0.1",
        "CTXCORE_FLOWER__PORT": str(port),
    }
    env.pop("CTXCORE_CONFIG_FILE", None)
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "flower"],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def test_two_deployments_on_one_redis_never_run_or_restore_each_others_tasks(
    private_redis: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    prefixes = {n: f"dep{n}{tag}" for n in NAMES}
    settings = {
        n: Settings.load(
            {
                "redis": {"url": private_redis, "key_prefix": prefixes[n]},
                "engine": {"keep_recent_messages": 4},
                "worker": LIMITS,
            }
        )
        for n in NAMES
    }
    with OpenAIServer(responder=block_responder, delay=0.1) as server:
        # A summarises with the local server (so it can be killed during a call), B offline.
        envs = {
            "a": worker_env(private_redis, prefixes["a"], model_url=server.base_url, **LIMITS),
            "b": worker_env(private_redis, prefixes["b"], **LIMITS),
        }
        workers = {
            n: WorkerProcess(envs[n], tmp_path / f"{n}.log", pool="threads", name=f"dep{n}") for n in NAMES
        }
        flower_port = free_port()
        flower = _flower(flower_port, private_redis, prefixes["a"], tmp_path / "flower.log")
        try:
            for worker in workers.values():
                worker.start()
            _check(settings, prefixes, workers, flower_port, server, redis.Redis.from_url(private_redis))
        finally:
            from workers.app import configure

            configure(Settings())
            flower.terminate()
            try:
                flower.wait(10)
            except subprocess.TimeoutExpired:
                flower.kill()
            for worker in workers.values():
                worker.stop()


def _check(
    settings: dict[str, Settings],
    prefixes: dict[str, str],
    workers: dict[str, WorkerProcess],
    flower_port: int,
    server: OpenAIServer,
    client: redis.Redis,
) -> None:
    from workers.app import configure, queue_names
    from workers.tasks import drain, request_compaction

    hostnames = {n: f"dep{n}1@127.0.0.1" for n in NAMES}
    for n in NAMES:
        _wait(lambda n=n: hostnames[n] in _ping(settings[n]), 30, f"worker {n} answering its ping")
    # Each app's ping is answered by its own workers only.
    for n in NAMES:
        assert _ping(settings[n]) == {hostnames[n]}
    _wait(lambda: _flower_json(flower_port, "/api/workers?refresh=1"), 30, "Flower answering")

    key = ConversationKey("tenant-d", "same-id")  # the same id in both deployments
    drains: dict[str, list[str]] = {}
    for n in NAMES:
        _fill(settings[n], key, n)
        configure(settings[n])
        assert request_compaction(key) == "queued"
        drains[n] = [drain.apply_async(queue=queue_names(settings[n]).jobs).id for _ in range(3)]
    for n in NAMES:
        _wait(lambda n=n: _compacted(settings[n], key), 60, f"deployment {n} compacting its conversation")
        state = Runtime(settings[n]).state_store.load(key)
        assert state is not None and all(b.first_id <= b.last_id for b in state.blocks)
        _wait(lambda n=n: all(i in workers[n].log_path.read_text() for i in drains[n]), 10, f"{n}'s log")
    # Each worker ran its own deployment's tokens and nothing of the other's.
    logs = {n: workers[n].log_path.read_text() for n in NAMES}
    for n, other in (("a", "b"), ("b", "a")):
        assert not [i for i in drains[other] if i in logs[n]], n
    # A's Flower sees A's worker and tasks only (stage tasks listed as tenant/conversation).
    flower_workers = _flower_json(flower_port, "/api/workers?refresh=1")
    assert set(flower_workers) == {hostnames["a"]}, flower_workers
    tasks = _flower_json(flower_port, "/api/tasks") or {}
    assert set(drains["a"]) <= set(tasks) and not set(drains["b"]) & set(tasks)
    assert any(
        t.get("name") == "ctxcore.stage.l0_to_l1" and t.get("args") == "tenant-d/same-id"
        for t in tasks.values()
    ), tasks

    # Every key of the database belongs to one deployment.
    keys = [k.decode() for k in client.scan_iter(count=1000)]
    owned = [k for k in keys if any(k.startswith((f"{p}:", f"{{{p}:")) for p in prefixes.values())]
    assert keys and sorted(owned) == sorted(keys), sorted(set(keys) - set(owned))
    for p in prefixes.values():
        assert client.exists(f"{p}:_kombu.binding.{p}.jobs"), p

    # A's worker dies during a model call; B never restores A's unacknowledged stage.
    crashed = ConversationKey("tenant-d", "crashed")
    _fill(settings["a"], crashed, "crash")
    server.delay = 4.0
    calls = server.request_count
    configure(settings["a"])
    assert request_compaction(crashed) == "queued"
    _wait(lambda: server.request_count > calls, 20, "A's model call")
    workers["a"].kill()
    server.delay = 0.1
    tasks = _flower_json(flower_port, "/api/tasks") or {}
    (stage_id,) = [i for i, t in tasks.items() if t.get("args") == "tenant-d/crashed"]
    assert client.hlen(f"{prefixes['a']}:unacked") == 1  # the killed worker's stage
    time.sleep(2 * 2 + 3)  # past the visibility timeout, and two of B's restore scans
    assert stage_id not in workers["b"].log_path.read_text()
    assert client.hlen(f"{prefixes['a']}:unacked") == 1
    workers["a"].start()
    _wait(lambda: _compacted(settings["a"], crashed), 60, "A's restarted worker finishing the job")
    assert workers["a"].log_path.read_text().count(f"[{stage_id}] received") >= 2  # redelivered to A
    assert stage_id not in workers["b"].log_path.read_text()
