"""Admission before a body is read (workers/admission.py): an append over the message
limit is refused while it streams, a tenant's body bytes per second and requests in flight
are limited in Redis (shared by every API process), and what is refused is never read."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ctxcore.config import Settings, hash_token
from ctxcore.errors import ConfigError
from ctxcore.state import ConversationKey
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = [pytest.mark.redis, pytest.mark.security]

TOKEN = "admission-token-of-acme"
CHUNK = 64 * 1024


@pytest.fixture
def make_runtime(redis_url: str) -> Iterator[Any]:
    prefix = f"ctxcore-test-{uuid.uuid4().hex}"
    made: list[Runtime] = []

    def make(**http: Any) -> Runtime:
        settings = Settings.load(
            {
                "redis": {"url": redis_url, "key_prefix": prefix},
                "http": {"tokens": {hash_token(TOKEN): "acme"}, **http},
            }
        )
        made.append(Runtime(settings))
        return made[-1]

    yield make
    cleaner = redis.Redis.from_url(redis_url)
    delete_prefixed_keys(cleaner, prefix)
    cleaner.close()
    for runtime in made:
        runtime.redis.close()


class Call:
    """One ASGI request sent straight to the app, its body served in ``CHUNK``-byte pieces
    and counted as the app reads them."""

    def __init__(
        self,
        path: str,
        body: bytes,
        *,
        content_length: bool = True,
        hold: asyncio.Event | None = None,
        chunk: int = CHUNK,
    ):
        self.path, self.body, self.hold = path, body, hold
        self.chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
        self.read = 0  # bytes the app took
        self.status = 0
        self.headers: dict[str, str] = {}
        self.response = b""
        headers = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-type", b"application/json")]
        if content_length:
            headers.append((b"content-length", str(len(body)).encode()))
        else:
            headers.append((b"transfer-encoding", b"chunked"))
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 1234),
            "server": ("127.0.0.1", 80),
            "scheme": "http",
        }

    async def run(self, app: Any) -> Call:
        sent = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if self.hold is not None:
                await self.hold.wait()
            if sent >= len(self.chunks):
                await asyncio.sleep(3600)  # the client waits for the answer
            chunk = self.chunks[sent]
            sent += 1
            self.read += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": sent < len(self.chunks)}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                self.headers = {k.decode(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body":
                self.response += message.get("body", b"")

        await app(self.scope, receive, send)
        return self

    def json(self) -> Any:
        return json.loads(self.response)


def append_body(count: int, text: str = "x") -> bytes:
    return json.dumps(
        {"messages": [{"role": "user", "content": f"{text}{i}"} for i in range(count)]}
    ).encode()


def test_an_append_of_100000_messages_is_refused_before_it_is_read_whole(make_runtime: Any) -> None:
    runtime = make_runtime()
    app = create_app(runtime, InlineQueue())
    body = append_body(100_000)  # 3.4 MB, under the 4 MiB body limit
    assert 3_000_000 < len(body) < runtime.settings.http.max_body_bytes
    call = asyncio.run(Call("/v1/conversations/c1/messages", body).run(app))
    assert call.status == 422, call.response
    assert call.json() == {
        "error": "invalid_message",
        "detail": "at most 1000 messages per append",
        "index": -1,
        "field": "messages",
        "location": "messages",
    }
    assert call.read <= 2 * CHUNK, f"read {call.read} of {len(body)} bytes"
    assert runtime.log.last_id(ConversationKey("acme", "c1")) is None  # nothing appended


def test_the_count_stops_within_16_kib_of_the_limit_however_large_a_chunk(
    make_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn hands over up to 256 KiB at once (~6,900 of these messages): the count is
    fed 16 KiB at a time and stops once over the limit, not at the end of the chunk."""
    import workers.admission as admission

    parsed = 0
    real = admission.ijson.parse_coro

    class Fed:
        def __init__(self, target: Any) -> None:
            self.inner = real(target)

        def send(self, data: bytes) -> None:
            nonlocal parsed
            parsed += len(data)
            self.inner.send(data)

    monkeypatch.setattr(admission.ijson, "parse_coro", Fed)
    runtime = make_runtime()
    body = append_body(100_000)
    call = asyncio.run(
        Call("/v1/conversations/c1/messages", body, chunk=256 * 1024).run(create_app(runtime, InlineQueue()))
    )
    assert call.status == 422, call.response
    over_the_limit = len(append_body(1001)) + 16 * 1024
    assert parsed <= over_the_limit, f"counted {parsed} bytes of a {call.read}-byte chunk"


def test_an_append_of_exactly_the_limit_is_read_and_appended(make_runtime: Any) -> None:
    runtime = make_runtime()
    body = append_body(1000, "y" * 100)
    call = asyncio.run(Call("/v1/conversations/c1/messages", body).run(create_app(runtime, InlineQueue())))
    assert call.status == 201, call.response
    assert call.read == len(body)
    assert len(call.json()["ids"]) == 1000


def test_a_streamed_body_without_content_length_is_counted_too(make_runtime: Any) -> None:
    runtime = make_runtime()
    body = append_body(5000)
    call = asyncio.run(
        Call("/v1/conversations/c1/messages", body, content_length=False).run(
            create_app(runtime, InlineQueue())
        )
    )
    assert call.status == 422 and call.read < len(body)


def test_a_tenants_byte_rate_refuses_before_reading_and_is_shared_by_every_process(make_runtime: Any) -> None:
    limits = {"max_body_bytes": 20_000, "bytes_per_second": 1000.0}
    one, other = make_runtime(**limits), make_runtime(**limits)  # two API processes, one Redis
    body = append_body(400)  # about 15 KB
    assert 10_000 < len(body) <= 20_000
    other_app = create_app(other, InlineQueue())
    started = time.monotonic()
    first = asyncio.run(Call("/v1/conversations/c1/messages", body).run(create_app(one, InlineQueue())))
    assert first.status == 201, first.response
    # The bucket (20,000 bytes) has 20,000 - L left: the next L bytes wait (2L - 20,000) / 1,000 s
    # (about 9.4 s), on either process, less what refilled between the two (a loaded machine
    # took 1.4 s once).
    second = asyncio.run(Call("/v1/conversations/c2/messages", body).run(other_app))
    elapsed = time.monotonic() - started
    assert second.status == 429, second.response
    assert second.json()["limit"] == "bytes" and second.json()["error"] == "rate_limited"
    assert "more than 1000 request body bytes per second" in second.json()["detail"]
    wait = (2 * len(body) - 20_000) / 1000
    assert wait - elapsed - 1 <= int(second.headers["retry-after"]) <= wait + 1
    assert second.read == 0  # refused before a byte of the body was read
    assert other.log.last_id(ConversationKey("acme", "c2")) is None


def test_a_tenants_requests_in_flight_are_limited_across_processes(make_runtime: Any) -> None:
    one, other = make_runtime(max_concurrent_requests=1), make_runtime(max_concurrent_requests=1)
    body = append_body(2)

    async def scenario() -> tuple[Call, Call, Call]:
        release = asyncio.Event()
        held = Call("/v1/conversations/c1/messages", body, hold=release)
        slow = asyncio.create_task(held.run(create_app(one, InlineQueue())))
        await asyncio.sleep(0.5)  # admitted, waiting for its body
        refused = await Call("/v1/conversations/c2/messages", body).run(create_app(other, InlineQueue()))
        release.set()
        await slow
        after = await Call("/v1/conversations/c3/messages", body).run(create_app(other, InlineQueue()))
        return held, refused, after

    held, refused, after = asyncio.run(scenario())
    assert held.status == 201, held.response
    assert refused.status == 429 and refused.json()["limit"] == "concurrent", refused.response
    assert refused.headers["retry-after"] == "1" and refused.read == 0
    assert after.status == 201, after.response  # the place was given back


@pytest.mark.parametrize("where", ["http", "tenant"])
def test_a_byte_rate_of_0_is_refused(where: str) -> None:
    data: dict[str, Any] = (
        {"http": {"bytes_per_second": 0}}
        if where == "http"
        else {"tenants": {"acme": {"bytes_per_second": 0}}}
    )
    with pytest.raises(ConfigError, match="use the request rate limit, not a byte rate of 0"):
        Settings.load(data)
