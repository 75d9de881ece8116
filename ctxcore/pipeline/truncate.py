"""The hard-truncate stage: deterministic, of blocks only, whole lines only.

Each run of blocks between pinned messages becomes one truncated block. Its summary keeps
the block sections: the lines of each section of the run's blocks (a verbatim block's
messages become one tagged line each), of which a global fraction is kept, head and tail
of each section around the truncation marker, found by binary search. Lines are never cut
inside and a line occurs once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, message_text
from ctxcore.pipeline.models import PipelineConfig
from ctxcore.pipeline.sizing import message_tokens, served_tokens
from ctxcore.pipeline.view import View, block_message
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.summarize.sections import render_sections, split_sections
from ctxcore.tokens import TokenCounter

__all__ = ["truncate_blocks"]

# A verbatim message is one line in a truncated block: at most this many characters.
_LINE_CHARS = 320
_SUMMARY = "\nSummary:\n"
_Sections = tuple[list[str], dict[str, list[str]]]


def _one_line(message: AnyMessage) -> str:
    """A raw message as one tagged summary line, cut at a word end."""
    text = " ".join(message_text(message).split())
    if isinstance(message, AssistantMessage) and message.tool_calls:
        calls = " ".join(f"{c.name}({' '.join(c.arguments.split())})" for c in message.tool_calls)
        text = f"{text} {calls}".strip()
    if len(text) > _LINE_CHARS:
        cut = text.rfind(" ", 0, _LINE_CHARS)
        text = text[:cut] if cut > 0 else ""
    if not text:
        return ""
    if isinstance(message, ToolMessage):
        return f"- tool {'_'.join((message.name or 'unknown').split())}: {text}"
    return f"- {message.role}: {text}"


def _segment_sections(segment: Sequence[SummaryBlock]) -> _Sections:
    """The lines of a run of blocks by section, each line once (tag and spacing ignored)."""
    lead: list[str] = []
    bodies: dict[str, list[str]] = {title: [] for title in BLOCK_SECTIONS}
    seen: set[str] = set()

    def add(into: list[str], line: str) -> None:
        key = " ".join(line.split(": ", 1)[-1].split()) if line.startswith("- ") else " ".join(line.split())
        if line and key not in seen:
            seen.add(key)
            into.append(line)

    for block in segment:
        for message in block.messages:
            text = message_text(message)
            if _SUMMARY in text:
                own_lead, own, _ = split_sections(text.split(_SUMMARY, 1)[1], BLOCK_SECTIONS)
                for line in own_lead:
                    add(lead, line)
                for title, lines in own.items():
                    for line in lines:
                        add(bodies[title], line)
            else:
                add(bodies[BLOCK_SECTIONS[0]], _one_line(message))
    return lead, bodies


def _keep(lines: list[str], fraction: float, head_ratio: float, marker: str) -> list[str]:
    # Every section keeps its newest line at least (the stage falls back to the bare
    # marker when even that does not fit).
    keep = math.ceil(len(lines) * fraction)
    if keep >= len(lines):
        return lines
    head = int(keep * head_ratio)
    tail = keep - head
    return [*lines[:head], marker, *(lines[len(lines) - tail :] if tail else [])]


def truncate_blocks(
    view: View, cfg: PipelineConfig, counter: TokenCounter, target_tokens: int
) -> list[SummaryBlock]:
    """Deterministically cut block text (never pinned or tail messages) until the view fits.

    Each run of blocks between pinned messages becomes one truncated block; a global
    fraction of each section's lines is kept, found by binary search.
    """
    segments: list[list[SummaryBlock]] = [[]]
    for item in view.prefix():
        if isinstance(item, SummaryBlock):
            segments[-1].append(item)
        else:
            segments.append([])
    segments = [s for s in segments if s]
    if not segments:
        return list(view.blocks)
    sections = [_segment_sections(seg) for seg in segments]
    fixed_view = View(
        version=view.version,
        system=view.system,
        tools=view.tools,
        pinned=view.pinned,
        tail=view.tail,
        covered_until=view.covered_until,
        detector=view.detector,
    )
    fixed = served_tokens(fixed_view, cfg, counter)
    ratio, marker = cfg.truncate_head_ratio, cfg.truncated_marker

    def build(fraction: float | None) -> list[SummaryBlock]:
        blocks = []
        for seg, (lead, bodies) in zip(segments, sections, strict=True):
            first, last = seg[0].first_id, seg[-1].last_id
            level = max(b.level for b in seg)
            if fraction is None:
                body = marker
                scope = "compact"
            else:
                kept = {title: _keep(lines, fraction, ratio, marker) for title, lines in bodies.items()}
                body = render_sections(_keep(lead, fraction, ratio, marker), kept, BLOCK_SECTIONS)
                scope = "truncated_full_context"
            block_id = f"T{level}-{first}-{last}"
            message = block_message(
                body,
                block_id=block_id,
                first_id=first,
                last_id=last,
                level=level,
                scope=scope,
                marker=cfg.compression_marker,
                tokens_before=sum(b.tokens_before for b in seg),
            )
            blocks.append(
                SummaryBlock(
                    block_id=block_id,
                    messages=[message],
                    first_id=first,
                    last_id=last,
                    level=level,
                    tokens_before=sum(b.tokens_before for b in seg),
                    tokens_after=message_tokens(counter, [message]),
                )
            )
        return blocks

    def largest_within(limit: int) -> list[SummaryBlock] | None:
        lo, hi = 0, 1000
        best: list[SummaryBlock] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = build(mid / 1000)
            if fixed + sum(message_tokens(counter, b.messages) for b in candidate) <= limit:
                best, lo = candidate, mid + 1
            else:
                hi = mid - 1
        return best

    best = largest_within(target_tokens)
    ceiling = cfg.ceiling_tokens
    if best is None and ceiling is not None and ceiling > target_tokens:
        # The tail alone is over the target, so no cut of the blocks reaches it; keep what
        # fits under the budget rather than wiping the blocks.
        best = largest_within(ceiling)
    return best if best is not None else build(None)
