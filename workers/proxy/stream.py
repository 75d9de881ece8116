"""Server-sent chat-completion chunks: assembling a relayed stream's reply, and replaying a
logged reply as a completion or a stream."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReplyAssembler", "replay_chunks", "replay_completion", "sse"]


def sse(payload: Mapping[str, Any] | str) -> bytes:
    """One ``data:`` event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""
    type: str = "function"


@dataclass
class ReplyAssembler:
    """Reads a relayed SSE stream chunk by chunk (events may straddle chunks) and assembles
    the assistant reply: content pieces and tool calls by their delta ``index``.

    ``complete`` once ``[DONE]`` came after a ``finish_reason``: only then is the reply whole.
    """

    content: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    done: bool = False
    errored: bool = False
    # Characters of the reply so far (content, names and arguments): what its log entry would hold.
    chars: int = 0
    _buffer: bytes = b""

    @property
    def complete(self) -> bool:
        """True when the stream ended with ``[DONE]`` after a finish reason."""
        return self.done and self.finish_reason is not None and not self.errored

    def feed(self, chunk: bytes) -> bool:
        """Take one raw chunk; True when it holds the ``[DONE]`` event."""
        self._buffer += chunk
        saw_done = False
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            text = line.strip().decode("utf-8", errors="replace")
            if not text.startswith("data:"):
                continue
            data = text[5:].strip()
            if data == "[DONE]":
                self.done = saw_done = True
            elif data:
                self._event(data)
        return saw_done

    def _event(self, data: str) -> None:
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            self.errored = True
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.errored = True
            return
        try:
            shaped = self._choices(event)
        except (TypeError, ValueError):
            shaped = False
        # Not OpenAI's chunk shape: relayed as it came, never logged as a reply.
        self.errored = self.errored or not shaped

    def _choices(self, event: dict[str, Any]) -> bool:
        # The chunk is untrusted JSON: False at the first object that is not one.
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                return False
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
                self.chars += len(delta["content"])
            for raw in delta.get("tool_calls") or []:
                function = raw.get("function") or {} if isinstance(raw, dict) else None
                if not isinstance(function, dict):
                    return False
                call = self.calls.setdefault(int(raw.get("index", 0)), _Call())
                call.id = raw.get("id") or call.id
                call.type = raw.get("type") or call.type
                call.name = function.get("name") or call.name
                call.arguments += function.get("arguments") or ""
                self.chars += len(function.get("arguments") or "")
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return True

    def message(self) -> dict[str, Any]:
        """The assembled reply as an OpenAI assistant message."""
        out: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.calls:
            out["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.name, "arguments": c.arguments}}
                for _, c in sorted(self.calls.items())
            ]
        return out


def _finish(message: Mapping[str, Any]) -> str:
    return "tool_calls" if message.get("tool_calls") else "stop"


def replay_completion(message: Mapping[str, Any], model: str, reply_id: str) -> dict[str, Any]:
    """A ``chat.completion`` body answering with a logged reply (no usage: nothing was spent)."""
    return {
        "id": f"chatcmpl-{reply_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": dict(message), "finish_reason": _finish(message), "logprobs": None}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def replay_chunks(message: Mapping[str, Any], model: str, reply_id: str, include_usage: bool) -> list[bytes]:
    """A logged reply as ``chat.completion.chunk`` events, then ``[DONE]``."""
    head = {
        "id": f"chatcmpl-{reply_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return sse({**head, "choices": [choice]})

    out = [chunk({"role": "assistant", "content": message.get("content") or ""})]
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, _finish(message)))
    if include_usage:
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        out.append(sse({**head, "choices": [], "usage": usage}))
    out.append(sse("[DONE]"))
    return out
