"""``logging.format = "json"``: one JSON object a line, from a standard-library ``Formatter``.

``text`` leaves every tool's own format alone (uvicorn's, Celery's). ``json`` makes each line
a process writes JSON: ``ctxcore serve`` gives uvicorn a logging config whose formatters are
``JsonFormatter`` (``uvicorn_log_config``), the app factory under ``uvicorn --factory`` puts it
on the handlers uvicorn installed (``apply_log_format``), and a worker on the handlers of
Celery's root and task loggers (its ``after_setup_*logger`` signals, in ``workers.app``).
"""

from __future__ import annotations

import copy
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from celery._state import get_current_task

from ctxcore.config import Settings

__all__ = [
    "SERVICE_LOGGERS",
    "JsonFormatter",
    "TaskJsonFormatter",
    "apply_log_format",
    "before_celery_logging",
    "uvicorn_log_config",
]

# Celery's worker line format, for the lines a worker writes before Celery's logging is set up.
_CELERY_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"

# The loggers of ``ctxcore serve``: the root (ctxcore's and workers' own), uvicorn's.
SERVICE_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
# What every LogRecord carries; anything else on a record is an ``extra`` and is written.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extras, "exception"?, "stack"?}`` on one line.

    ``time`` is UTC ISO 8601 with milliseconds; values JSON cannot hold are written as ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(
            (key, value)
            for key, value in vars(record).items()
            if key not in _RECORD_FIELDS and not key.startswith("_")
        )
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TaskJsonFormatter(JsonFormatter):
    """``JsonFormatter`` plus the running task's ``task_id`` and ``task_name`` (what Celery's
    text ``TaskFormatter`` adds to its task logger's lines)."""

    def format(self, record: logging.LogRecord) -> str:
        task = get_current_task()
        if task is not None and task.request.id is not None:
            record.__dict__.setdefault("task_id", task.request.id)
            record.__dict__.setdefault("task_name", task.name)
        return super().format(record)


def apply_log_format(
    settings: Settings,
    loggers: Iterable[logging.Logger] | None = None,
    formatter: type[JsonFormatter] = JsonFormatter,
) -> None:
    """With ``logging.format = "json"``, put ``formatter`` on every handler of ``loggers``
    (default: the root's and uvicorn's; a root without a handler gets a stderr one, so
    ctxcore's own warnings are JSON too, not the plain last-resort line). With ``text``,
    nothing changes."""
    if settings.logging.format != "json":
        return
    for logger in loggers if loggers is not None else map(logging.getLogger, SERVICE_LOGGERS):
        if logger is logging.getLogger() and not logger.handlers:
            logger.addHandler(logging.StreamHandler(sys.stderr))
        for handler in logger.handlers:
            handler.setFormatter(formatter())


def uvicorn_log_config(settings: Settings) -> dict[str, Any]:
    """uvicorn's own logging config, its formatters made ``JsonFormatter`` for ``json`` (the
    root logger then writes through uvicorn's stderr handler too)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    if settings.logging.format == "json":
        config["formatters"] = {name: {"()": JsonFormatter} for name in config["formatters"]}
        config["root"] = {"handlers": ["default"]}
    return config


@contextmanager
def before_celery_logging(settings: Settings, loglevel: str, name: str) -> Iterator[None]:
    """Logger ``name``'s lines at ``loglevel`` and above go to stderr while the block runs,
    as Celery would write them (JSON with ``logging.format = "json"``): a worker's lines
    before ``app.worker_main`` sets up logging (the root has no handler yet, so INFO would
    be dropped). The logger is left as it was afterwards."""
    logger = logging.getLogger(name)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if settings.logging.format == "json" else logging.Formatter(_CELERY_FORMAT)
    )
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(loglevel.upper())
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
