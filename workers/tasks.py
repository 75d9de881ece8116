"""Celery tasks: thin wrappers that validate ids, call the core and return small JSON.

Flow: ``ctxcore.compact`` asks the fair scheduler for a job (coalesced) and sends one
``ctxcore.drain`` token per new job; a drain token pops the next job round-robin over
tenants and sends its first stage; each ``ctxcore.stage.<kind>`` task takes the
conversation's lock, runs ``Coordinator.run_stage`` (CAS save), releases, and sends the next
stage only while the view is still over target. Payloads carry ids and stage records,
never message bodies. The job's life is ``workers.jobs``; a stage's run ``workers.stage_run``.

Failures are visible (DESIGN, "Visible failure"): a transient kind or a store outage is
retried, a permanent kind, or a transient one out of retries, ends the task as ``FAILURE``
with ``StageFailedError(kind, message)`` as its exception. Any other exception propagates
(``FAILURE``, traceback logged, state untouched). ``StageTask.on_failure`` records the
conversation's ``last_error`` and escalates or ends the job (``workers.jobs.after_failure``);
the result names a hold the job left (Flower).
"""

from __future__ import annotations

from typing import Any

from celery import Task

from ctxcore.pipeline import STAGE_ORDER
from ctxcore.state import ConversationKey
from workers.app import app, runtime
from workers.failures import StageFailedError
from workers.jobs import (
    CeleryQueue,
    after_failure,
    request_compaction,
    send_drain_tokens,
    send_stage,
    start_next_job,
)
from workers.scrubbing import scrub_exception
from workers.stage_run import run_stage

__all__ = [
    "STAGE_TASKS",
    "CeleryQueue",
    "StageTask",
    "compact",
    "drain",
    "request_compaction",
    "send_drain_tokens",
    "send_stage",
]


class ScrubbingTask(Task[Any, Any]):
    """Base of ctxcore's tasks: an exception leaving a task is scrubbed of the deployment's
    secrets and URLs, down its chain of causes (``workers.secrets``), before Celery stores it
    in the result backend, sends it in the ``task-failed`` event Flower shows, or logs it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except BaseException as exc:
            scrub_exception(exc, runtime().secrets)
            raise


@app.task(name="ctxcore.compact", acks_late=True, base=ScrubbingTask)
def compact(tenant: str, conversation: str, reason: str = "manual") -> dict[str, Any]:
    """Decide whether ``tenant/conversation`` needs work and queue it (coalesced)."""
    key = ConversationKey(tenant, conversation)
    return {"conversation": str(key), "reason": reason, "status": request_compaction(key, reason)}


@app.task(name="ctxcore.drain", acks_late=True, ignore_result=True, base=ScrubbingTask)
def drain(ring: int | None = None) -> dict[str, Any]:
    """Start the next job of ``ring`` (else of the rings onward), fairly: the scheduler picks
    the job; a ring with more jobs gets its token back, behind the other rings' tokens."""
    return start_next_job(ring)


class StageTask(ScrubbingTask):
    """Base of the stage tasks: a final failure is recorded and escalates or ends the job."""

    # A classified model failure is expected: Celery logs it without a traceback (our own
    # ERROR line names the cause); anything else is logged with its traceback.
    throws = (StageFailedError,)

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Record ``last_error`` and send the next stage (model error) or end the job."""
        tenant, conversation, stage, exhausted = args
        after_failure(ConversationKey(tenant, conversation), stage.get("kind"), list(exhausted), exc)


def _make_stage_task(kind: str) -> Task[Any, Any]:
    def stage_task(
        self: Task[Any, Any], tenant: str, conversation: str, stage: dict[str, Any], exhausted: list[str]
    ) -> dict[str, Any]:
        return run_stage(self, tenant, conversation, stage, exhausted)

    stage_task.__name__ = f"stage_{kind}"
    stage_task.__doc__ = f"Run one {kind} stage of a conversation under its lock and save it with CAS."
    return app.task(name=f"ctxcore.stage.{kind}", bind=True, acks_late=True, base=StageTask)(stage_task)


STAGE_TASKS: dict[str, Task[Any, Any]] = {kind: _make_stage_task(kind) for kind in STAGE_ORDER}
