"""The proxy's limits on what the upstream sends back: a streamed reply over the message
limit ends with an OpenAI-shaped error event and ``[DONE]`` and is not logged; a
non-streamed one is refused (502 ``upstream_reply_too_large``) before it is read whole; a
trickling upstream is cut at ``proxy.upstream_deadline``; invalid SSE and a stream cut
mid-way end with an error event and ``[DONE]``, never an exception in the app."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = pytest.mark.redis

TOKEN = "limits-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "limits-model"
MAX_CHARS = 500
REPLY_BYTES = 4 * MAX_CHARS + 64 * 1024


class RawUpstream:
    """A one-route HTTP server on 127.0.0.1 whose answer ``serve(conn)`` writes by hand;
    ``sent`` counts the body bytes it managed to send before the client went away."""

    def __init__(self, serve: Callable[[socket.socket, RawUpstream], None]) -> None:
        self.serve = serve
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            # OSError: the proxy closed the connection, which is what it was meant to do.
            with contextlib.suppress(OSError):
                self.serve(conn, self)

    def close(self) -> None:
        self.listener.close()


def chunked(conn: socket.socket, upstream: RawUpstream, data: bytes) -> None:
    conn.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    upstream.sent += len(data)


def huge_json_reply(conn: socket.socket, upstream: RawUpstream) -> None:
    """A 300 MB completion, chunked (no Content-Length to refuse it by)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    chunked(conn, upstream, b'{"choices":[{"index":0,"message":{"role":"assistant","content":"')
    piece = b"x" * 65536
    while upstream.sent < 300 * 1024 * 1024:
        chunked(conn, upstream, piece)
    chunked(conn, upstream, b'"},"finish_reason":"stop"}]}')
    conn.sendall(b"0\r\n\r\n")


def trickle(conn: socket.socket, upstream: RawUpstream) -> None:
    """One SSE chunk every 0.2 s, for ever."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    event = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
    for _ in range(10_000):
        chunked(conn, upstream, f"data: {json.dumps(event)}\n\n".encode())
        time.sleep(0.2)


def invalid_sse(conn: socket.socket, upstream: RawUpstream) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for line in (
        b'data: {"choices": "nope"}\n\n',
        b'data: {"choices": [{"delta": {"tool_calls": [7]}}]}\n\n',
        b"data: [DONE]\n\n",
    ):
        chunked(conn, upstream, line)
    conn.sendall(b"0\r\n\r\n")


@pytest.fixture()
def make_client(redis_url: str) -> Iterator[Callable[..., tuple[TestClient, Runtime]]]:
    made: list[tuple[TestClient, Runtime]] = []

    def make(base_url: str, **proxy: Any) -> tuple[TestClient, Runtime]:
        settings = Settings.load(
            {
                "redis": {"url": redis_url, "key_prefix": f"limits{uuid.uuid4().hex[:6]}"},
                "http": {"tokens": {hash_token(TOKEN): "acme"}},
                "service": {"max_message_chars": MAX_CHARS},
                "proxy": {"upstream_base_url": base_url, "context_window_tokens": {MODEL: 8000}, **proxy},
            }
        )
        runtime = Runtime(settings)
        client = TestClient(create_app(runtime, InlineQueue()))
        made.append((client, runtime))
        return client, runtime

    yield make
    for client, runtime in made:
        client.close()
        delete_prefixed_keys(runtime.redis, runtime.settings.redis.key_prefix)
        runtime.redis.close()


def ask(client: TestClient, conv: str, stream: bool) -> Any:
    return client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream},
        headers={**AUTH, "X-Ctxcore-Conversation": conv},
    )


def events(text: str) -> list[Any]:
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def logged(runtime: Runtime, conv: str) -> list[str]:
    return [m.role for m in runtime.log.read_after(ConversationKey("acme", conv), None)]


def test_a_streamed_reply_over_the_message_limit_ends_with_an_error_event_and_done(
    make_client: Callable[..., tuple[TestClient, Runtime]],
) -> None:
    with OpenAIServer() as upstream:
        client, runtime = make_client(upstream.base_url)
        upstream.push_text("word " * 400)  # 2,000 characters, streamed in pieces
        r = ask(client, "long-stream", stream=True)
        assert r.status_code == 200
        got = events(r.text)
        assert got[-1] == "[DONE]" and got[-2]["error"]["code"] == "upstream_reply_too_large"
        assert str(MAX_CHARS) in got[-2]["error"]["message"]
        assert logged(runtime, "long-stream") == ["user"]  # the cut reply is not logged
        # Within the limit: relayed and logged.
        upstream.push_text("short reply")
        ok = events(ask(client, "short-stream", stream=True).text)
        assert ok[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in ok)
        assert logged(runtime, "short-stream") == ["user", "assistant"]


def test_a_non_streamed_reply_over_the_limit_is_refused_before_it_is_read_whole(
    make_client: Callable[..., tuple[TestClient, Runtime]],
) -> None:
    upstream = RawUpstream(huge_json_reply)
    try:
        client, runtime = make_client(upstream.base_url)
        r = ask(client, "huge", stream=False)
        assert r.status_code == 502, r.text
        error = r.json()["error"]
        assert error["code"] == "upstream_reply_too_large" and str(REPLY_BYTES) in error["message"]
        time.sleep(0.5)
        # Refused at the bound: the upstream could not push more than socket buffers beyond it.
        assert upstream.sent < REPLY_BYTES + 16 * 1024 * 1024, upstream.sent
        assert logged(runtime, "huge") == ["user"]
    finally:
        upstream.close()
    with OpenAIServer() as declared:
        client, _ = make_client(declared.base_url)
        declared.push_response(
            200, b"{" + b" " * (REPLY_BYTES + 10) + b"}", {"content-type": "application/json"}
        )
        refused = ask(client, "declared", stream=False)
        assert refused.status_code == 502 and refused.json()["error"]["code"] == "upstream_reply_too_large"


@pytest.mark.parametrize("stream", [True, False])
def test_a_trickling_upstream_is_cut_at_the_deadline(
    make_client: Callable[..., tuple[TestClient, Runtime]], stream: bool
) -> None:
    upstream = RawUpstream(trickle)
    try:
        client, runtime = make_client(upstream.base_url, upstream_deadline=1.0, upstream_timeout=5.0)
        started = time.monotonic()
        r = ask(client, f"slow-{stream}", stream=stream)
        assert time.monotonic() - started < 4.0
        if stream:
            got = events(r.text)
            assert got[-1] == "[DONE]" and got[-2]["error"]["code"] == "upstream_timeout"
            assert "proxy.upstream_deadline" in got[-2]["error"]["message"]
        else:
            assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
        assert logged(runtime, f"slow-{stream}") == ["user"]
    finally:
        upstream.close()


def test_invalid_sse_and_a_cut_stream_end_with_an_error_event_and_done(
    make_client: Callable[..., tuple[TestClient, Runtime]],
) -> None:
    upstream = RawUpstream(invalid_sse)
    try:
        client, runtime = make_client(upstream.base_url)
        r = ask(client, "invalid-sse", stream=True)
        assert r.status_code == 200 and events(r.text)[-1] == "[DONE]"
        assert logged(runtime, "invalid-sse") == ["user"]  # not a reply
    finally:
        upstream.close()
    with OpenAIServer() as cut:
        client, runtime = make_client(cut.base_url)
        cut.push_fault("stream_cut")
        got = events(ask(client, "cut", stream=True).text)
        assert got[-1] == "[DONE]" and got[-2]["error"]["code"] == "upstream_stream_cut"
        assert logged(runtime, "cut") == ["user"]
