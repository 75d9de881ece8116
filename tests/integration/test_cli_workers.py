"""``ctxcore worker``, ``ctxcore flower`` and ``ctxcore inspect`` use the deployment's settings.

The README's old ``celery -A workers.app flower`` watched ``6379/0`` whatever
``CTXCORE_REDIS_URL`` said; ``ctxcore flower`` configures the app from the environment first.
Celery's and Flower's own start-up are replaced by recorders here (a real Flower and workers
run in ``tests/chaos/test_deployments.py``).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.state import ConversationKey
from tests.integration.test_cli import run_cli
from workers.keyspace import delete_prefixed_keys


@pytest.fixture()
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``worker_main`` / ``start`` were called with, and the app's broker at that moment."""
    from workers.app import app

    seen: dict[str, Any] = {}

    def record(kind: str) -> Any:
        def run(argv: list[str]) -> int:
            seen[kind] = argv
            seen["broker_url"] = app.conf.broker_url
            seen["event_exchange"] = app.conf.event_exchange
            seen["keyprefix"] = app.conf.broker_transport_options.get("global_keyprefix")
            return 0

        return run

    monkeypatch.setattr(app, "worker_main", record("worker"))
    monkeypatch.setattr(app, "start", record("flower"))
    yield seen
    from workers.app import configure

    configure(Settings())


# No metrics server: these workers never start (worker_main is recorded), and a server
# would stay bound in the test process (tests/integration/test_prometheus.py serves one).
ENV = {
    "CTXCORE_REDIS_URL": "redis://127.0.0.1:6399/4",
    "CTXCORE_REDIS__KEY_PREFIX": "deploy1",
    "CTXCORE_WORKER__METRICS_PORT": "0",
}


def test_worker_consumes_its_deployments_queues_under_the_given_hostname(recorded: dict[str, Any]) -> None:
    code, _ = run_cli("worker", "--hostname", "w7@%h", "--concurrency", "3", env=ENV)
    assert code == 0
    argv = recorded["worker"]
    assert argv[argv.index("-Q") + 1] == "deploy1.stages,deploy1.jobs"
    assert argv[argv.index("--hostname") + 1] == "w7@%h" and argv[argv.index("--concurrency") + 1] == "3"
    assert recorded["broker_url"] == ENV["CTXCORE_REDIS_URL"] and recorded["keyprefix"] == "deploy1:"
    code, _ = run_cli("worker", env=ENV)
    assert "--hostname" not in recorded["worker"]


AMQP_ENV = {**ENV, "CTXCORE_BROKER_URL": "amqp://guest:guest@rabbit.invalid:5672//"}


@pytest.fixture()
def no_startup_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up checks connect to the servers: these tests name none that run."""
    import workers.runtime

    monkeypatch.setattr(workers.runtime, "check_startup", lambda settings: None)


@pytest.mark.usefixtures("no_startup_check")
def test_on_rabbitmq_a_drain_node_and_a_stages_node_consume_one_queue_each(recorded: dict[str, Any]) -> None:
    code, _ = run_cli("worker", "--node", "drain", "--concurrency", "3", env=AMQP_ENV)
    assert code == 0
    argv = recorded["worker"]
    assert argv[argv.index("-Q") + 1] == "deploy1.jobs" and argv[argv.index("--concurrency") + 1] == "1"
    assert recorded["broker_url"] == AMQP_ENV["CTXCORE_BROKER_URL"]
    code, _ = run_cli("worker", "--node", "stages", "--concurrency", "3", env=AMQP_ENV)
    argv = recorded["worker"]
    assert argv[argv.index("-Q") + 1] == "deploy1.stages" and argv[argv.index("--concurrency") + 1] == "3"


@pytest.mark.usefixtures("no_startup_check")
def test_on_rabbitmq_a_plain_worker_runs_both_nodes(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import workers.nodes

    started: list[str] = []
    monkeypatch.setattr(workers.nodes, "run_nodes", lambda args: started.append(args.node) or 0)
    code, _ = run_cli("worker", env=AMQP_ENV)
    assert code == 0 and started == ["all"] and "worker" not in recorded


@pytest.mark.usefixtures("no_startup_check")
def test_the_node_supervisor_writes_json_lines_with_logging_format_json(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    import workers.nodes
    from workers.logs import JsonFormatter

    monkeypatch.setattr(workers.nodes, "run_nodes", lambda args: 0)
    root = logging.getLogger()
    before = list(root.handlers)
    formatters = {h: h.formatter for h in before}
    try:
        code, _ = run_cli("worker", env={**AMQP_ENV, "CTXCORE_LOGGING__FORMAT": "json"})
        assert (
            code == 0 and root.handlers and all(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
        )
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
        for handler, formatter in formatters.items():
            handler.setFormatter(formatter)


def test_flower_watches_the_configured_broker_and_passes_its_own_options(recorded: dict[str, Any]) -> None:
    env = {**ENV, "CTXCORE_FLOWER__PORT": "5566"}
    code, _ = run_cli("flower", "--", "--persistent=True", env=env)
    assert code == 0
    assert recorded["flower"] == ["flower", "--address=127.0.0.1", "--port=5566", "--persistent=True"]
    assert recorded["broker_url"] == ENV["CTXCORE_REDIS_URL"]
    assert recorded["event_exchange"] == "deploy1.events" and recorded["keyprefix"] == "deploy1:"


def test_flower_refuses_other_addresses_without_basic_auth(recorded: dict[str, Any]) -> None:
    recorded.clear()
    code, _ = run_cli("flower", env={**ENV, "CTXCORE_FLOWER__HOST": "0.0.0.0"})
    assert code != 0 and "flower" not in recorded
    code, _ = run_cli("flower", "--", "--address=0.0.0.0", env=ENV)
    assert code != 0 and "flower" not in recorded
    code, _ = run_cli("flower", env={**ENV, "CTXCORE_FLOWER__BASIC_AUTH": "no-password"})
    assert code != 0 and "flower" not in recorded
    exposed = {**ENV, "CTXCORE_FLOWER__HOST": "0.0.0.0", "CTXCORE_FLOWER__BASIC_AUTH": "ops:pw-123456"}
    code, _ = run_cli("flower", env=exposed)
    assert code == 0
    assert recorded["flower"] == ["flower", "--address=0.0.0.0", "--port=5555", "--basic-auth=ops:pw-123456"]


@pytest.mark.redis
def test_inspect_shows_the_compaction_detail(redis_url: str) -> None:
    from workers.runtime import Runtime

    url = f"{redis_url.rsplit('/', 1)[0]}/9"
    prefix = f"cliw{uuid.uuid4().hex[:6]}"
    rt = Runtime(Settings.load({"redis": {"url": url, "key_prefix": prefix}}))
    key = ConversationKey("acme", "failing")
    rt.failures.record(key, "internal", "TypeError: boom", "l0_to_l1")
    code, out = run_cli(
        "inspect",
        "acme",
        "failing",
        "--json",
        env={"CTXCORE_REDIS_URL": url, "CTXCORE_REDIS__KEY_PREFIX": prefix},
    )
    assert code == 0
    detail = json.loads(out)["compaction_detail"]
    assert detail["last_error"]["kind"] == "internal" and detail["last_error"]["message"] == "TypeError: boom"
    assert detail["last_success_at"] is None
    client = redis.Redis.from_url(url)
    try:
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


def test_a_worker_says_at_start_up_what_summarises(caplog: pytest.LogCaptureFixture) -> None:
    from celery.signals import worker_ready

    from workers.app import configure, summariser_description

    offline = summariser_description(Settings())
    assert offline.startswith("summarising with the offline ExtractiveModel") and "MODEL_BASE_URL" in offline
    mixed = Settings.load(
        {
            "model": {"base_url": "https://user:sk-secret@api.example.com/v1", "name": "gpt-4o-mini"},
            "tenants": {"acme": {"model": {"name": "local"}}},
        }
    )
    text = summariser_description(mixed)
    assert text.startswith("summarising with gpt-4o-mini at https://api.example.com/v1")
    assert "acme (the offline ExtractiveModel" in text and "sk-secret" not in text
    configure(Settings())
    try:
        with caplog.at_level("INFO", logger="ctxcore.worker"):
            worker_ready.send(sender=None)
        assert "ctxcore worker: summarising with the offline ExtractiveModel" in caplog.text
    finally:
        configure(Settings())
