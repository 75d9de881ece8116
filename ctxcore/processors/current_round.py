"""``CurrentRoundCompressor``: the work since the latest real user request becomes a state snapshot.

Spec 4.3: the span starts right after the intent anchor (the last real user message) and
ends before the last ``keep_recent_messages`` (widened so no kept tool result loses its
call) and before any unfinished tool step. Internal user messages after the anchor (older
snapshots, re-injected state, reminders) are summarised too, into one new
``<memory_block_current>`` right after the anchor, also when no assistant message follows them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from ctxcore.markers import MEMORY_BLOCK_CURRENT
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.processors.base import ProcessorConfig
from ctxcore.processors.snapshot_compressor import (
    SnapshotCompressor,
    SnapshotCompressorConfig,
    Span,
    complete_prefix,
)
from ctxcore.summarize.prompts import CURRENT_COMPACT_PROMPT, CURRENT_SECTIONS
from ctxcore.turns import adjust_keep_recent_for_tool_boundaries, anchors

if TYPE_CHECKING:
    from ctxcore.processors.base import ProcessorContext

__all__ = ["CurrentRoundCompressor", "CurrentRoundCompressorConfig"]


class CurrentRoundCompressorConfig(SnapshotCompressorConfig):
    """Spec 4.3 defaults: trigger at 0.8 of the window, keep no recent messages."""

    keep_recent_messages: int = Field(default=0, ge=0)


class CurrentRoundCompressor(SnapshotCompressor):
    """Summarise the active round into ``<memory_block_current>``."""

    config_model: ClassVar[type[ProcessorConfig]] = CurrentRoundCompressorConfig
    tag = MEMORY_BLOCK_CURRENT
    meaning = (
        "A summary of the work done since the user's latest request (analysis, tool calls, code changes, "
        "tests, next steps). It is not a new user request."
    )
    prompt = CURRENT_COMPACT_PROMPT
    sections = CURRENT_SECTIONS
    builders = ("plan_mode", "plan", "task_status", "todo", "skills", "read_file")

    def span(self, ctx: ProcessorContext, messages: list[AnyMessage]) -> Span:
        """``messages[:u+1]`` stays, the finished work after it is summarised, the rest stays."""
        intent = anchors(messages, ctx.detector).intent
        if intent is None:
            return Span([], [], list(messages))
        start = intent + 1
        keep = adjust_keep_recent_for_tool_boundaries(messages, self.config.keep_recent_messages)  # type: ignore[attr-defined]
        split = max(len(messages) - keep, start)
        end = start + complete_prefix(messages[start:split])
        # Internal user messages after the finished work (older snapshots, re-injected
        # state, reminders) are folded too, even with no assistant message after them: they
        # are no step of their own, and overflow recovery must find them (spec 4.3).
        while end < split and isinstance(messages[end], UserMessage):
            end += 1
        return Span(list(messages[:start]), list(messages[start:end]), list(messages[end:]))
