"""Stage tasks continue their job's trace in whichever worker runs them.

Celery signals, connected when ``workers.app`` loads its ``include``: a stage task sent while
a trace is current (the job's span in the drain, or the job's context a stage task runs in,
when it sends the next stage or its own retry) carries that context's ``traceparent`` in the
header ``ctxcore_traceparent``; the worker that runs it makes it current for the task, so
the stage's span (``workers.telemetry.spans.traced_stage``) is a child of the job's span,
however many processes the job crosses. Drain tokens carry nothing: a token starts whichever
job its ring serves next, and that job links to its own requests (``workers.telemetry.jobs``).

It reads the process's tracer from the app, so it sits above ``workers.app``, outside
``workers.telemetry`` (which the runtime, and so the app, imports).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from celery import Task
from celery.signals import before_task_publish, task_postrun, task_prerun

from workers.app import runtime

__all__ = ["HEADER"]

HEADER = "ctxcore_traceparent"
_STAGES = "ctxcore.stage."
_STACK = "ctxcore_trace_stack"


def _tracer_enabled() -> bool:
    return runtime().tracer.enabled


@before_task_publish.connect
def _inject(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is None or not (sender or "").startswith(_STAGES) or not _tracer_enabled():
        return
    traceparent = runtime().tracer.traceparent()
    if traceparent is not None:
        headers[HEADER] = traceparent


@task_prerun.connect
def _attach(task_id: str | None = None, task: Task[Any, Any] | None = None, **_: Any) -> None:
    if task is None or task_id is None or not task.name.startswith(_STAGES) or not _tracer_enabled():
        return
    traceparent = task.request.get(HEADER)
    if not isinstance(traceparent, str):
        return
    stack = ExitStack()
    stack.enter_context(runtime().tracer.attached(traceparent))
    # Kept on this execution's request (a thread pool runs several tasks at once).
    task.request.update({_STACK: stack})


@task_postrun.connect
def _detach(task: Task[Any, Any] | None = None, **_: Any) -> None:
    stack = task.request.get(_STACK) if task is not None else None
    if isinstance(stack, ExitStack):
        stack.close()
