"""``DialogueCompressor``: earlier history becomes a hand-off state snapshot.

Spec 4.2, with ctxcore's anchors: the span runs between the task anchor (first real user
message, kept verbatim) and the intent anchor (the latest request, kept verbatim with
everything after it), whole steps only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxcore.markers import MEMORY_BLOCK_DIALOGUE
from ctxcore.messages import AnyMessage
from ctxcore.processors.events import ContextEvent
from ctxcore.processors.snapshot_compressor import SnapshotCompressor, Span, complete_prefix
from ctxcore.summarize.prompts import DIALOGUE_COMPACT_PROMPT, DIALOGUE_SECTIONS
from ctxcore.turns import anchors

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext

__all__ = ["DialogueCompressor"]


class DialogueCompressor(SnapshotCompressor):
    """Summarise the history between the task and intent anchors into ``<memory_block_dialogue>``."""

    tag = MEMORY_BLOCK_DIALOGUE
    meaning = (
        "A hand-off of earlier conversation history, usable as prior context. It is not a new user request; "
        "the latest user message wins over it."
    )
    prompt = DIALOGUE_COMPACT_PROMPT
    sections = DIALOGUE_SECTIONS
    builders = ("skills", "read_file", "plan_mode", "plan")

    def span(self, ctx: ProcessorContext, messages: list[AnyMessage]) -> Span:
        """``messages[:task+1]`` stays, whole steps up to the intent anchor are summarised."""
        found = anchors(messages, ctx.detector)
        if found.task is None or found.intent is None or found.intent <= found.task + 1:
            return Span([], [], list(messages))
        start = found.task + 1
        end = start + complete_prefix(messages[start : found.intent])
        return Span(list(messages[:start]), list(messages[start:end]), list(messages[end:]))

    def on_compress(
        self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Active compression still honours the minimum-target check (spec 3.4)."""
        if self.shortfall(ctx, messages) is not None:
            return None, messages
        return super().on_compress(ctx, messages, **kwargs)
