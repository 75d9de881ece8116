"""Token counting: the ``TokenCounter`` protocol, an exact offline tiktoken counter and an estimator.

Encodings load offline (``token_encodings``); images are priced by their dimensions
(``token_images``); both modules' public names are importable from here too.
Every budget comparison in ctxcore uses ``TiktokenCounter`` unless a caller passes another
counter explicitly: ``len/4`` is off by -60%..+20% depending on the language and content.
"""

from __future__ import annotations

import json
import logging
import marshal
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

from ctxcore.messages import AnyMessage, AssistantMessage, content_text
from ctxcore.token_encodings import UNKNOWN_MODELS, WarnOnce, encoding_for_model, load_encoding
from ctxcore.token_images import image_part_tokens, image_tokens_for_size, is_image

log = logging.getLogger(__name__)

__all__ = [
    "UNKNOWN_MODELS",
    "CounterBase",
    "EstimateCounter",
    "FallbackCounter",
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
    """Counts tokens of text, messages and tool definitions for one model's tokenizer.

    Beyond the three counts, a counter declares what the window path builds on: single
    messages (``count_message``, ``sum_messages``), how a request's count is composed from
    them (``reply_priming``), whose stored counts it can reuse (``encoding_name``) and how it
    behaves when a count raises (``tolerant``). A custom counter implements the three counts
    and subclasses ``CounterBase``, which derives the rest from them.
    """

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        ...

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        """Tokens of a list of messages as sent to a chat model (framing included)."""
        ...

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of OpenAI-style tool definitions."""
        ...

    def count_message(self, message: AnyMessage) -> int:
        """Tokens of one message without the per-request reply priming."""
        ...

    def sum_messages(self, messages: Sequence[AnyMessage]) -> int:
        """The sum of ``count_message`` over ``messages`` (no request framing)."""
        ...

    @property
    def reply_priming(self) -> int | None:
        """What ``count_messages`` adds to the sum of ``count_message`` over a non-empty list;
        None when a request's count is not composed from its messages' counts."""
        ...

    @property
    def encoding_name(self) -> str | None:
        """The tiktoken encoding whose exact counts ``count_message`` gives (counts the log
        stored under it are this counter's); None for any other counter."""
        ...

    def tolerant(self) -> TokenCounter:
        """This counter, or the same ``FallbackCounter`` over it each time when a count can raise."""
        ...


class CounterBase:
    """What a custom counter subclasses: everything beyond its three counts derived from them.

    A request is counted by ``count_messages`` itself (no priming), stored counts are not
    its own, and a count that raises is estimated (``tolerant``: one ``FallbackCounter``
    per instance, so its failure is logged once).
    """

    reply_priming: int | None = None
    encoding_name: str | None = None
    _fallback: FallbackCounter | None = None

    def count_text(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def count_message(self, message: AnyMessage) -> int:
        """Tokens of one message: a request of that message alone."""
        return self.count_messages([message])

    def sum_messages(self, messages: Sequence[AnyMessage]) -> int:
        """The sum of ``count_message`` over ``messages``."""
        return sum(self.count_message(m) for m in messages)

    def tolerant(self) -> TokenCounter:
        """The one ``FallbackCounter`` over this counter."""
        if self._fallback is None:
            self._fallback = FallbackCounter(self)
        return self._fallback


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
    """A small thread-safe LRU map (message key -> token count).

    Windows count the same messages again and again: without it an agent step (append +
    window) at a 51-message tail took 2.6-3.5x as long (bench/fast_path.py ``--caches``).
    """

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

    def get_or_put(self, key: Any, compute: Callable[[], int]) -> int:
        """The value under ``key``, computed and stored first when missing."""
        value = self.get(key)
        if value is None:
            value = compute()
            self.put(key, value)
        return value


class _FramedCounter(CounterBase):
    """Shared per-message framing, image pricing and per-content caching (never raises)."""

    # What ``count_messages`` adds to the sum of ``count_message`` over a non-empty list:
    # lets a caller that memoises single messages compose a request's count exactly.
    reply_priming: int | None = _REPLY_PRIMING

    def __init__(self, cache_size: int = 65536, *, image_tokens: int | None = None) -> None:
        self._cache = _LruCache(cache_size)
        # Every image priced alike when set (spec 2.6's override), else by its dimensions.
        self.image_tokens = image_tokens

    def tolerant(self) -> TokenCounter:
        """Itself: the built-in counters count any text."""
        return self

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
        return self._cache.get_or_put(key, lambda: self._count_tools(tools))

    def _count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        # Each definition cached by its rendered text too, so a set that changes in one
        # definition re-tokenises only that one.
        return _REPLY_PRIMING + sum(
            self._cache.get_or_put(("tool", rendered), partial(self.count_text, rendered))
            for rendered in _tools_text(tools)
        )


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
        self.encoding_name = name = encoding_for_model(model)
        self._encoding = load_encoding(name)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` under this counter's encoding."""
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


class FallbackCounter:
    """Delegates to ``inner``; a count that raises is estimated with ``len // 4`` instead.

    The reference falls back to ``len // 4`` when a counter fails (spec 2.5); so does
    ctxcore wherever a window is counted. The first failure is logged as one WARNING with
    its cause, later ones only at DEBUG, so a broken counter is visible without flooding the
    log (one wrapper per counter instance: ``CounterBase.tolerant``).
    """

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self._estimate = EstimateCounter()
        self._warned = False
        self._lock = threading.Lock()
        self.reply_priming = inner.reply_priming
        self.encoding_name = inner.encoding_name

    def tolerant(self) -> TokenCounter:
        """Itself: tolerant already."""
        return self

    def _count(self, what: str, exact: Callable[[], int], estimate: Callable[[], int]) -> int:
        try:
            return int(exact())
        except Exception as exc:  # any counter bug: the window is still served, estimated
            with self._lock:
                first, self._warned = not self._warned, True
            name = type(self.inner).__name__
            if first:
                log.warning(
                    "token counter %s failed counting %s (%s: %s); using the len // 4 estimate for such counts",
                    name,
                    what,
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )
            else:
                log.debug("token counter %s failed again counting %s: %s", name, what, exc)
            return estimate()

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` (estimated if the counter raises)."""
        return self._count("text", lambda: self.inner.count_text(text), lambda: len(text) // 4)

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        """Tokens of ``messages`` as one request (estimated if the counter raises)."""
        return self._count(
            "messages",
            lambda: self.inner.count_messages(messages),
            lambda: self._estimate.count_messages(messages),
        )

    def count_message(self, message: AnyMessage) -> int:
        """Tokens of one message without reply priming (estimated if the counter raises)."""
        return self._count(
            "a message",
            lambda: self.inner.count_message(message),
            lambda: self._estimate.count_message(message),
        )

    def sum_messages(self, messages: Sequence[AnyMessage]) -> int:
        """The sum of ``count_message`` over ``messages``."""
        return sum(self.count_message(m) for m in messages)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of tool definitions (estimated if the counter raises)."""
        return self._count(
            "tools", lambda: self.inner.count_tools(tools), lambda: self._estimate.count_tools(tools)
        )
