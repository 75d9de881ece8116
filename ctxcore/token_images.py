"""Image content parts priced by their dimensions (spec 2.6), read from a stamped size or the header.

OpenAI's tile formula (85 + 170 per 512px tile) or the 28px-patch count, whichever is
larger; low detail 85; an image of unknown size 1445.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from typing import Any

from ctxcore.messages import ContentPart

__all__ = [
    "LOW_DETAIL_IMAGE_TOKENS",
    "UNKNOWN_IMAGE_TOKENS",
    "image_part_tokens",
    "image_tokens_for_size",
    "is_image",
    "stamped_size",
]

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


def image_part_tokens(part: Mapping[str, Any], override: int | None = None) -> int:
    """Tokens of one image content part, priced by its dimensions when they are known.

    A size stamped on the part or its ``image_url`` (``width``/``height``, or
    ``dimensions: "WxH"``) is used first, before the payload's header is parsed (a remote
    URL has no payload to parse): 100x100 costs 255. ``override`` prices every image alike
    (``ContextEngine`` reads it from ``CTXCORE_IMAGE_PLACEHOLDER_TOKENS``).
    """
    if override is not None:
        return override
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


def is_image(part: ContentPart) -> bool:
    return isinstance(part, Mapping) and part.get("type") in ("image_url", "image")
