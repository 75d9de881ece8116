"""The recall marker on summary blocks whose whole range is archived (spec 6)."""

from __future__ import annotations

from ctxcore.markers import COMPRESSION_RECALL_PREFIX
from ctxcore.messages import message_text, replace_content
from ctxcore.state.models import SummaryBlock

__all__ = ["is_verbatim", "mark_archived", "mark_snapshot", "recall_marker"]


def recall_marker(first_id: str, last_id: str) -> str:
    """``[[COMPRESSION_RECALL: id=<first>-<last>]]``: the range can be searched with the recall tool."""
    return f"{COMPRESSION_RECALL_PREFIX} id={first_id}-{last_id}]]"


def is_verbatim(block: SummaryBlock) -> bool:
    """True for a block that holds its raw messages as they were (``V`` blocks)."""
    meta = block.messages[0].metadata.get("ctxcore_block") if block.messages else None
    scope = meta.get("scope") if isinstance(meta, dict) else None
    return scope == "verbatim" or block.block_id.startswith("V")


def mark_archived(block: SummaryBlock) -> SummaryBlock:
    """The pipeline block with the recall marker as its last line (once)."""
    *head, last = block.messages
    marker = recall_marker(block.first_id, block.last_id)
    text = message_text(last)
    if marker in text:
        return block
    return block.model_copy(update={"messages": [*head, replace_content(last, f"{text}\n{marker}")]})


def mark_snapshot(text: str, first_id: str, last_id: str) -> str:
    """A snapshot memory block (``<summary>...</summary>``) with the marker right after ``</summary>``."""
    marker = recall_marker(first_id, last_id)
    if marker in text or "</summary>" not in text:
        return text
    head, _, tail = text.rpartition("</summary>")
    return f"{head}</summary>\n{marker}{tail}"
