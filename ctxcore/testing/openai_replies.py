"""The test server's replies: scripted faults, completion bodies and SSE streams.

A sibling of ``openai_server`` (which serves them). Standard library only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["FAULT_KINDS", "Reply", "completion_body", "error_body", "fault_reply", "stream_events"]

Responder = Callable[[dict[str, Any]], str]

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
        "stream_cut",
    }
)


@dataclass(frozen=True)
class Reply:
    """One scripted answer: an HTTP status, headers and a body (or a completion text)."""

    status: int = 200
    text: str | None = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    usage: Mapping[str, int] | None = None
    delay: float = 0.0
    disconnect: bool = False
    # A scripted assistant message (content and/or tool_calls) instead of ``text``.
    message: Mapping[str, Any] | None = None
    # Streamed: close the connection after this many events (no terminating chunk).
    cut_after: int | None = None


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
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


def estimate_tokens(text: str) -> int:
    # The server only reports usage; len/4 is enough and keeps benchmarks cheap.
    return max(len(text) // 4, 1) if text else 0


# Faults that are one error body: status, default message, error type, code and param.
_ERROR_REPLIES: Final[dict[str, tuple[int, str, str, str | None, str | None]]] = {
    "server_error": (
        500,
        "The server had an error while processing your request.",
        "server_error",
        None,
        None,
    ),
    "unavailable": (
        503,
        "The engine is currently overloaded, please try again later.",
        "server_error",
        None,
        None,
    ),
    "too_large": (413, "Request entity too large.", "invalid_request_error", None, None),
    "overflow": (
        400,
        "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9100 tokens. Please reduce the length of the messages.",
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    ),
    "auth": (
        401,
        "Incorrect API key provided. You can find your API key in your account settings.",
        "invalid_request_error",
        "invalid_api_key",
        None,
    ),
}


def fault_reply(
    kind: str,
    delay: float | None,
    retry_after: float | str,
    message: str | None,
    block_ids: tuple[str, ...],
    timeout_delay: float,
) -> Reply:
    wait = delay or 0.0
    if kind == "rate_limit":
        body = error_body(
            message or "Rate limit reached for requests per minute. Please try again later.",
            "requests",
            "rate_limit_exceeded",
        )
        return Reply(429, body=body, headers={"Retry-After": str(retry_after)}, delay=wait)
    if kind in _ERROR_REPLIES:
        status, text, type_, code, param = _ERROR_REPLIES[kind]
        return Reply(status, body=error_body(message or text, type_, code, param), delay=wait)
    if kind == "bad_request":
        # The "500" inside the request id is a trap for substring-based classifiers.
        text = message or "Invalid value for 'temperature': expected a number. (request id req_500abc)"
        body = error_body(text, "invalid_request_error", None, "temperature")
        return Reply(400, body=body, headers={"x-request-id": "req_500abc"}, delay=wait)
    if kind == "timeout":
        return Reply(text="too late", delay=timeout_delay if delay is None else delay)
    if kind == "invalid_json":
        return Reply(200, body=b"<html>this is not JSON {", delay=wait)
    if kind == "empty":
        return Reply(text="", delay=wait)
    if kind == "wrong_block_ids":
        blocks = [{"block_id": b, "summary": "a summary for a block nobody asked for"} for b in block_ids]
        return Reply(text=json.dumps({"blocks": blocks}), delay=wait)
    if kind == "stream_cut":
        return Reply(text=message or "a reply that never ends", cut_after=2, delay=wait)
    return Reply(disconnect=True, delay=wait)


def _usage(request: Mapping[str, Any], text: str, reply: Reply) -> dict[str, int]:
    prompt_chars = sum(
        len(m.get("content") or "") if isinstance(m.get("content"), str) else len(json.dumps(m))
        for m in request.get("messages") or []
        if isinstance(m, Mapping)
    )
    prompt_tokens = max(prompt_chars // 4, 1)
    completion_tokens = estimate_tokens(text)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reply.usage:
        usage.update(reply.usage)
    return usage


def _message(request: dict[str, Any], reply: Reply, responder: Responder) -> dict[str, Any]:
    if reply.message is not None:
        return {"role": "assistant", "content": None, **reply.message}
    text = reply.text if reply.text is not None else responder(request)
    return {"role": "assistant", "content": text}


def _finish(message: Mapping[str, Any]) -> str:
    return "tool_calls" if message.get("tool_calls") else "stop"


def completion_body(
    request: dict[str, Any], reply: Reply, responder: Responder, number: int, model: str
) -> bytes:
    """A ``chat.completion`` body: the scripted message or text, else the responder's text."""
    message = _message(request, reply, responder)
    body = {
        "id": f"chatcmpl-{number:06d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(request.get("model") or model),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(message), "logprobs": None}],
        "usage": _usage(request, json.dumps(message), reply),
    }
    return json.dumps(body).encode()


def _pieces(text: str, size: int = 16) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream_events(
    request: dict[str, Any], reply: Reply, responder: Responder, number: int, model: str
) -> list[bytes]:
    """The reply as SSE ``chat.completion.chunk`` events: the role, the content in pieces,
    each tool call (id and name, then its arguments in pieces), the finish reason, the usage
    when ``stream_options.include_usage`` asks for it, then ``[DONE]``."""
    message = _message(request, reply, responder)
    head = {
        "id": f"chatcmpl-{number:06d}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": str(request.get("model") or model),
    }

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"

    events = [event({"role": "assistant", "content": ""})]
    content = message.get("content")
    if isinstance(content, str) and content:
        events += [event({"content": piece}) for piece in _pieces(content)]
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        start = {"index": i, "id": call["id"], "type": "function"}
        events.append(
            event({"tool_calls": [{**start, "function": {"name": function["name"], "arguments": ""}}]})
        )
        for piece in _pieces(function.get("arguments") or ""):
            events.append(event({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    events.append(event({}, _finish(message)))
    options = request.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        usage = {**head, "choices": [], "usage": _usage(request, json.dumps(message), reply)}
        events.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events
