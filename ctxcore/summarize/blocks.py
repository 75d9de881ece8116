"""The blocks format shared by the compaction stages and the summarisation strategies.

``Summarizer`` is what a stage calls to turn pending steps into one new L1 block;
``parse_blocks`` reads a model's ``{"blocks": [{"block_id", "summary"}]}`` reply. Both live
here, below ``pipeline``, so ``summarize`` never imports the pipeline's stages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Protocol

from ctxcore.messages import AnyMessage
from ctxcore.state.models import SummaryBlock

__all__ = ["Summarizer", "is_blocks_reply", "parse_blocks"]


class Summarizer(Protocol):
    """Turns pending steps into the messages of one new L1 block.

    ``previous_blocks`` are context (so the summary does not repeat them) and stay as they
    are: the most recent earlier blocks, together at most ``SUMMARIZER_CONTEXT_RATIO`` of
    the pending steps' tokens or ``SUMMARIZER_CONTEXT_FLOOR`` tokens. The result stands for
    ``pending_steps`` only. None or [] is a failure.
    """

    def __call__(
        self, previous_blocks: Sequence[SummaryBlock], pending_steps: Sequence[AnyMessage], target_tokens: int
    ) -> list[AnyMessage] | None: ...


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    """``{"blocks": [{"block_id", "summary"}]}`` -> id -> summary; anything else -> {}."""
    payload = _blocks_payload(text)
    out: dict[str, str] = {}
    for entry in payload or []:
        if not isinstance(entry, dict):
            continue
        bid, summary = entry.get("block_id"), entry.get("summary")
        if isinstance(bid, str) and bid and isinstance(summary, str) and summary.strip():
            out.setdefault(bid, summary.strip())
    return out


def is_blocks_reply(text: str) -> bool:
    """True when ``text`` is a ``{"blocks": [...]}`` reply, usable blocks or not: one whose
    summaries are empty is an empty answer, not prose to keep as a summary."""
    return _blocks_payload(text) is not None


def _blocks_payload(text: str) -> list[object] | None:
    """The ``blocks`` list of a reply (bare, fenced or inside other text), or None."""
    stripped = text.strip()
    start, end = text.find("{"), text.rfind("}")
    # Built lazily: the fence regex costs milliseconds on a long reply that parses as it is.
    candidates: list[Callable[[], str]] = [
        lambda: stripped,
        lambda: _FENCE.sub("", stripped),
        lambda: text[start : end + 1] if 0 <= start < end else "",
    ]
    for make in candidates:
        candidate = make()
        if not candidate:
            continue
        try:
            payload = json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            continue
        if isinstance(payload, dict) and isinstance(payload.get("blocks"), list):
            return list(payload["blocks"])
    return None
