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
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

__all__ = ["FAULT_KINDS", "OpenAIServer", "main"]

logger = logging.getLogger(__name__)

FAULT_KINDS: Final = frozenset(
    {
        "rate_limit",
        "server_error",
        "unavailable",
        "too_large",
        "overflow",
        "auth",
        "bad_request",
        "timeout",
        "invalid_json",
        "empty",
        "wrong_block_ids",
        "disconnect",
    }
)

Responder = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class _Reply:
    """One scripted answer: an HTTP status, headers and a body (or a completion text)."""

    status: int = 200
    text: str | None = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    usage: Mapping[str, int] | None = None
    delay: float = 0.0
    disconnect: bool = False


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


def _last_user_text(request: Mapping[str, Any]) -> str:
    for message in reversed(request.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def echo_summary(request: dict[str, Any]) -> str:
    """The default responder: a short, deterministic summary of the last user message."""
    words = _last_user_text(request).split()
    head = " ".join(words[:40])
    return f"Summary of {len(words)} words: {head}" if words else "Summary: (nothing to summarise)"


def _estimate_tokens(text: str) -> int:
    # The server only reports usage; len/4 is enough and keeps benchmarks cheap.
    return max(len(text) // 4, 1) if text else 0


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

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            owner = self.server.owner
            body = {"object": "list", "data": [{"id": owner.model, "object": "model", "owned_by": "ctxcore"}]}
            self._send(200, json.dumps(body).encode())
        else:
            self._send(404, _error_body(f"no route {self.path}", "invalid_request_error", "not_found"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/chat/completions":
            self._send(404, _error_body(f"no route {self.path}", "invalid_request_error", "not_found"))
            return
        try:
            request = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, _error_body("request body is not JSON", "invalid_request_error", None))
            return
        if not isinstance(request, dict):
            self._send(400, _error_body("request body must be an object", "invalid_request_error", None))
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
            self._send(reply.status, owner._completion_body(request, reply), reply.headers)
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
        self._script: deque[_Reply] = deque()
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
            raise RuntimeError("the server is not running; call start() or use it in a with block")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to give a client, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    # --- script ------------------------------------------------------------------------

    def push_text(self, text: str, usage: Mapping[str, int] | None = None, *, delay: float = 0.0) -> None:
        """Queue a successful completion with ``text`` (and explicit ``usage`` fields if given)."""
        self._push(_Reply(text=text, usage=usage, delay=delay))

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
        names ``block_ids``; ``disconnect`` closes the connection without an answer.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        self._push(self._fault(kind, delay, retry_after, message, block_ids))

    def _fault(
        self,
        kind: str,
        delay: float | None,
        retry_after: float | str,
        message: str | None,
        block_ids: tuple[str, ...],
    ) -> _Reply:
        wait = delay or 0.0
        if kind == "rate_limit":
            body = _error_body(
                message or "Rate limit reached for requests per minute. Please try again later.",
                "requests",
                "rate_limit_exceeded",
            )
            return _Reply(429, body=body, headers={"Retry-After": str(retry_after)}, delay=wait)
        if kind == "server_error":
            text = message or "The server had an error while processing your request."
            return _Reply(500, body=_error_body(text, "server_error", None), delay=wait)
        if kind == "unavailable":
            text = message or "The engine is currently overloaded, please try again later."
            return _Reply(503, body=_error_body(text, "server_error", None), delay=wait)
        if kind == "too_large":
            text = message or "Request entity too large."
            return _Reply(413, body=_error_body(text, "invalid_request_error", None), delay=wait)
        if kind == "overflow":
            text = message or (
                "This model's maximum context length is 8192 tokens. However, your messages "
                "resulted in 9100 tokens. Please reduce the length of the messages."
            )
            body = _error_body(text, "invalid_request_error", "context_length_exceeded", "messages")
            return _Reply(400, body=body, delay=wait)
        if kind == "auth":
            text = (
                message or "Incorrect API key provided. You can find your API key in your account settings."
            )
            return _Reply(401, body=_error_body(text, "invalid_request_error", "invalid_api_key"), delay=wait)
        if kind == "bad_request":
            # The "500" inside the request id is a trap for substring-based classifiers.
            text = message or "Invalid value for 'temperature': expected a number. (request id req_500abc)"
            body = _error_body(text, "invalid_request_error", None, "temperature")
            return _Reply(400, body=body, headers={"x-request-id": "req_500abc"}, delay=wait)
        if kind == "timeout":
            return _Reply(text="too late", delay=self.timeout_delay if delay is None else delay)
        if kind == "invalid_json":
            return _Reply(200, body=b"<html>this is not JSON {", delay=wait)
        if kind == "empty":
            return _Reply(text="", delay=wait)
        if kind == "wrong_block_ids":
            blocks = [{"block_id": b, "summary": "a summary for a block nobody asked for"} for b in block_ids]
            return _Reply(text=json.dumps({"blocks": blocks}), delay=wait)
        return _Reply(disconnect=True, delay=wait)

    def _push(self, reply: _Reply) -> None:
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

    def _next_reply(self, request: dict[str, Any], headers: dict[str, str]) -> _Reply:
        with self._lock:
            self._requests.append(request)
            self._headers.append(headers)
            scripted = self._script.popleft() if self._script else None
        reply = scripted or _Reply(text=None)
        if self.delay > 0:
            reply = _Reply(
                reply.status,
                reply.text,
                reply.body,
                reply.headers,
                reply.usage,
                reply.delay + self.delay,
                reply.disconnect,
            )
        return reply

    def _completion_body(self, request: dict[str, Any], reply: _Reply) -> bytes:
        text = reply.text if reply.text is not None else self.responder(request)
        prompt_chars = sum(
            len(m.get("content") or "") if isinstance(m.get("content"), str) else len(json.dumps(m))
            for m in request.get("messages") or []
            if isinstance(m, Mapping)
        )
        prompt_tokens = max(prompt_chars // 4, 1)
        completion_tokens = _estimate_tokens(text)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if reply.usage:
            usage.update(reply.usage)
        body = {
            "id": f"chatcmpl-{self.request_count:06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(request.get("model") or self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
        return json.dumps(body).encode()


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
