"""Celery pieces of the failure tests: the task events Flower reads (``EventLog``), and the
one in-process worker of the suite (``tests.workers_fixture.in_process_worker``, re-exported)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from tests.workers_fixture import in_process_worker

__all__ = ["FINAL_EVENTS", "EventLog", "in_process_worker"]

FINAL_EVENTS = ("task-failed", "task-succeeded")


class EventLog:
    """Task events of the configured deployment, captured by ``app.events.Receiver`` in a
    thread: exactly what Flower shows (states, exceptions, results, retries)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._receiver: Any = None
        self._thread: threading.Thread | None = None

    def _on_event(self, event: dict[str, Any]) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def _capture(self) -> None:
        from workers.app import app

        with app.connection_for_read() as conn:
            self._receiver = app.events.Receiver(conn, handlers={"*": self._on_event})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> EventLog:
        from workers.app import app

        self._thread = threading.Thread(target=self._capture, name="event-log", daemon=True)
        self._thread.start()
        # Events sent before the receiver's queue is bound are lost: probe until one arrives.
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + 10
        with app.connection_for_write() as conn:
            dispatcher = app.events.Dispatcher(conn)
            while not self._wait(lambda: any(e.get("probe") == probe for e in self.events), 0.2):
                if time.monotonic() > deadline:
                    raise AssertionError("the event receiver never got its probe event")
                dispatcher.send("worker-probe", probe=probe)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        if self._thread is not None:
            self._thread.join(5)

    def _wait(self, predicate: Any, timeout: float) -> bool:
        with self._cond:
            return bool(self._cond.wait_for(predicate, timeout))

    def of(self, task_id: str) -> list[dict[str, Any]]:
        """The events of one task, in arrival order."""
        with self._cond:
            return [e for e in self.events if e.get("uuid") == task_id]

    def types(self, task_id: str) -> list[str]:
        """The event types of one task, in arrival order."""
        return [e["type"] for e in self.of(task_id)]

    def final(self, task_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The task's ``task-failed`` or ``task-succeeded`` event (waits for it)."""
        if not self._wait(lambda: any(e["type"] in FINAL_EVENTS for e in self.of(task_id)), timeout):
            raise AssertionError(f"task {task_id} did not end in {timeout}s: {self.types(task_id)}")
        return next(e for e in self.of(task_id) if e["type"] in FINAL_EVENTS)

    def tasks(self, name_prefix: str, event_type: str = "task-received") -> list[dict[str, Any]]:
        """Events of ``event_type`` of tasks whose name starts with ``name_prefix`` (only
        ``task-sent``/``task-received`` carry the name; the others are matched by uuid),
        each with its task's ``name`` filled in."""
        with self._cond:
            names = {e["uuid"]: e["name"] for e in self.events if e.get("name") and e.get("uuid")}
            return [
                {**e, "name": names[e["uuid"]]}
                for e in self.events
                if e["type"] == event_type and str(names.get(e.get("uuid", ""), "")).startswith(name_prefix)
            ]
