"""``ctxcore worker`` on RabbitMQ: a stages node and a drain node, supervised together.

RabbitMQ has no priority across queues (the Redis transport's ``queue_order_strategy``), so
stages get a consumer of their own: the stages node consumes ``<prefix>.stages`` with
``worker.concurrency`` processes and the drain node ``<prefix>.jobs`` with one. Each is a
``ctxcore worker --node ...`` child process with the same arguments, in a process group of
its own; SIGTERM or SIGINT to this process is passed to both, and when one exits the other is stopped and its exit code is
returned (a half-running worker would strand either the stages or the new jobs).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

__all__ = ["node_argv", "node_hostname", "run_nodes"]

log = logging.getLogger(__name__)

NODES = ("stages", "drain")
STOP_GRACE_SECONDS = 50.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def node_hostname(hostname: str | None, node: str) -> str:
    """``<node>-<name>@<host>`` for ``--hostname name@host`` (Celery's ``%h`` by default)."""
    name, _, host = (hostname or "celery@%h").partition("@")
    return f"{node}-{name}@{host or '%h'}"


def node_argv(args: argparse.Namespace, node: str) -> list[str]:
    """The command line of one node: this interpreter running ``ctxcore worker --node``."""
    argv = [sys.executable, "-m", "workers.cli", "worker", "--node", node, "--loglevel", args.loglevel]
    argv += ["--hostname", node_hostname(args.hostname, node)]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    if args.config:
        argv += ["--config", args.config]
    return argv


def _detach() -> None:
    """In the child before it runs: a process group of its own, so a terminal's Ctrl-C
    reaches it once (forwarded; a second SIGINT would be Celery's cold shutdown), and
    SIGTERM when this supervisor dies, so a killed supervisor leaves no node behind."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_nodes(args: argparse.Namespace) -> int:
    """Start both nodes, forward SIGTERM/SIGINT to them, return when either exits."""
    children = [subprocess.Popen(node_argv(args, node), preexec_fn=_detach) for node in NODES]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        ended = next(child for child in children if child.returncode is not None)
        for child in children:
            if child.poll() is None:
                log.warning(
                    "worker node %s exited (code %s); stopping the other", ended.pid, ended.returncode
                )
                child.terminate()
                try:
                    child.wait(STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        return int(ended.returncode or 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # Never leave a node behind (an exception above): stop what still runs.
        for child in children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
                child.wait()
