"""``CtxcoreClient`` / ``AsyncCtxcoreClient`` against the real app (uvicorn on a loopback port)
and a real Celery worker; retries against a real 429 and a real 503."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessage

from ctxcore.client import AsyncCtxcoreClient, CtxcoreClient
from ctxcore.client import models as api_models
from ctxcore.client.errors import parse_retry_after
from ctxcore.errors import (
    AuthenticationError,
    ConflictError,
    InvalidKeyError,
    InvalidMessageError,
    NotFoundError,
    RateLimited,
    RecallDisabled,
    TruncateRefused,
)
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage, from_openai
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state import ConversationKey
from ctxcore.window import check_window
from tests.chaos.processes import RedisProcess
from tests.datasets import swe_runs
from tests.live_server import SLOW_TOKEN, TOKEN, LiveApi, live_api, serve_api

pytestmark = pytest.mark.redis


class Counting(httpx.HTTPTransport):
    """A real transport that counts requests and can drop the first response after it landed."""

    def __init__(self, *, drop_first: bool = False) -> None:
        super().__init__()
        self.requests = 0
        self.drop_first = drop_first

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        response = super().handle_request(request)
        if self.drop_first and self.requests == 1:
            response.read()
            response.close()
            raise httpx.ReadError("connection dropped after the server answered", request=request)
        return response


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[LiveApi]:
    """The app with a Celery worker, for the whole module (keys deleted afterwards)."""
    api = serve_api(redis_url, worker=True)
    try:
        yield api
    finally:
        api.close()


def _swe_messages(limit: int) -> list[dict[str, Any]]:
    run = next(iter(swe_runs()))
    return [m for m in run["messages"] if m["role"] != "system"][:limit]


def _wait_compacted(client: CtxcoreClient, conv: str, timeout: float = 60) -> api_models.StateResponse:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.state(conv)
        if state.version >= 1:
            return state
        time.sleep(0.2)
    raise AssertionError(f"{conv} was not compacted in {timeout}s")


def test_every_method_of_the_sync_client(live: LiveApi) -> None:
    conv = f"c-{uuid.uuid4().hex[:8]}"
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    with CtxcoreClient(live.url, TOKEN) as client:
        # Inputs: OpenAI dicts, ctxcore messages and OpenAI SDK objects
        first = client.append(conv, _swe_messages(40))
        assert first.ids[0] == "000000000001" and first.last_id == first.ids[-1]
        sdk = client.append(
            conv, [UserMessage(content="go on"), ChatCompletionMessage(role="assistant", content="ok")]
        )
        assert sdk.ids == ["000000000041", "000000000042"]
        # A window with the tools the budget counted, ready for the OpenAI SDK
        window = client.window(conv, 6000, system="You are terse.", tools=tools, format="openai")
        assert window.tools == tools and window.messages[0] == {"role": "system", "content": "You are terse."}
        assert window.openai_messages() == window.messages
        assert check_window(from_openai(window.messages)) == []
        assert all(
            set(m) <= {"role", "content", "name", "tool_calls", "tool_call_id"} for m in window.messages
        )
        full = client.window(conv, 6000, tools=tools)
        assert full.messages[0]["context_message_id"] == "000000000001"
        assert all("context_message_id" not in m for m in full.openai_messages())
        # Over its trigger: the worker compacts it
        assert client.compact(conv).status in ("queued", "running", "idle")
        state = _wait_compacted(client, conv)
        assert state.blocks and state.covered_until is not None
        assert state.compaction_detail.last_error is None
        assert client.state(conv, history=True).history
        # An offloaded tool result can be read back
        handle = next(
            h for m in full.messages for h, _, _ in OFFLOAD_MARKER_RE.findall(str(m.get("content")))
        )
        assert client.offload(conv, handle)[0].role == "tool"
        with pytest.raises(NotFoundError) as missing:
            client.offload(conv, "0" * 16)
        assert missing.value.status == 404 and missing.value.code == "not_found"
        # The raw log, paged; the tenant's conversations, paged
        logged = list(client.messages(conv, page_size=7))
        assert [m.context_message_id for m in logged] == [f"{i:012d}" for i in range(1, 43)]
        other = f"d-{uuid.uuid4().hex[:8]}"
        client.append(other, [UserMessage(content="hello")])
        assert {conv, other} <= set(client.conversations(page_size=1))
        assert client.usage().tenant == "acme"
        # Truncation: the uncovered tail only
        cut = client.truncate_after(conv, "000000000041", if_match="000000000042")
        assert cut.removed == ["000000000042"] and cut.last_id == "000000000041"
        with pytest.raises(TruncateRefused) as refused:
            client.truncate_after(conv, "000000000001")
        assert refused.value.reason == "covered" and refused.value.status == 409
        # If-Match appends: a stale expectation is a conflict naming the real end
        with pytest.raises(ConflictError) as conflict:
            client.append(conv, [UserMessage(content="late")], if_match="000000000042")
        assert conflict.value.last_id == "000000000041"
        assert client.append(conv, [UserMessage(content="next")], if_match="000000000041").ids == [
            "000000000043"
        ]
        client.delete(other)
        with pytest.raises(NotFoundError):
            client.state(other)
        # Bad input fails before any request
        with pytest.raises(InvalidKeyError):
            client.append("no/such id", [UserMessage(content="x")])
        with pytest.raises(InvalidMessageError) as bad:
            client.append(conv, [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}])
        assert bad.value.index == 1 and bad.value.status is None


def test_every_method_of_the_async_client(live: LiveApi) -> None:
    conv = f"a-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        async with AsyncCtxcoreClient(live.url, TOKEN) as client:
            calls = [ToolCall(id="c1", name="ls")]
            ids = (
                await client.append(
                    conv,
                    [
                        UserMessage(content="list files"),
                        AssistantMessage(content="", tool_calls=calls),
                        ToolMessage(tool_call_id="c1", content="a b"),
                    ],
                )
            ).ids
            window = await client.window(conv, 2000, format="openai")
            assert [m["role"] for m in window.messages] == ["user", "assistant", "tool"]
            assert (await client.compact(conv)).status in ("idle", "queued", "running")
            assert (await client.state(conv)).version >= 0
            assert [m.context_message_id async for m in client.messages(conv)] == ids
            assert conv in [c async for c in client.conversations()]
            assert (await client.usage()).tenant == "acme"
            assert (await client.truncate_after(conv, ids[0])).removed == ids[1:]
            with pytest.raises(NotFoundError):
                await client.offload(conv, "f" * 16)
            await client.delete(conv)
            with pytest.raises(NotFoundError):
                await client.window(conv, 2000)

    asyncio.run(run())


def test_the_clients_recall_answers_the_windows_recall_tool(redis_url: str, live: LiveApi) -> None:
    conv = f"r-{uuid.uuid4().hex[:8]}"
    with CtxcoreClient(live.url, TOKEN) as client:
        client.append(conv, [UserMessage(content="hello")])
        with pytest.raises(RecallDisabled) as off:
            client.recall(conv, "hello")
        assert off.value.status == 409 and off.value.setting == "recall.enabled"
    api = serve_api(redis_url, worker=False, recall={"enabled": True})
    try:
        run = next(iter(swe_runs()))
        messages = [m for m in run["messages"] if m["role"] != "system"]
        with CtxcoreClient(api.url, TOKEN) as client:
            client.append(conv, messages)
            window = client.window(conv, 6000)  # the budget is known from here on
            assert [t["function"]["name"] for t in window.tools] == ["recall_compressed_context"]
            # Compacted as a worker would (this app's queue only records requests): archived.
            key = ConversationKey("acme", conv)
            for _ in range(16):
                if (stage := api.runtime.coordinator.plan(key)) is None:
                    break
                api.runtime.coordinator.run_stage(key, stage)
            assert client.state(conv).version >= 1
            # An early tool output (folded by the first compaction): its own words find it.
            at = next(
                i for i, m in enumerate(messages) if m["role"] == "tool" and len(str(m["content"])) > 400
            )
            log_id = f"{at + 1:012d}"
            words = " ".join(str(messages[at]["content"]).split()[:40])
            answer = client.recall(conv, words, max_tokens=1500)
            assert answer.hits and sum(h.tokens for h in answer.hits) <= 1500
            assert any(h.first_id <= log_id <= h.last_id for h in answer.hits)
            async_answer = asyncio.run(_async_recall(api.url, conv))
            assert async_answer.archived_chunks == answer.archived_chunks
            with pytest.raises(InvalidMessageError):
                client.recall(conv, "")
    finally:
        api.close()


async def _async_recall(url: str, conv: str) -> api_models.RecallResponse:
    async with AsyncCtxcoreClient(url, TOKEN) as client:
        return await client.recall(conv, "no such words anywhere zzzqqq")


def test_models_match_the_published_openapi(live: LiveApi) -> None:
    doc = httpx.get(f"{live.url}/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for name in api_models.__all__:
        model = getattr(api_models, name)
        if not isinstance(model, type):
            continue
        mine = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="serialization")
        served = schemas.get(name) or schemas.get(f"{name}-Output") or schemas.get(f"{name}-Input")
        assert served is not None, f"{name} is not in /openapi.json"
        assert set(mine.get("properties", {})) == set(served.get("properties", {})), name
        assert set(mine.get("required", [])) == set(served.get("required", [])), name
    window = doc["paths"]["/v1/conversations/{conversation_id}/window"]["post"]
    assert any(p["name"] == "format" for p in window["parameters"])
    assert "delete" in doc["paths"]["/v1/conversations/{conversation_id}/messages"]


def test_a_wrong_token_raises_after_one_request(live: LiveApi) -> None:
    transport = Counting()
    with (
        CtxcoreClient(live.url, "not-a-token", transport=transport) as client,
        pytest.raises(AuthenticationError) as info,
    ):
        client.usage()
    assert transport.requests == 1 and info.value.status == 401 and info.value.code == "unauthorized"


def test_a_dropped_connection_after_the_append_landed_gets_the_same_ids(live: LiveApi) -> None:
    conv = f"r-{uuid.uuid4().hex[:8]}"
    with CtxcoreClient(live.url, TOKEN) as plain:
        plain.append(conv, [UserMessage(content="task")])
    for conditional in (False, True):
        with CtxcoreClient(live.url, TOKEN) as plain:
            if_match = list(plain.messages(conv))[-1].context_message_id if conditional else None
        transport = Counting(drop_first=True)
        with CtxcoreClient(live.url, TOKEN, transport=transport) as client:
            ids = client.append(conv, [AssistantMessage(content=f"reply {if_match}")], if_match=if_match).ids
        assert transport.requests == 2
        with CtxcoreClient(live.url, TOKEN) as plain:
            logged = list(plain.messages(conv))
        # Logged once, and the retry answered with the id the first attempt got
        assert [m.text for m in logged].count(f"reply {if_match}") == 1
        assert ids == [logged[-1].context_message_id]


def test_retries_a_real_429_of_a_tenant_held_to_one_request_per_second(redis_url: str) -> None:
    with live_api(redis_url, worker=False, http={"burst": 2}) as api:
        with CtxcoreClient(api.url, SLOW_TOKEN, max_retries=0) as hasty, pytest.raises(RateLimited) as info:
            for _ in range(5):
                hasty.usage()
        assert info.value.status == 429 and info.value.retry_after is not None and info.value.retry_after >= 1
        transport = Counting()
        with CtxcoreClient(api.url, SLOW_TOKEN, transport=transport) as patient:
            started = time.monotonic()
            assert patient.usage().tenant == "slow"
            assert transport.requests >= 2 and time.monotonic() - started >= 0.5


def test_retries_a_real_503_while_its_redis_server_restarts(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis", durable=False)
    server.start()
    api = serve_api(server.url, worker=False, clean=False)
    try:
        with CtxcoreClient(api.url, TOKEN, max_retries=8, max_retry_wait=2) as client:
            client.append("c1", [UserMessage(content="before")])
            server.kill()
            restart = threading.Timer(1.5, server.start)
            restart.start()
            transport = Counting()
            with CtxcoreClient(
                api.url, TOKEN, max_retries=8, max_retry_wait=2, transport=transport
            ) as retrying:
                assert retrying.append("c1", [UserMessage(content="after")]).ids
            restart.join()
            assert transport.requests >= 2  # at least one 503 before the server was back
    finally:
        api.close()
        server.kill()


# --- retry rules on a scripted transport (no server needed) --------------------------------


def _scripted(responses: list[httpx.Response]) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses[min(len(seen), len(responses)) - 1]

    return httpx.MockTransport(handler), seen


def test_429_forever_raises_after_max_retries_with_bounded_waits() -> None:
    transport, seen = _scripted([httpx.Response(429, json={"error": "rate_limited", "detail": "slow down"})])
    client = CtxcoreClient("http://ctxcore.test", TOKEN, max_retries=3, max_retry_wait=0.2)
    client._http = httpx.Client(base_url="http://ctxcore.test", transport=transport)
    started = time.monotonic()
    with pytest.raises(RateLimited) as info:
        client.usage()
    assert len(seen) == 4 and time.monotonic() - started < 0.2 * 3 + 0.5
    assert info.value.status == 429 and info.value.code == "rate_limited"


def test_a_retry_after_beyond_the_maximum_raises_at_once() -> None:
    for value in ("3600", formatdate(time.time() + 3600, usegmt=True)):
        transport, seen = _scripted(
            [
                httpx.Response(
                    429, json={"error": "rate_limited", "detail": "x"}, headers={"Retry-After": value}
                )
            ]
        )
        client = CtxcoreClient("http://ctxcore.test", TOKEN)
        client._http = httpx.Client(base_url="http://ctxcore.test", transport=transport)
        with pytest.raises(RateLimited) as info:
            client.usage()
        assert len(seen) == 1 and info.value.retry_after is not None and info.value.retry_after > 3000
    assert parse_retry_after("2") == 2.0 and parse_retry_after("soon") is None
    assert parse_retry_after(formatdate(1000.0, usegmt=True), now=998.0) == 2.0
