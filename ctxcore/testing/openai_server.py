"""A real local HTTP server that speaks the OpenAI chat-completions API, with scripted faults.

Tests and benchmarks drive ``OpenAIChatModel`` (and through it the official ``openai``
client) over a real socket against this server, so status codes, headers, bodies and
timeouts are exercised exactly as a provider would produce them. Standard library only.

    with OpenAIServer() as server:
        server.push_fault("rate_limit", retry_after=2)
        server.push_text("summary")
        model = OpenAIChatModel(server.base_url)

Run ``python -m ctxcore.testing.openai_server --port 8099 --delay 0.2`` for a standalone
endpoint (benchmarks, manual runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ctxcore.errors import ConfigError, UsageError
from ctxcore.testing.openai_replies import (
    FAULT_KINDS,
    Reply,
    Responder,
    completion_body,
    echo_summary,
    error_body,
    fault_reply,
    stream_events,
)

__all__ = ["FAULT_KINDS", "OpenAIServer", "echo_summary", "main"]

logger = logging.getLogger(__name__)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without NODELAY, Nagle plus delayed
        # ACKs add ~40 ms to every keep-alive request and distort benchmark figures.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("openai test server: " + format, *args)

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-request-id", f"req_{self.server.owner.request_count:06d}")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, events: list[bytes], reply: Reply) -> None:
        """Server-sent events in chunked encoding; ``cut_after`` closes mid-way, unterminated."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-request-id", f"req_{self.server.owner.request_count:06d}")
        self.end_headers()
        for n, event in enumerate(events):
            if reply.cut_after is not None and n >= reply.cut_after:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            owner = self.server.owner
            body = {"object": "list", "data": [{"id": owner.model, "object": "model", "owned_by": "ctxcore"}]}
            self._send(200, json.dumps(body).encode())
        else:
            self._send(404, error_body(f"no route {self.path}", "invalid_request_error", "not_found"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/chat/completions":
            self._send(404, error_body(f"no route {self.path}", "invalid_request_error", "not_found"))
            return
        try:
            request = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, error_body("request body is not JSON", "invalid_request_error", None))
            return
        if not isinstance(request, dict):
            self._send(400, error_body("request body must be an object", "invalid_request_error", None))
            return
        owner = self.server.owner
        reply = owner._next_reply(request, {k.lower(): v for k, v in self.headers.items()})
        if reply.delay > 0 and owner._closing.wait(reply.delay):
            return
        try:
            if reply.disconnect:
                self.close_connection = True
                return
            if reply.body is not None:
                self._send(reply.status, reply.body, reply.headers)
                return
            number = owner.request_count
            if request.get("stream") is True:
                self._stream(stream_events(request, reply, owner.responder, number, owner.model), reply)
                return
            body = completion_body(request, reply, owner.responder, number, owner.model)
            self._send(reply.status, body, reply.headers)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (its timeout fired); nothing to answer.
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: OpenAIServer


class OpenAIServer:
    """A local OpenAI-compatible endpoint on 127.0.0.1 with a FIFO script of replies.

    Each ``POST /v1/chat/completions`` takes the next scripted reply (``push_text`` /
    ``push_fault``); when the script is empty it answers with ``responder(request_json)``
    (default: a short echo summary). ``delay`` is added to every reply. ``requests`` holds
    the received request bodies in arrival order. Use as a context manager, or call
    ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        delay: float = 0.0,
        responder: Responder | None = None,
        model: str = "ctxcore-test-model",
        timeout_delay: float = 5.0,
    ) -> None:
        self.model = model
        self.delay = delay
        self.responder: Responder = responder or echo_summary
        self.timeout_delay = timeout_delay
        self._port = port
        # Another loopback-only address (a veth end of a test's own namespace) may be given.
        self.host = host
        self._lock = threading.Lock()
        self._script: deque[Reply] = deque()
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> OpenAIServer:
        """Bind a port (a free one unless ``port`` was given) and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._closing.clear()
        server = _Server((self.host, self._port), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="openai-test-server",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; handlers still sleeping in a delay are woken and answer nothing."""
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port."""
        if self._server is None:
            raise UsageError("the server is not running; call start() or use it in a with block")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to give a client, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    # --- script ------------------------------------------------------------------------

    def push_text(self, text: str, usage: Mapping[str, int] | None = None, *, delay: float = 0.0) -> None:
        """Queue a successful completion with ``text`` (and explicit ``usage`` fields if given)."""
        self._push(Reply(text=text, usage=usage, delay=delay))

    def push_reply(
        self,
        content: str | None = None,
        tool_calls: list[Mapping[str, Any]] | None = None,
        *,
        delay: float = 0.0,
    ) -> None:
        """Queue an assistant message: ``content`` and OpenAI-shaped ``tool_calls``
        (``{"id", "type": "function", "function": {"name", "arguments"}}``); streamed when
        the request asks for ``stream``."""
        message: dict[str, Any] = {"content": content}
        if tool_calls:
            message["tool_calls"] = [dict(c) for c in tool_calls]
        self._push(Reply(message=message, delay=delay))

    def push_fault(
        self,
        kind: str,
        *,
        delay: float | None = None,
        retry_after: float | str = 1,
        message: str | None = None,
        block_ids: tuple[str, ...] = ("not-a-requested-block",),
    ) -> None:
        """Queue a fault; ``kind`` is one of ``FAULT_KINDS``.

        ``rate_limit`` is a 429 with ``Retry-After: retry_after``; ``server_error`` 500;
        ``unavailable`` 503; ``too_large`` 413; ``overflow`` a 400 with OpenAI's
        ``context_length_exceeded`` body; ``auth`` 401; ``bad_request`` a 400 whose text
        carries a request id with "500" in it; ``timeout`` answers only after ``delay``
        seconds (default ``timeout_delay``); ``invalid_json`` a 200 with a non-JSON body;
        ``empty`` a 200 with empty content; ``wrong_block_ids`` a 200 whose blocks JSON
        names ``block_ids``; ``disconnect`` closes the connection without an answer;
        ``stream_cut`` (streamed) sends two events, then closes without ending the stream.
        """
        if kind not in FAULT_KINDS:
            raise ConfigError(f"unknown fault {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        self._push(fault_reply(kind, delay, retry_after, message, block_ids, self.timeout_delay))

    def push_response(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        """Queue a raw answer: ``status``, ``body`` as given and ``headers`` (an upstream's
        own error page, say, or headers a proxy must not relay)."""
        self._push(Reply(status=status, body=body, headers=dict(headers or {})))

    def _push(self, reply: Reply) -> None:
        with self._lock:
            self._script.append(reply)

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed."""
        with self._lock:
            return len(self._script)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of the request bodies received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def headers(self) -> list[dict[str, str]]:
        """The request headers (lower-cased names), parallel to ``requests``."""
        with self._lock:
            return list(self._headers)

    @property
    def request_count(self) -> int:
        """How many chat-completion requests arrived."""
        with self._lock:
            return len(self._requests)

    def reset(self) -> None:
        """Forget the script and the recorded requests."""
        with self._lock:
            self._script.clear()
            self._requests.clear()
            self._headers.clear()

    # --- serving -----------------------------------------------------------------------

    def _next_reply(self, request: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            self._requests.append(request)
            self._headers.append(headers)
            scripted = self._script.popleft() if self._script else None
        reply = scripted or Reply(text=None)
        if self.delay > 0:
            reply = dataclasses.replace(reply, delay=reply.delay + self.delay)
        return reply


def main(argv: list[str] | None = None) -> None:
    """Serve until interrupted: ``python -m ctxcore.testing.openai_server --port N --delay S``."""
    parser = argparse.ArgumentParser(
        description="A local OpenAI-compatible chat endpoint for tests and benchmarks."
    )
    parser.add_argument("--port", type=int, default=8099, help="port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to every reply")
    parser.add_argument("--model", default="ctxcore-test-model", help="model name reported by /v1/models")
    args = parser.parse_args(argv)
    server = OpenAIServer(port=args.port, delay=args.delay, model=args.model).start()
    print(f"serving an OpenAI-compatible API at {server.base_url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
