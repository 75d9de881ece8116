"""A worker cut off from Redis while it holds a conversation's lock (test and bench scenario).

Worker A runs in a network namespace of its own, joined to this host by a veth pair with a
/30 of its own from 198.18.0.0/15 (the benchmarking range; the pair carries nothing else).
The scenario's ``redis-server`` (store and broker) and its model endpoint listen on the
host end; the machine's Redis binds 127.0.0.1, which the namespace cannot reach. Worker B
runs on the host. A starts a stage whose model reply is held; the link is then cut (netem
loss 100% on both ends, or a zero-length FIFO where the kernel has no netem). A's lock stops being extended and expires; the stage's message
comes back from A's unacknowledged set after the visibility timeout and B runs it, and the
rest of the job. The link is restored, A's held reply is sent, and A saves late: its
compare-and-swap must lose.

Needs root (``ip netns``, ``ip link``, ``tc``): ``namespaces_unavailable()`` says why not.
Everything is created under names of its own and removed by those names.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from ctxcore.config import Settings
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.testing import OpenAIServer
from tests.chaos.helpers import agent_round, block_responder, state_problems
from tests.chaos.processes import answers, deployment_queues, free_port, worker_command, worker_env
from tests.redis_binaries import NoSuitableRedis, pick_redis_server
from workers.app import celery_config, queue_names
from workers.prom_worker import node_registry
from workers.runtime import Runtime

# Lock and visibility timeouts short enough for a quick test; stage limits far above the
# held reply, so A's stage is never killed: it must come back and lose its save.
LIMITS = {
    "lock_timeout": 3,
    "visibility_timeout": 3,
    "soft_time_limit": 100.0,
    "hard_time_limit": 110.0,
    "retry_delays": [0.2, 0.4, 0.8],
    "circuit_failure_threshold": 1000,
}
BUDGET = 1500
WAIT = 60.0
CONFLICTS = "ctxcore_cas_conflicts_total"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


def namespaces_unavailable() -> str | None:
    """Why this machine cannot run the scenario, or None when it can."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        pick_redis_server()
    except NoSuitableRedis as exc:
        return f"no redis-server: {exc}"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"ctxprobe{uuid.uuid4().hex[:6]}"
    made = _run("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe)
    return None


@dataclass
class Link:
    """A namespace and the veth pair joining it to the host, with a /30 of its own."""

    name: str = field(default_factory=lambda: f"ctxp{uuid.uuid4().hex[:6]}")
    subnet: int = field(default_factory=lambda: random.randrange(0, 256 * 64))

    @property
    def host_if(self) -> str:
        return f"{self.name}h"

    @property
    def ns_if(self) -> str:
        return f"{self.name}n"

    @property
    def host_ip(self) -> str:
        third, quarter = divmod(self.subnet, 64)
        return f"198.18.{third}.{quarter * 4 + 1}"

    @property
    def ns_ip(self) -> str:
        third, quarter = divmod(self.subnet, 64)
        return f"198.18.{third}.{quarter * 4 + 2}"

    def _must(self, *args: str) -> None:
        done = _run(*args)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")

    def create(self) -> None:
        self._must("ip", "netns", "add", self.name)
        self._must("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self._must("ip", "link", "set", self.ns_if, "netns", self.name)
        self._must("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        self._must("ip", "link", "set", self.host_if, "up")
        inside = ("ip", "netns", "exec", self.name)
        self._must(*inside, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self._must(*inside, "ip", "link", "set", self.ns_if, "up")
        self._must(*inside, "ip", "link", "set", "lo", "up")

    def cut(self) -> None:
        """Drop every packet on the pair, both ways (the interfaces stay up: no error is
        reported to either side, packets just vanish, as in a real partition)."""
        for inside, dev in (((), self.host_if), (("ip", "netns", "exec", self.name), self.ns_if)):
            netem = _run(*inside, "tc", "qdisc", "add", "dev", dev, "root", "netem", "loss", "100%")
            if netem.returncode != 0:
                # Kernels without sch_netem (this VM's): a FIFO of length 0 drops every packet.
                self._must(*inside, "tc", "qdisc", "add", "dev", dev, "root", "pfifo", "limit", "0")

    def restore(self) -> None:
        self._must("tc", "qdisc", "del", "dev", self.host_if, "root")
        self._must("ip", "netns", "exec", self.name, "tc", "qdisc", "del", "dev", self.ns_if, "root")

    def remove(self) -> None:
        _run("ip", "link", "del", self.host_if)  # takes its peer with it
        _run("ip", "netns", "del", self.name)


class HeldFirstReply:
    """The model endpoint's responder: the first request (A's) waits until released."""

    def __init__(self) -> None:
        self.first = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._seen = 0

    def __call__(self, request: dict[str, Any]) -> str:
        with self._lock:
            self._seen += 1
            mine = self._seen == 1
        if mine:
            self.first.set()
            self.release.wait(WAIT * 2)
        return block_responder(request)


@dataclass
class Outcome:
    """What one run of the scenario left."""

    versions_before_restore: int
    final_version: int
    blocks_before_restore: list[str]
    final_blocks: list[str]
    problems: list[str]
    cas_conflicts: float
    warning: str | None
    worker_a_log: str
    # Worker A saved a stage (the short cut: it completes once the link is back).
    a_saved: bool = False

    @property
    def lost_blocks(self) -> int:
        """Blocks B saved that are gone after A came back."""
        return len(set(self.blocks_before_restore) - set(self.final_blocks))

    @property
    def doubled_blocks(self) -> int:
        """Blocks covering a log id another block covers too."""
        return sum(1 for p in self.problems if "overlap" in p or "duplicate" in p)


def _start_worker(
    name: str, env: dict[str, str], queues: str, log: Path, netns: str | None = None
) -> subprocess.Popen[bytes]:
    command = worker_command(queues, f"{name}@%h", pool="solo")
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    with log.open("ab") as out:
        return subprocess.Popen(
            command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextmanager
def _redis_on(link: Link, directory: Path) -> Iterator[int]:
    """A ``redis-server`` of the scenario's own on 127.0.0.1 and the link's host end: its port."""
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            pick_redis_server().server,  # the newest found, whatever the PATH order
            "--bind",
            "127.0.0.1",
            link.host_ip,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--protected-mode",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _until(lambda: answers(f"redis://127.0.0.1:{port}/0"), "the scenario's redis-server", 10)
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=5)


def run_partition(workdir: Path, *, cut_seconds: float | None = None) -> Outcome:
    """One run: build the link, cut it under A's held stage, let B finish, restore, check.

    ``cut_seconds`` shorter than the lock timeout: the link comes back before A's lock
    expires, A's held reply is released and A saves; B runs meanwhile, so a redelivered copy
    of A's task finds the lock held or its plan stale."""
    link = Link()
    workdir.mkdir(parents=True, exist_ok=True)
    a_log, b_log = workdir / "worker-a.log", workdir / "worker-b.log"
    worker_a = worker_b = None
    link.create()
    responder = HeldFirstReply()
    try:
        with (
            _redis_on(link, workdir / "redis") as port,
            OpenAIServer(host=link.host_ip, responder=responder) as model,
        ):
            url = f"redis://{link.host_ip}:{port}/0"
            prefix = f"part{uuid.uuid4().hex[:6]}"
            settings = Settings.load({"redis": {"url": url, "key_prefix": prefix}, "worker": LIMITS})
            env = worker_env(url, prefix, model_url=model.base_url, **LIMITS)
            env["CTXCORE_MODEL__TIMEOUT"] = str(WAIT * 2)  # A's held call must outlive the cut
            queues = deployment_queues(prefix)
            rt = Runtime(settings)
            key = ConversationKey("tenant-p", "conv-partition")
            rng = random.Random(5)
            for r in range(3):
                rt.log.append(key, agent_round(rng, f"p-r{r}", steps=3))
            rt.state_store.set_budget(key, BUDGET)
            # Both workers record into one multiprocess directory (prometheus-client picks
            # the mode from the variable at import); a fresh one: no conflict counted before.
            metrics_dir = workdir / "metrics"
            metrics_dir.mkdir(exist_ok=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)

            worker_a = _start_worker("partition-a", env, queues, a_log, netns=link.name)
            sender = Celery("partition-client")
            sender.conf.update(celery_config(settings))
            if rt.scheduler.request(key):
                sender.send_task("ctxcore.drain", queue=queue_names(settings).jobs, ignore_result=True)
            if not responder.first.wait(WAIT):
                raise TimeoutError(f"worker A never called the model; its log:\n{a_log.read_text()[-3000:]}")
            link.cut()
            worker_b = _start_worker("partition-b", env, queues, b_log)

            def b_done() -> bool:
                state = rt.state_store.load(key)
                return state is not None and state.version > 0 and rt.scheduler.status(key) == "idle"

            if cut_seconds is None:
                _until(b_done, "worker B to complete the conversation")
                before = rt.state_store.load(key)
                if before is None:
                    raise RuntimeError("no state after B completed")
                link.restore()
                responder.release.set()

                def a_warned() -> bool:
                    return "lost its compare-and-swap" in a_log.read_text(errors="replace")

                _until(a_warned, "worker A's late save to lose its compare-and-swap")
                time.sleep(1.0)  # let A finish re-planning before the state is read
            else:
                time.sleep(cut_seconds)
                before = rt.state_store.load(key) or CompressionState()
                link.restore()
                responder.release.set()
                _until(b_done, "the conversation to complete after the short cut")
                # A redelivered copy of A's task would run by now (visibility timeout).
                time.sleep(float(LIMITS["visibility_timeout"]) + 2.0)
            after = rt.state_store.load(key)
            if after is None:
                raise RuntimeError("no state after A came back")
            log_ids = [m.context_message_id or "" for m in rt.log.read_after(key, None)]
            warning = next(
                (
                    line
                    for line in a_log.read_text(errors="replace").splitlines()
                    if "lost its compare-and-swap" in line
                ),
                None,
            )
            return Outcome(
                versions_before_restore=before.version,
                final_version=after.version,
                blocks_before_restore=[b.block_id for b in before.blocks],
                final_blocks=[b.block_id for b in after.blocks],
                problems=state_problems(after, log_ids),
                cas_conflicts=node_registry(str(metrics_dir)).get_sample_value(CONFLICTS) or 0.0,
                warning=warning,
                worker_a_log=a_log.read_text(errors="replace")[-4000:],
                a_saved="'outcome': 'compressed'" in a_log.read_text(errors="replace"),
            )
    finally:
        responder.release.set()
        _stop(worker_a)
        _stop(worker_b)
        link.remove()
