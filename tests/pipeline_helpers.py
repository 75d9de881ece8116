"""Shared helpers for pipeline and compressor tests: logged conversations and scripted models."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ctxcore.messages import AnyMessage, from_openai
from ctxcore.pipeline import View
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.model import Completion, OutputContract, Usage


def logged(raw_messages: Sequence[dict[str, Any]]) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """(system messages, non-system messages with log ids) of an OpenAI-format conversation."""
    msgs = from_openai(list(raw_messages))
    system = [m for m in msgs if m.role == "system"]
    rest = [m for m in msgs if m.role != "system"]
    return system, [m.model_copy(update={"context_message_id": f"{i:012d}"}) for i, m in enumerate(rest, 1)]


def raw_view(raw_messages: Sequence[dict[str, Any]]) -> View:
    """A fresh view (nothing covered) of a conversation."""
    system, rest = logged(raw_messages)
    return View(version=0, system=tuple(system), tail=tuple(rest))


class FailingModel:
    """Raises the given kind on every call."""

    name = "failing"

    def __init__(self, kind: str = "server_unstable") -> None:
        self.kind = kind
        self.calls = 0

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.calls += 1
        raise ModelCallError(self.kind, "scripted failure")


class ScriptedModel:
    """Returns scripted texts in order (the last one repeats)."""

    name = "scripted"

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.calls: list[OutputContract | None] = []

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.calls.append(contract)
        text = self.texts[min(len(self.calls) - 1, len(self.texts) - 1)]
        return Completion(text=text, usage=Usage(10, 5, 15))


def check_coverage(view: View, all_ids: Sequence[str]) -> None:
    """Every log id up to the cursor is in exactly one block range or pinned; none after it."""
    cursor = view.covered_until
    pinned = {m.context_message_id for m in view.pinned}
    blocks: list[SummaryBlock] = list(view.blocks)
    ranges = sorted((b.first_id, b.last_id) for b in blocks)
    for (a1, b1), (a2, _) in itertools.pairwise(ranges):
        assert b1 < a2, f"overlapping blocks {a1}..{b1} and {a2}"
    assert len({b.block_id for b in blocks}) == len(blocks), "duplicate block ids"
    for log_id in all_ids:
        inside = sum(1 for a, b in ranges if a <= log_id <= b)
        if cursor is not None and log_id <= cursor:
            assert inside + (log_id in pinned) == 1, (
                f"{log_id} covered {inside} times, pinned={log_id in pinned}"
            )
        else:
            assert inside == 0 and log_id not in pinned, f"{log_id} after the cursor is covered"
