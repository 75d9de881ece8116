"""One in-process Celery worker for every test that needs a real one (no eager mode).

``in_process_worker(settings)`` configures ``workers.app.app`` from ``settings``, starts a
worker on it in this process (threads pool, the deployment's queues in consume order) and
yields the runtime the worker's tasks use, so a test can read (or break) the same stores.

Why not ``celery.contrib.pytest``'s ``celery_app``/``celery_worker`` fixtures: ``celery_app``
builds a fresh test app from a ``celery_config`` dict, while ctxcore's tasks are registered
on ``workers.app.app`` and take their broker, key prefix (``global_keyprefix``), queues and
``runtime()`` from the ``Settings`` a test builds at run time (its own prefix, a cluster, a
RabbitMQ broker, a fake model server). Overriding ``celery_app`` to hand back that app would
leave ``celery_worker`` as a two-line wrapper around ``start_worker``, but it could only start
at set-up: several tests start the worker part-way (after breaking a store, on settings they
switch to) and the live API starts and stops it by hand. A context manager serves all of
them; ``celery_worker_parameters`` would hold the same keyword arguments as below.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from ctxcore.config import Settings
from workers.runtime import Runtime

__all__ = ["in_process_worker"]


@contextmanager
def in_process_worker(
    settings: Settings, *, concurrency: int = 2, ignore_result: bool = False
) -> Iterator[Runtime]:
    """A real Celery worker of the deployment ``settings`` describes, in this process.

    ``ignore_result``: tasks store no results, so nothing subscribes to a Redis the test
    stops before the worker's results would be collected. On exit the worker is stopped
    (20 s for running tasks) and Celery is configured back to the default ``Settings()``.
    """
    from celery.contrib.testing.worker import start_worker

    from workers.app import app, configure, queue_names, runtime

    configure(settings)
    if ignore_result:
        app.conf.task_ignore_result = True
    try:
        with start_worker(
            app,
            pool="threads",  # prefork would fork the test process; threads share its runtime
            concurrency=concurrency,
            # The ping check sends celery.contrib.testing's ``ping`` task, which is not one
            # of the deployment's tasks nor routed to its queues, and waits for its result
            # (off with ``ignore_result``): it would time out rather than prove anything.
            perform_ping_check=False,
            queues=queue_names(settings).consume_order(),
            shutdown_timeout=20,
        ):
            yield runtime()
            # Results of tasks sent from this process are subscribed to until their
            # AsyncResult is collected (reference cycles): collect them while the test's
            # Redis still answers, or they try to unsubscribe from a server that is gone.
            gc.collect()
    finally:
        if ignore_result:
            app.conf.task_ignore_result = False
        configure(Settings())
