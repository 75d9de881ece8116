"""Token counting: the ``TokenCounter`` protocol, an exact offline tiktoken counter and an estimator.

Encodings load offline (``token_encodings``); images are priced by their dimensions
(``token_images``); both modules' public names are importable from here too.
Every budget comparison in ctxcore uses ``TiktokenCounter`` unless a caller passes another
counter explicitly: ``len/4`` is off by -60%..+20% depending on the language and content.
"""

from __future__ import annotations

import json
import marshal
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ctxcore.messages import AnyMessage, AssistantMessage, content_text
from ctxcore.token_encodings import UNKNOWN_MODELS, WarnOnce, encoding_for_model, load_encoding
from ctxcore.token_images import image_part_tokens, image_tokens_for_size, is_image

__all__ = [
    "UNKNOWN_MODELS",
    "EstimateCounter",
    "TiktokenCounter",
    "TokenCounter",
    "WarnOnce",
    "encoding_for_model",
    "image_part_tokens",
    "image_tokens_for_size",
    "load_encoding",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text, messages and tool definitions for one model's tokenizer."""

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        ...

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        """Tokens of a list of messages as sent to a chat model (framing included)."""
        ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of OpenAI-style tool definitions."""
        ...


_REPLY_PRIMING = 3


def _tool_calls_json(message: AnyMessage) -> str:
    if not isinstance(message, AssistantMessage) or not message.tool_calls:
        return ""
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    return json.dumps(calls, ensure_ascii=False, separators=(",", ":"))


def _tools_text(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    rendered = []
    for idx, tool in enumerate(tools):
        function = tool.get("function", tool)
        name = function.get("name", "") if isinstance(function, Mapping) else ""
        body = json.dumps(tool, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
        rendered.append(f"<|start|>functions.{name}:{idx}\n{body}<|end|>")
    return rendered


class _LruCache:
    """A small thread-safe LRU map (message key -> token count)."""

    def __init__(self, maxsize: int) -> None:
        self._data: OrderedDict[Any, int] = OrderedDict()
        self._maxsize = maxsize
        self._lock = threading.Lock()

    def get(self, key: Any) -> int | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Any, value: int) -> None:
        with self._lock:
            self._data[key] = value
            if len(self._data) > self._maxsize:
                self._data.popitem(last=False)


class _FramedCounter:
    """Shared per-message framing, image pricing and per-content caching."""

    # What ``count_messages`` adds to the sum of ``count_message`` over a non-empty list:
    # lets a caller that memoises single messages compose a request's count exactly.
    reply_priming: int = _REPLY_PRIMING

    def __init__(self, cache_size: int = 65536, *, image_tokens: int | None = None) -> None:
        self._cache = _LruCache(cache_size)
        # Every image priced alike when set (spec 2.6's override), else by its dimensions.
        self.image_tokens = image_tokens

    def count_text(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def count_message(self, message: AnyMessage) -> int:
        """Tokens of one message without the per-request reply priming."""
        calls = message.tool_calls if isinstance(message, AssistantMessage) else ()
        # Content strings are shared between copies of a message, so their hash is cached
        # by Python and an unchanged message costs one dict lookup, not a re-tokenisation.
        content = message.content
        key = (
            message.role,
            content if not isinstance(content, list) else repr(content),
            tuple((c.id, c.name, c.arguments) for c in calls),
        )
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        images = 0
        if isinstance(content, list):
            images = sum(
                image_part_tokens(p, self.image_tokens)
                for p in content
                if is_image(p) and isinstance(p, Mapping)
            )
            text = content_text([p for p in content if not is_image(p)])
        else:
            text = content_text(content)
        rendered = f"<|start|>{message.role}\n{text}{_tool_calls_json(message)}<|end|>"
        value = self.count_text(rendered) + images
        self._cache.put(key, value)
        return value

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        """Tokens of the messages as one request: framing per message plus reply priming."""
        if not messages:
            return 0
        return sum(self.count_message(m) for m in messages) + _REPLY_PRIMING

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of tool definitions in the ``functions.NAME:IDX`` framing."""
        if not tools:
            return 0
        # Agents send the same definitions with every request. Rendering them to look up
        # each one's count cost a tenth of a window (14 definitions, 9 kB of JSON); their
        # marshal bytes, type-exact (1, 1.0 and True differ, as in the JSON), cost 1/20 of that.
        try:
            key: Any = ("tools", marshal.dumps(list(tools)))
        except ValueError:  # a value marshal cannot write (not plain JSON data): not cached
            return self._count_tools(tools)
        found = self._cache.get(key)
        if found is not None:
            return found
        value = self._count_tools(tools)
        self._cache.put(key, value)
        return value

    def _count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        # Each definition cached by its rendered text too, so a set that changes in one
        # definition re-tokenises only that one.
        total = _REPLY_PRIMING
        for rendered in _tools_text(tools):
            key = ("tool", rendered)
            value = self._cache.get(key)
            if value is None:
                value = self.count_text(rendered)
                self._cache.put(key, value)
            total += value
        return total


class TiktokenCounter(_FramedCounter):
    """Exact counts with the model's tiktoken encoding, loaded offline.

    ``count_text(s) == len(encoding.encode(s, disallowed_special=()))``: text that contains
    special-token strings such as ``<|endoftext|>`` is counted as plain text.
    """

    def __init__(
        self, model: str | None = None, *, cache_size: int = 65536, image_tokens: int | None = None
    ) -> None:
        super().__init__(cache_size, image_tokens=image_tokens)
        self.model = model
        self.encoding_name = encoding_for_model(model)
        self._encoding = load_encoding(self.encoding_name)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` under this counter's encoding."""
        if not text:
            return 0
        return len(self._encoding.encode(text, disallowed_special=()))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings encoded as plain text)."""
        return self._encoding.encode(text, disallowed_special=())

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of token ids."""
        return self._encoding.decode(list(tokens))


class EstimateCounter(_FramedCounter):
    """``len(text) // 4`` with the same sanitisation: only for callers that ask for an estimate."""

    def count_text(self, text: str) -> int:
        """Characters divided by four."""
        return len(text) // 4
