"""The upstream key, the summariser key and bearer tokens appear nowhere a tenant or Flower
can read, with both upstreams echoing them: the proxy's answers (status, body, headers),
``last_error``, the Celery result backend (exception, chained causes, traceback) and the
``task-failed`` / ``task-retried`` events Flower's task pages show; ``ctxcore flower``
binds 127.0.0.1 unless basic auth is set."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from ctxcore.config import FlowerSettings, Settings, hash_token
from ctxcore.errors import ConfigError
from ctxcore.messages import from_openai
from ctxcore.state import ConversationKey
from ctxcore.summarize.errors import ModelCallError
from ctxcore.testing import OpenAIServer
from workers.commands import check_flower_args, flower_options
from workers.failures import StageFailedError
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.scrubbing import deployment_secrets, scrub_exception
from workers.service import InlineQueue

UPSTREAM_KEY = "upstream-key-7f3a9c1e"  # not key-shaped: found by value
SUMMARISER_KEY = "summariser-key-42b8d0"
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLXRleHQ"
TOKEN = "tenant-token-no-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "leaky-model"
INTERNAL = "http://10.9.8.7:4000/v1"


def leaks(text: str) -> list[str]:
    return [s for s in (UPSTREAM_KEY, SUMMARISER_KEY, BEARER, "10.9.8.7") if s in text]


# --- unit: the scrubbing itself -----------------------------------------------------------


def test_scrub_exception_redacts_the_whole_chain_in_place() -> None:
    settings = Settings.load({"model": {"api_key_env": "LEAKY_KEY"}})
    secrets = deployment_secrets(settings, {"LEAKY_KEY": SUMMARISER_KEY})
    assert secrets == (SUMMARISER_KEY,)
    try:
        try:
            raise RuntimeError(
                f"401 Incorrect API key {SUMMARISER_KEY} at {INTERNAL}, Authorization: Bearer {BEARER}"
            )
        except RuntimeError as cause:
            raise StageFailedError("authentication", f"echo {SUMMARISER_KEY}") from cause
    except StageFailedError as exc:
        assert scrub_exception(exc, secrets) is exc
        import traceback

        text = "".join(traceback.format_exception(exc))
        assert leaks(text) == [] and "[REDACTED]" in text and "[url]" in text
        assert exc.kind == "authentication" and leaks(exc.message) == []
    error = ModelCallError("authentication", f"key {SUMMARISER_KEY}")
    scrub_exception(error, secrets)
    assert leaks(error.message) == [] and leaks(str(error)) == []


def test_deployment_secrets_include_store_passwords() -> None:
    settings = Settings.load(
        {
            "redis": {"url": "redis://:redis-pass-123@127.0.0.1:6379/0"},
            "proxy": {"upstream_api_key_env": "UP_KEY"},
            "tenants": {"acme": {"model": {"api_key_env": "ACME_KEY"}}},
        }
    )
    found = deployment_secrets(
        settings, {"UP_KEY": UPSTREAM_KEY, "ACME_KEY": SUMMARISER_KEY, "OPENAI_API_KEY": "x"}
    )
    assert set(found) == {UPSTREAM_KEY, SUMMARISER_KEY, "redis-pass-123", "x"}


# --- Flower ---------------------------------------------------------------------------------


def test_flower_binds_loopback_unless_basic_auth_is_set() -> None:
    default = Settings().flower
    assert default.host == "127.0.0.1"
    check_flower_args(default, [])
    assert flower_options(default) == ["--address=127.0.0.1", "--port=5555"]
    with pytest.raises(ConfigError, match="basic_auth"):
        check_flower_args(FlowerSettings(host="0.0.0.0"), [])
    exposed = Settings.load({"flower": {"host": "0.0.0.0", "basic_auth": "ops:s3cret-pw"}}).flower
    check_flower_args(exposed, ["--persistent=False"])
    assert "--basic-auth=ops:s3cret-pw" in flower_options(exposed)
    for sneaky in ("--address=0.0.0.0", "--port=80", "--basic-auth=a:b", "--basic_auth=a:b"):
        with pytest.raises(ConfigError, match=r"flower\.host"):
            check_flower_args(default, [sneaky])
    for malformed in ("nopassword", "user:", ":pw", "a b:c", ["ok:pw", "bad"]):
        with pytest.raises(ConfigError, match=r"flower\.basic_auth"):
            Settings.load({"flower": {"basic_auth": malformed}})


# --- the proxy ----------------------------------------------------------------------------


@pytest.fixture()
def proxy_client(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, OpenAIServer]]:
    monkeypatch.setenv("CTXCORE_TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    with OpenAIServer() as upstream:
        settings = Settings.load(
            {
                "redis": {"url": redis_url, "key_prefix": f"leak{uuid.uuid4().hex[:6]}"},
                "http": {"tokens": {hash_token(TOKEN): "acme"}},
                "proxy": {
                    "upstream_base_url": upstream.base_url,
                    "upstream_api_key_env": "CTXCORE_TEST_UPSTREAM_KEY",
                    "context_window_tokens": {MODEL: 8000},
                },
            }
        )
        runtime = Runtime(settings)
        with TestClient(create_app(runtime, InlineQueue())) as client:
            yield client, upstream
        delete_prefixed_keys(runtime.redis, settings.redis.key_prefix)
        runtime.redis.close()


ECHOED_HEADERS = {
    "x-request-id": "req-1",
    "x-ratelimit-remaining-requests": "7",
    "set-cookie": f"session={UPSTREAM_KEY}",
    "location": f"{INTERNAL}/login",
    "x-debug-auth": f"Bearer {UPSTREAM_KEY}",
}


@pytest.mark.redis
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_echoing_the_key_become_openai_errors_without_it(
    proxy_client: tuple[TestClient, OpenAIServer], stream: bool
) -> None:
    client, upstream = proxy_client
    echo = f"Incorrect API key provided: {UPSTREAM_KEY}. Authorization: Bearer {BEARER}"
    cases = [
        (
            401,
            json.dumps(
                {"error": {"message": echo, "type": "invalid_request_error", "code": "invalid_api_key"}}
            ).encode(),
        ),
        (500, json.dumps({"error": {"message": echo, "type": "server_error", "code": None}}).encode()),
        (502, f"<html>bad gateway: {echo}</html>".encode()),  # not JSON
        (429, b""),
    ]
    for status, body in cases:
        content_type = "application/json" if body.startswith(b"{") else "text/html"
        upstream.push_response(status, body, {"content-type": content_type, **ECHOED_HEADERS})
        r = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream},
            headers={**AUTH, "X-Ctxcore-Conversation": f"c-{uuid.uuid4().hex[:8]}"},
        )
        assert r.status_code == status, (status, r.text)
        assert leaks(r.text) == [] and leaks(json.dumps(dict(r.headers))) == [], (status, r.text, r.headers)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert (
            "req-1" in r.headers.get("x-request-id", "")
            and r.headers.get("x-ratelimit-remaining-requests") == "7"
        )
        assert (
            "set-cookie" not in r.headers and "location" not in r.headers and "x-debug-auth" not in r.headers
        )
        if status == 401:
            assert error["code"] == "invalid_api_key" and "[REDACTED]" in error["message"]
        if status == 502:
            assert error["code"] == "upstream_error" and "502" in error["message"]
    # The upstream did receive the key: the proxy forwards it, it just never shows it.
    assert all(h.get("authorization") == f"Bearer {UPSTREAM_KEY}" for h in upstream.headers)


# --- the worker: last_error, result backend, events -----------------------------------------


@pytest.mark.redis
@pytest.mark.slow
def test_a_summariser_echoing_its_key_leaks_it_nowhere(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.events.dispatcher import EventDispatcher

    from tests.workers_fixture import in_process_worker
    from workers.tasks import request_compaction

    monkeypatch.setenv("CTXCORE_TEST_SUMMARISER_KEY", SUMMARISER_KEY)
    echo = f"Incorrect API key provided: {SUMMARISER_KEY}. Authorization: Bearer {BEARER} ({INTERNAL})"
    with OpenAIServer() as model:
        for _ in range(20):
            model.push_fault("auth", message=echo)
        prefix = f"leakw{uuid.uuid4().hex[:6]}"
        settings = Settings.load(
            {
                "redis": {"url": redis_url, "key_prefix": prefix},
                "model": {
                    "base_url": model.base_url,
                    "api_key_env": "CTXCORE_TEST_SUMMARISER_KEY",
                    "timeout": 2,
                },
                "engine": {"keep_recent_messages": 2},
                "worker": {"retry_delays": [0.1], "failure_backoff_seconds": 30},
            }
        )
        key = ConversationKey("acme", "leaky")
        events: list[dict[str, Any]] = []
        # What the worker sends Flower, recorded where it is sent (in this process: threads pool).
        send = EventDispatcher.send

        def recording(self: EventDispatcher, type: str, blind: bool = False, **fields: Any) -> Any:
            events.append({"type": type, **fields})
            return send(self, type, blind=blind, **fields)

        monkeypatch.setattr(EventDispatcher, "send", recording)
        with in_process_worker(settings) as rt:
            for i in range(12):
                rt.log.append(
                    key,
                    from_openai(
                        [
                            {"role": "user", "content": f"step {i}: " + "please summarise this " * 40},
                            {"role": "assistant", "content": "done " * 60},
                        ]
                    ),
                )
            rt.state_store.set_budget(key, 600)
            request_compaction(key)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and rt.failures.detail(key).last_error is None:
                time.sleep(0.1)
            time.sleep(1.0)  # the failed task's result and events
            last = rt.failures.detail(key).last_error
            assert last is not None and last.kind == "authentication", last
            assert leaks(last.message) == [] and "[REDACTED]" in last.message
            client = redis.Redis.from_url(redis_url)
            stored = [
                client.get(k) or b""
                for k in client.scan_iter(match=f"{prefix}:celery-task-meta-*", count=1000)
            ]
            assert stored, "no task result was stored"
            assert all(leaks(v.decode("utf-8", "replace")) == [] for v in stored), stored
            assert any(b"authentication" in v for v in stored)
            failed = [e for e in events if e.get("type") in ("task-failed", "task-retried")]
            assert failed, [e.get("type") for e in events]
            assert all("traceback" in e and "exception" in e for e in failed)
            # Flower's own task page, rendered from those events.
            for event in failed:
                page = flower_task_page(events, event["uuid"])
                assert "authentication" in page and leaks(page) == [], leaks(page)
            assert leaks(json.dumps(events, default=str)) == []
            client.close()
        delete_prefixed_keys(rt.redis, prefix)


def flower_task_page(events: list[dict[str, Any]], task_id: str) -> str:
    """Flower's ``/task/<id>`` page, served by a Flower app fed ``events`` (as recorded
    where the worker sends them) on a loopback port of its own."""
    import asyncio
    import socket

    import httpx
    import tornado.ioloop
    from celery.events.event import Event
    from flower.app import Flower
    from flower.options import default_options
    from flower.urls import settings as flower_settings

    from workers.app import app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        flower = Flower(capp=app, options=default_options, **flower_settings)
        now = time.time()
        for n, event in enumerate(e for e in events if str(e.get("type", "")).startswith("task-")):
            fields = {k: v for k, v in event.items() if k != "type"}
            flower.events.state.event(
                Event(
                    event["type"],
                    hostname="w1@test",
                    clock=n + 1,
                    timestamp=now,
                    local_received=now,
                    **fields,
                )
            )
        flower.listen(port, address="127.0.0.1")
        holder["loop"] = tornado.ioloop.IOLoop.current()
        started.set()
        holder["loop"].start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/task/{task_id}", timeout=10)
        assert response.status_code == 200, response.status_code
        return response.text
    finally:
        holder["loop"].add_callback(holder["loop"].stop)
        thread.join(timeout=5)
