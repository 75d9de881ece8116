"""The proxy's settings and surroundings through the real ``openai`` SDK: the upstream key
read once at start-up, developer messages, a store outage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from ctxcore.errors import ConfigError
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from tests.chaos.processes import free_port
from tests.live_server import TOKEN, LiveApi, live_api, serve_api

pytestmark = pytest.mark.redis

MODEL = "agent-model"
WINDOW = 6000
SYSTEM = {"role": "system", "content": "You are a careful agent."}


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture
def fresh(upstream: OpenAIServer) -> OpenAIServer:
    upstream.reset()
    return upstream


def sdk(live: LiveApi, conv: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{live.url}/v1",
        api_key=TOKEN,
        default_headers={"X-Ctxcore-Conversation": conv},
        max_retries=0,
    )


def conv_id() -> str:
    return f"px-{uuid.uuid4().hex[:10]}"


def test_a_store_outage_is_a_503_with_retry_after(fresh: OpenAIServer) -> None:
    proxy = {"upstream_base_url": fresh.base_url, "context_window_tokens": {MODEL: WINDOW}}
    down = serve_api(f"redis://127.0.0.1:{free_port()}/0", worker=False, clean=False, proxy=proxy)
    try:
        with pytest.raises(openai.InternalServerError) as info:
            sdk(down, conv_id()).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}]
            )
        assert info.value.status_code == 503 and info.value.code == "store_unavailable"
        assert info.value.response.headers["retry-after"] == "1"
    finally:
        down.close()
    assert fresh.request_count == 0


def test_developer_messages_and_the_upstream_key(
    redis_url: str, fresh: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = {"upstream_base_url": fresh.base_url, "context_window_tokens": {MODEL: WINDOW}}
    with pytest.raises(ConfigError, match="PROXY_TEST_KEY"):  # named but unset: refused at start-up
        serve_api(redis_url, worker=False, proxy={**proxy, "upstream_api_key_env": "PROXY_TEST_KEY"})
    monkeypatch.setenv("PROXY_TEST_KEY", "sk-upstream")
    with live_api(
        redis_url, worker=False, proxy={**proxy, "upstream_api_key_env": "PROXY_TEST_KEY"}
    ) as keyed:
        monkeypatch.setenv("PROXY_TEST_KEY", "changed")  # read once, at start-up
        conv = conv_id()
        developer = {"role": "developer", "content": "Answer in French."}
        messages: Any = [SYSTEM, {"role": "user", "content": "hi"}, developer]
        fresh.push_text("salut")
        sdk(keyed, conv).chat.completions.create(model=MODEL, messages=messages)
        sent = fresh.requests[-1]["messages"]
        assert sent[:2] == [SYSTEM, developer] and sent[2]["content"] == "hi"  # first, in order
        assert fresh.headers[-1]["authorization"] == "Bearer sk-upstream"
        log = keyed.runtime.log.read_after(ConversationKey("acme", conv), None)
        assert [m.text for m in log] == ["hi", "salut"]  # system and developer never logged


def test_deleting_a_conversation_removes_the_proxy_index(redis_url: str, fresh: OpenAIServer) -> None:
    proxy = {"upstream_base_url": fresh.base_url, "context_window_tokens": {MODEL: WINDOW}}
    with live_api(redis_url, worker=False, proxy=proxy) as api:
        conv = conv_id()
        fresh.push_text("hello")
        sdk(api, conv).chat.completions.create(
            model=MODEL, messages=[SYSTEM, {"role": "user", "content": "hi"}]
        )
        prefix = api.settings.redis.key_prefix
        index = f"{prefix}:{ConversationKey('acme', conv).hash_tag}:proxyidx"
        assert api.runtime.redis.llen(index) == 2
        deleted = httpx.delete(
            f"{api.url}/v1/conversations/{conv}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert deleted.status_code == 204
        assert api.runtime.redis.exists(index) == 0
        # Started again under the same id, the conversation is new.
        fresh.push_text("again")
        sdk(api, conv).chat.completions.create(
            model=MODEL, messages=[SYSTEM, {"role": "user", "content": "new"}]
        )
        assert [m.text for m in api.runtime.log.read_after(ConversationKey("acme", conv), None)] == [
            "new",
            "again",
        ]
