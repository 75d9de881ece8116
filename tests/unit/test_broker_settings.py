"""``worker.broker_url`` / ``worker.result_backend_url`` and what an AMQP broker changes in
Celery's configuration (no server needed: ``tests/chaos/test_rabbitmq.py`` runs them)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from workers.app import celery_config
from workers.broker import node_queues, public_host, retry_countdown
from workers.nodes import node_argv, node_hostname

AMQP = "amqp://ops:s3cret-pw@rabbit.internal:5672//"


def _amqp(**worker: object) -> Settings:
    return Settings.load({"redis": {"key_prefix": "dep1"}, "worker": {"broker_url": AMQP, **worker}})


def test_broker_and_result_backend_default_to_redis_url_and_keep_the_redis_transport() -> None:
    settings = Settings.load({"redis": {"url": "redis://r:6379/3", "key_prefix": "dep1"}})
    config = celery_config(settings)
    assert config["broker_url"] == config["result_backend"] == "redis://r:6379/3"
    assert config["task_queues"] is None
    assert config["broker_transport_options"]["queue_order_strategy"] == "priority"


def test_the_broker_alias_and_a_separate_result_backend_are_read_from_the_environment() -> None:
    settings = Settings.from_env(
        {"CTXCORE_BROKER_URL": AMQP, "CTXCORE_WORKER__RESULT_BACKEND_URL": "redis://results:6379/1"}
    )
    config = celery_config(settings)
    assert config["broker_url"] == AMQP and config["result_backend"] == "redis://results:6379/1"


def test_an_amqp_broker_gets_quorum_queues_with_a_delivery_limit_and_a_dead_letter_queue() -> None:
    config = celery_config(_amqp(delivery_limit=7))
    jobs, stages = config["task_queues"]
    assert (jobs.name, stages.name) == ("dep1.jobs", "dep1.stages")
    for queue in (jobs, stages):
        # Topic exchanges: native delayed delivery cannot route a countdown through a direct one.
        assert queue.exchange.type == "topic" and queue.exchange.name == queue.name
        assert queue.queue_arguments == {
            "x-queue-type": "quorum",
            "x-delivery-limit": 7,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dep1.dead",
        }
    assert config["worker_detect_quorum_queues"] is True
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert "visibility_timeout" not in config["broker_transport_options"]


def test_a_bad_broker_scheme_is_refused_without_echoing_the_url() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.load({"worker": {"broker_url": "kafka://ops:s3cret-pw@k:9092"}})
    assert "worker.broker_url" in str(info.value) and "s3cret-pw" not in str(info.value)


def test_consumer_timeout_must_exceed_the_hard_limit_plus_the_longest_retry() -> None:
    with pytest.raises(ConfigError, match="consumer_timeout"):
        Settings.load({"worker": {"consumer_timeout": 155, "retry_delays": [2, 4, 8]}})
    assert Settings.load({"worker": {"consumer_timeout": 161}}).worker.consumer_timeout == 161


def test_public_host_never_shows_the_credentials() -> None:
    assert public_host(AMQP) == "amqp://rabbit.internal:5672"


def test_retry_countdowns_are_whole_seconds_on_rabbitmq_only() -> None:
    assert retry_countdown(_amqp(), 0.2) == 1.0 and retry_countdown(_amqp(), 2.4) == 3.0
    assert retry_countdown(Settings(), 0.2) == 0.2


def test_the_nodes_of_an_amqp_worker() -> None:
    settings = _amqp()
    assert node_queues(settings, "stages") == ["dep1.stages"]
    assert node_queues(settings, "drain") == ["dep1.jobs"]
    assert node_queues(settings, "all") == ["dep1.stages", "dep1.jobs"]
    assert node_hostname("w1@box", "stages") == "stages-w1@box"
    assert node_hostname(None, "drain") == "drain-celery@%h"
    args = argparse.Namespace(loglevel="INFO", hostname="w1@%h", concurrency=4, config="/etc/ctxcore.toml")
    argv = node_argv(args, "drain")
    assert argv[1:6] == ["-m", "workers.cli", "worker", "--node", "drain"]
    assert argv[argv.index("--config") + 1] == "/etc/ctxcore.toml"
    assert argv[argv.index("--hostname") + 1] == "drain-w1@%h"


def test_a_dead_letter_is_described_by_task_id_conversation_and_reason() -> None:
    from workers.dead_letters import describe

    death = [{"reason": "delivery_limit", "queue": "dep1.stages"}]
    stage = {"task": "ctxcore.stage.l0_to_l1", "id": "t1", "argsrepr": "'acme/c1'", "x-death": death}
    assert describe(stage) == ("ctxcore.stage.l0_to_l1", "t1", "acme/c1", "delivery_limit in dep1.stages")
    drain = {"task": "ctxcore.drain", "id": "t2", "argsrepr": "()", "kwargsrepr": "{'ring': 3}"}
    assert describe(drain)[2] == "no conversation (kwargs {'ring': 3})"


def test_importing_the_app_configures_nothing_configure_does() -> None:
    # A fresh interpreter: other tests configure the shared app in this one.
    script = (
        "from workers.app import app, configure\n"
        "from ctxcore.config import Settings\n"
        "print(app.conf.task_default_queue, app.conf.broker_url)\n"
        "configure(Settings.load({'redis': {'url': 'redis://r:6379/3', 'key_prefix': 'dep1'}}))\n"
        "print(app.conf.task_default_queue, app.conf.broker_url)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXCORE_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines() == ["celery None", "dep1.jobs redis://r:6379/3"]
