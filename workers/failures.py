"""How a conversation's compaction last failed, and the backoff that follows.

One Redis hash per conversation, ``<prefix>:{<tenant>:<conversation>}:compaction`` (under
the conversation's hash tag, deleted with it), written by workers without CAS like the
budget (one job per conversation runs at a time):

- ``last_error``: JSON ``{"kind", "message", "stage", "at"}`` of the last stage that failed
  for good; ``last_success_at``: ISO time of the last job that ended without one, without a
  hold, and saved a state version (a job with nothing to do is no success: it saved nothing);
- ``run_failed``: set while the running job has had such a failure; ``run_saved``: set
  once a stage of the running job saved a new state version (the job made progress);
  ``run_held``: set when a stage of the running job recorded a hold (its tenant's
  summariser cap), which the job's end keeps;
- ``hold``: JSON of the ``ctxcore.status.Hold`` that keeps windows from starting jobs
  (``no_progress``, ``newest_step``, ``budget_exhausted``; see ``workers.holds``), written
  when a job ends (or a stage stops at the tenant's summariser cap) and removed by a job
  that made progress or ended within target;
- ``sched`` / ``sched_seq``: the scheduler's status of the conversation, mirrored here by
  ``FairScheduler`` on every change (ordered by its ring's counter), so the fast path reads
  it with this record in one call to the conversation's slot;
- ``failures`` / ``retry_at``: consecutive failed jobs and the time (epoch seconds) before
  which windows and ``POST .../compact`` do not queue the conversation again; the pause is
  ``worker.failure_backoff_seconds`` doubled per consecutive failed job, capped at
  ``worker.failure_backoff_max_seconds``, and reset by a success.

A job that ends without a failed stage clears ``last_error``. With a retention every write
gives the hash the conversation's expiry (``ctxcore.state.redis.retention``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import redis
from kombu.exceptions import OperationalError

from ctxcore.errors import ModelError, StoreError, StoreUnavailable
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.retention import RedisRetention
from ctxcore.state.retention import Retention
from ctxcore.status import CompactionDetail, Hold, LastError
from workers.scheduler import Status, parse_status

__all__ = [
    "LOST_TASK",
    "FailureRecord",
    "FailureStore",
    "StageFailedError",
    "classify_failure",
    "model_error_message",
    "parse_record",
    "public_endpoint",
]

_MAX_MESSAGE_CHARS = 1000
# The kind of a running job the reconciler found without heartbeat nor pending stage
# (``workers.lost_jobs``): shown until the job runs again.
LOST_TASK = "lost_task"


class StageFailedError(ModelError):
    """A stage's classified model failure, raised as its Celery task's exception.

    The args are exactly ``(kind, message)`` so the result backend can rebuild it from JSON
    (``exc_message``) and Flower shows the kind and the cause.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(kind, message)
        self.args = (kind, message)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


def model_error_message(exc: BaseException) -> str:
    """A model error's text without the ``kind: `` its ``str()`` starts with; any other
    exception's class and text."""
    if not isinstance(exc, ModelError):
        return f"{type(exc).__name__}: {exc}"
    return exc.message or str(exc).removeprefix(f"{exc.kind}: ")


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """``(kind, message)`` of a failure: a model error keeps its kind and text, a store or
    broker outage is ``store_unavailable``, anything else is ``internal`` (class and text)."""
    if isinstance(exc, StageFailedError):
        return exc.kind, exc.message
    if isinstance(exc, ModelError):
        return exc.kind, model_error_message(exc)
    if isinstance(exc, StoreUnavailable | OperationalError):
        return "store_unavailable", f"{type(exc).__name__}: {exc}"
    return "internal", f"{type(exc).__name__}: {exc}"


def public_endpoint(url: str | None) -> str:
    """A model endpoint safe to log: scheme, host, port and path, never credentials or a query."""
    if url is None:
        return "offline ExtractiveModel"
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(frozen=True)
class FailureRecord:
    """What the API shows (``detail``) and whether requests are held back until ``retry_at``."""

    detail: CompactionDetail
    retry_at: float = 0.0
    sched: str | None = None
    run_failed: bool = False
    run_saved: bool = False
    run_held: bool = False

    @property
    def hold(self) -> Hold | None:
        """What keeps windows from starting jobs (None: nothing)."""
        return self.detail.hold

    @property
    def scheduler_status(self) -> Status:
        """The scheduler's mirrored status: ``idle``, ``queued`` or ``running``."""
        return parse_status(self.sched)

    @property
    def failing(self) -> bool:
        """True while the last job ended with a failed stage."""
        return self.detail.last_error is not None

    def backing_off(self, now: float | None = None) -> bool:
        """True while the conversation must not be queued again."""
        return self.failing and self.retry_at > (time.time() if now is None else now)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_record(fields: dict[Any, Any]) -> FailureRecord:
    """The record of a compaction hash's fields (as HGETALL returns them)."""
    data = {_text(k): _text(v) for k, v in fields.items()}
    error = None
    if "last_error" in data:
        raw = json.loads(data["last_error"])
        error = LastError(raw["kind"], raw["message"], raw.get("stage"), datetime.fromisoformat(raw["at"]))
    success = datetime.fromisoformat(data["last_success_at"]) if "last_success_at" in data else None
    hold = Hold.from_dict(json.loads(data["hold"])) if "hold" in data else None
    return FailureRecord(
        CompactionDetail(error, success, hold),
        float(data.get("retry_at", 0) or 0),
        data.get("sched"),
        run_failed="run_failed" in data,
        run_saved="run_saved" in data,
        run_held="run_held" in data,
    )


class FailureStore:
    """The per-conversation failure hash (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        *,
        backoff_seconds: float = 30.0,
        backoff_max_seconds: float = 600.0,
        retention: Retention | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.backoff_seconds = backoff_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self._retention = RedisRetention(client, prefix, retention)

    def key(self, key: ConversationKey) -> str:
        """The conversation's hash."""
        return f"{self.prefix}:{key.hash_tag}:compaction"

    def _write(
        self,
        key: ConversationKey,
        put: dict[str, str] | None = None,
        remove: tuple[str, ...] = (),
        incr: str | None = None,
    ) -> int:
        """Removes, puts, then an increment of the hash (its result, else 0). With a
        retention one script that also gives the hash the conversation's expiry."""
        name = self.key(key)
        if self._retention.ttl_ms(key):
            return self._retention.hash_write(
                key, name, put=put, remove=remove, incr=(incr, 1) if incr else None
            )
        if incr is not None:
            return int(self.client.hincrby(name, incr, 1))
        pipe = self.client.pipeline()
        if remove:
            pipe.hdel(name, *remove)
        if put:
            mapping: dict[Any, Any] = dict(put)
            pipe.hset(name, mapping=mapping)
        pipe.execute()
        return 0

    def _call(self, what: str, key: ConversationKey, fn: Any) -> Any:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"Redis unavailable during {what} of {key}: {exc}") from exc
        except redis.RedisError as exc:
            raise StoreError(f"Redis error during {what} of {key}: {exc}") from exc

    def get(self, key: ConversationKey) -> FailureRecord:
        """The record (empty when nothing ever failed or succeeded)."""
        return parse_record(
            self._call("reading the failure record", key, lambda: self.client.hgetall(self.key(key)))
        )

    def detail(self, key: ConversationKey) -> CompactionDetail:
        """What ``GET .../state``, windows and ``ctxcore inspect`` show."""
        return self.get(key).detail

    def job_started(self, key: ConversationKey) -> None:
        """A job of ``key`` starts: no failure in it yet, nothing saved yet, and a ``lost_task``
        error ends here (the lost job runs again; any other error stays until a job succeeds)."""
        error = self.get(key).detail.last_error
        lost = ("last_error",) if error is not None and error.kind == LOST_TASK else ()
        self._call(
            "starting a job", key, lambda: self.client.hdel(self.key(key), "run_failed", "run_saved", *lost)
        )

    def version_saved(self, key: ConversationKey) -> None:
        """A stage of the running job saved a new state version: the job made progress."""
        self._call("recording a saved version", key, lambda: self._write(key, put={"run_saved": "1"}))

    def put_hold(self, key: ConversationKey, hold: Hold) -> None:
        """Record ``hold`` for the running job (replacing any earlier one; ``run_held`` keeps
        it when the job ends): windows start no job until it re-arms."""
        value = json.dumps(hold.as_dict(), ensure_ascii=False)
        self._call("recording a hold", key, lambda: self._write(key, put={"hold": value, "run_held": "1"}))

    def record_lost(self, key: ConversationKey, message: str) -> LastError:
        """Record that the running job of ``key`` lost its stage and was queued again: the
        conversation shows ``failing`` with ``lost_task`` until the job runs again (no
        backoff, and not a failure of the job that runs next)."""
        error = LastError(LOST_TASK, message[:_MAX_MESSAGE_CHARS], None, datetime.now(UTC))
        value = json.dumps(error.as_dict(), ensure_ascii=False)
        self._call("recording a lost job", key, lambda: self._write(key, put={"last_error": value}))
        return error

    def record(self, key: ConversationKey, kind: str, message: str, stage: str | None) -> LastError:
        """Record a stage's final failure as ``last_error`` of the running job."""
        if len(message) > _MAX_MESSAGE_CHARS:
            message = message[:_MAX_MESSAGE_CHARS] + "..."
        error = LastError(kind, message, stage, datetime.now(UTC))
        value = json.dumps(error.as_dict(), ensure_ascii=False)

        self._call(
            "recording a failure", key, lambda: self._write(key, put={"last_error": value, "run_failed": "1"})
        )
        return error

    def run_failed(self, key: ConversationKey) -> bool:
        """True when the running job has had a failed stage."""
        return bool(
            self._call(
                "reading the job's failures", key, lambda: self.client.hexists(self.key(key), "run_failed")
            )
        )

    def job_finished(self, key: ConversationKey, failed: bool, hold: Hold | None = None) -> float | None:
        """Close the job's record: a failed job extends the backoff (returns its seconds); one
        without a failed stage clears ``last_error`` and the backoff, and stamps
        ``last_success_at`` only when it saved a version (``version_saved``) and left no hold.

        ``hold``: the job could not make progress (it is recorded; a job without one removes
        any earlier hold).
        """
        held = {"hold": json.dumps(hold.as_dict(), ensure_ascii=False)} if hold is not None else {}
        unheld: tuple[str, ...] = () if hold is not None else ("hold",)
        if failed:
            count = int(self._call("counting failed jobs", key, lambda: self._write(key, incr="failures")))
            pause = min(self.backoff_seconds * float(2 ** min(count - 1, 32)), self.backoff_max_seconds)
            retry_at = repr(time.time() + pause)
            self._call(
                "starting the backoff",
                key,
                lambda: self._write(
                    key,
                    put={"retry_at": retry_at, **held},
                    remove=("run_failed", "run_saved", "run_held", *unheld),
                ),
            )
            return pause
        saved = self._call(
            "reading the job's saves", key, lambda: self.client.hexists(self.key(key), "run_saved")
        )
        put = dict(held)
        if hold is None and saved:
            put["last_success_at"] = datetime.now(UTC).isoformat()
        self._call(
            "ending a job without a failure" if hold is None else "recording a hold",
            key,
            lambda: self._write(
                key,
                put=put or None,
                remove=("last_error", "failures", "retry_at", "run_failed", "run_saved", "run_held", *unheld),
            ),
        )
        return None

    def delete(self, key: ConversationKey) -> None:
        """Forget the record (the conversation is deleted)."""
        self._call("deleting the failure record", key, lambda: self.client.delete(self.key(key)))
