"""``logging.format``: ``text`` leaves each tool's format, ``json`` makes every line JSON."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from celery import Celery

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from workers.logs import JsonFormatter, TaskJsonFormatter, apply_log_format, uvicorn_log_config

JSON = Settings.load({"logging": {"format": "json"}})


def test_an_unknown_format_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"logging\.format: Input should be 'text' or 'json'"):
        Settings.from_env({"CTXCORE_LOGGING__FORMAT": "xml"})
    assert Settings.from_env({"CTXCORE_LOGGING__FORMAT": "json"}).logging.format == "json"
    assert Settings().logging.format == "text"


def test_a_json_line_has_the_record_its_extras_and_the_exception() -> None:
    try:
        raise KeyError("boom")
    except KeyError:
        record = logging.getLogger("ctxcore.test").makeRecord(
            "ctxcore.test", logging.ERROR, __file__, 1, "job %s failed", ("j1",), sys.exc_info(),
            extra={"tenant": "acme", "opaque": object()},
        )  # fmt: skip
    line = JsonFormatter().format(record)
    assert "\n" not in line  # one object a line, the traceback included
    out = json.loads(line)
    assert out["level"] == "ERROR" and out["logger"] == "ctxcore.test" and out["message"] == "job j1 failed"
    assert out["tenant"] == "acme" and out["opaque"].startswith("<object object")
    assert "KeyError: 'boom'" in out["exception"] and out["time"].endswith("+00:00")
    assert not {"args", "msg", "exc_info", "levelno", "pathname"} & set(out)


def test_a_task_line_names_the_running_task() -> None:
    app = Celery("test-logs", set_as_current=False)

    @app.task(name="test.logs.emit")
    def emit() -> str:
        return TaskJsonFormatter().format(logging.makeLogRecord({"msg": "in a task"}))

    out = json.loads(emit.apply(task_id="t-1").get())
    assert out["task_id"] == "t-1" and out["task_name"] == "test.logs.emit" and out["message"] == "in a task"
    assert "task_id" not in json.loads(TaskJsonFormatter().format(logging.makeLogRecord({"msg": "outside"})))


def test_apply_changes_handlers_only_for_json() -> None:
    logger = logging.getLogger("test.logs.apply")
    handler = logging.StreamHandler()
    text = logging.Formatter("%(message)s")
    handler.setFormatter(text)
    logger.addHandler(handler)
    try:
        apply_log_format(Settings(), [logger])
        assert handler.formatter is text
        apply_log_format(JSON, [logger])
        assert isinstance(handler.formatter, JsonFormatter)
    finally:
        logger.removeHandler(handler)


def test_text_keeps_uvicorns_own_config() -> None:
    from uvicorn.config import LOGGING_CONFIG

    assert uvicorn_log_config(Settings()) == LOGGING_CONFIG
    assert uvicorn_log_config(JSON)["formatters"]["access"] == {"()": JsonFormatter}


def test_the_celery_signals_put_json_on_the_worker_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.signals import after_setup_logger, after_setup_task_logger

    import workers.app

    logger = logging.getLogger("test.logs.celery")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    try:
        monkeypatch.setattr(workers.app._state, "settings", Settings())
        after_setup_logger.send(
            sender=None, logger=logger, loglevel=20, logfile=None, format="", colorize=False
        )
        assert not isinstance(handler.formatter, JsonFormatter)
        monkeypatch.setattr(workers.app._state, "settings", JSON)
        after_setup_logger.send(
            sender=None, logger=logger, loglevel=20, logfile=None, format="", colorize=False
        )
        assert type(handler.formatter) is JsonFormatter
        after_setup_task_logger.send(
            sender=None, logger=logger, loglevel=20, logfile=None, format="", colorize=False
        )
        assert type(handler.formatter) is TaskJsonFormatter
    finally:
        logger.removeHandler(handler)


def _output_lines(script: str) -> list[str]:
    """What a fresh interpreter running ``script`` writes (uvicorn's access log goes to stdout)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_serve_and_a_celery_worker_write_only_json_lines() -> None:
    # Fresh interpreters: both configure the process's logging for real.
    served = _output_lines(
        """
        import logging, logging.config
        from ctxcore.config import Settings
        from workers.logs import uvicorn_log_config
        logging.config.dictConfig(uvicorn_log_config(Settings.load({"logging": {"format": "json"}})))
        logging.getLogger("uvicorn.error").info("Started server process")
        logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "1.2.3.4:5", "GET", "/healthz", "1.1", 200)
        logging.getLogger("workers.service").warning("from ctxcore")
        """
    )
    messages = [json.loads(line)["message"] for line in served]
    assert messages == ["Started server process", '1.2.3.4:5 - "GET /healthz HTTP/1.1" 200', "from ctxcore"]
    worker = _output_lines(
        """
        import logging
        from celery.utils.log import get_task_logger
        from ctxcore.config import Settings
        from workers.app import app, configure
        configure(Settings.load({"logging": {"format": "json"}}))
        app.log.setup(loglevel="INFO", redirect_stdouts=False)
        logging.getLogger("celery.worker").info("celery@h ready.")
        get_task_logger("workers.tasks").warning("stage failed")
        """
    )
    assert [json.loads(line)["message"] for line in worker] == ["celery@h ready.", "stage failed"]
    text = _output_lines(
        """
        import logging
        from ctxcore.config import Settings
        from workers.app import app, configure
        configure(Settings())
        app.log.setup(loglevel="INFO", redirect_stdouts=False, colorize=False)
        logging.getLogger("celery.worker").info("celery@h ready.")
        """
    )
    assert len(text) == 1 and text[0].startswith("[") and "celery@h ready." in text[0]  # Celery's own format


def test_serve_passes_the_access_log_setting_to_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from workers.http import serve

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.append(kwargs))
    serve(Settings.load({"http": {"access_log": False}}))
    serve(Settings())
    assert [kw["access_log"] for kw in seen] == [False, True]
