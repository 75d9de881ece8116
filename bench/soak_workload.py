"""The soak's workload, shared with ``bench/capacity.py``: its settings, its compaction queue,
its conversations, and one client process (append a user/assistant pair, ask for a window,
until the deadline)."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from celery import Celery  # noqa: E402

from ctxcore.config import Settings  # noqa: E402
from ctxcore.messages import AssistantMessage, UserMessage  # noqa: E402
from ctxcore.state import ConversationKey  # noqa: E402
from ctxcore.tokens import TiktokenCounter  # noqa: E402
from ctxcore.window import check_window  # noqa: E402
from workers.app import celery_config, queue_names  # noqa: E402
from workers.failures import FailureRecord  # noqa: E402
from workers.runtime import Runtime, build_service  # noqa: E402
from workers.scheduler import Status  # noqa: E402

BUDGET = 2500
WORKER_LIMITS = {
    "soft_time_limit": 20.0,
    "hard_time_limit": 25.0,
    "visibility_timeout": 30,
    "lock_timeout": 10,
    "retry_delays": [0.2, 0.5, 1.0],
}


def soak_settings(url: str, prefix: str) -> Settings:
    return Settings.load(
        {
            "redis": {"url": url, "key_prefix": prefix},
            "engine": {"keep_recent_messages": 4},
            "worker": WORKER_LIMITS,
        }
    )


class SoakQueue:
    """The fast path's compaction queue: the fair scheduler plus a Celery drain token."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.sender = Celery("soak-client")
        self.sender.conf.update(celery_config(rt.settings))
        self.requests = 0

    def request(self, key: ConversationKey) -> Status:
        self.requests += 1
        if self.rt.scheduler.request(key):
            self.sender.send_task(
                "ctxcore.drain", queue=queue_names(self.rt.settings).jobs, ignore_result=True
            )
            return "queued"
        return self.rt.scheduler.status(key)

    def status(self, key: ConversationKey) -> Status:
        return self.rt.scheduler.status(key)

    def status_from(self, record: FailureRecord) -> Status:
        return "failing" if record.failing else record.scheduler_status


def soak_keys(tenants: int, conversations: int) -> list[ConversationKey]:
    return [
        ConversationKey(f"tenant-{t}", f"conv-{c:04d}") for t in range(tenants) for c in range(conversations)
    ]


def run_client(
    index: int, url: str, prefix: str, keys: list[ConversationKey], until: float, out: str, rate: float = 0.0
) -> None:
    """One client process: append a user/assistant pair, then ask for a window, until ``until``."""
    rt = Runtime(soak_settings(url, prefix))
    queue = SoakQueue(rt)
    service = build_service(rt, queue)
    counter = TiktokenCounter()
    rng = random.Random(index)
    acked: list[tuple[str, str, list[str], list[str]]] = []
    latencies: list[float] = []
    acked_at: list[float] = []
    errors: list[str] = []
    violations = 0
    n = 0
    next_turn = time.time()
    while time.time() < until:
        if rate > 0:
            # Paced: turn n starts at start + n / rate (a late turn starts at once).
            next_turn += 1.0 / rate
            pause = next_turn - 1.0 / rate - time.time()
            if pause > 0:
                time.sleep(pause)
            if time.time() >= until:
                break
        key = rng.choice(keys)
        n += 1
        tag = f"c{index}-{n}"
        words = " ".join(
            rng.choice(("deploy", "cache", "error", "retry", "index", "token")) for _ in range(60)
        )
        batch = [
            UserMessage(content=f"{tag} please look at {words}", message_id=f"{tag}-u"),
            AssistantMessage(content=f"{tag} result: {words} {words}", message_id=f"{tag}-a"),
        ]
        try:
            ids = service.append(key, batch)
            acked.append((key.tenant_id, key.conversation_id, [m.message_id or "" for m in batch], ids))
            acked_at.append(time.time())
            started = time.perf_counter()
            window = service.get_window(key, BUDGET)
            latencies.append(time.perf_counter() - started)
            if counter.count_messages(window.messages) > BUDGET or check_window(window.messages):
                violations += 1
        except Exception as exc:  # counted and reported: a soak must not stop at the first error
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    Path(out).write_text(
        json.dumps(
            {
                "acked": acked,
                "latencies": latencies,
                "errors": errors,
                "violations": violations,
                "requests": queue.requests,
                "acked_at": acked_at,
            }
        )
    )
