"""Readability of the summary blocks in a final window: who wrote each line, repeats, cuts.

Written from the documented formats (spec section 6 and issue 16), never from the
compressors' code:

* a **summary block** is a user-role message whose first line is a memory-block marker:
  ``[<NAME>_MEMORY_BLOCK]`` (legacy) or ``<memory_block_<name>>`` (forked);
* its **body** is what follows the ``Summary:`` line (legacy) or sits between ``<summary>``
  and ``</summary>`` (forked);
* a **summary line** is a non-blank line of the body that is not a heading (``#``), not
  ``(none)``, not a lone tag (``<state_snapshot>``), not a ``[[...]]`` marker line and not
  a truncation marker (``...[TRUNCATED]...``);
* a line is **tagged** when it starts ``- user: ``, ``- assistant: `` or ``- tool <name>: ``;
* a **duplicate** is a line whose text after its tag, whitespace collapsed, occurred
  earlier in the same block;
* a line is **cut** when the word before an ellipsis (``…``), or its last word, is not a
  whole word of the raw conversation (words are runs of letters, digits and ``_``; the raw
  conversation is every message's text and every tool call's name and arguments).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage

__all__ = ["Readability", "pooled", "readability"]

_LEGACY_OPEN = re.compile(r"\[[A-Z][A-Z_]*_MEMORY_BLOCK\]")
_FORKED_OPEN = re.compile(r"<memory_block_[a-z_]+>")
_TAGGED = re.compile(r"- (?:user|assistant|tool [^\s:]+): ")
_HEADING = re.compile(r"#{1,6}(?:\s|$)")
_LONE_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")
_WORDS = re.compile(r"\w+")
# Spec 6's truncation markers on a line of their own ("...[TRUNCATED]...").
_CUT_MARKER = re.compile(r"\.\.\.\[[A-Z_]+\]\.\.\.")
_ELLIPSIS = "…"


@dataclass(frozen=True)
class Readability:
    """Counts over the summary blocks of one window."""

    blocks: int = 0
    lines: int = 0
    tagged: int = 0
    duplicates: int = 0
    cuts: int = 0

    def as_dict(self) -> dict[str, int]:
        """A JSON-ready mapping of the counts."""
        return {
            "summary_blocks": self.blocks,
            "summary_lines": self.lines,
            "tagged_lines": self.tagged,
            "duplicate_lines": self.duplicates,
            "midword_cuts": self.cuts,
        }


def _body(text: str) -> list[str] | None:
    """The body lines of a summary block, or None when ``text`` is no summary block."""
    lines = text.splitlines()
    if not lines:
        return None
    first = lines[0].strip()
    if _LEGACY_OPEN.fullmatch(first):
        for n, line in enumerate(lines):
            if line.strip().startswith("Summary:"):
                rest = line.strip()[len("Summary:") :]
                return [rest, *lines[n + 1 :]]
        return []
    if _FORKED_OPEN.fullmatch(first):
        inside: list[str] = []
        within = False
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("<summary>"):
                within = True
                stripped = stripped[len("<summary>") :]
            if within and stripped.endswith("</summary>"):
                inside.append(stripped[: -len("</summary>")])
                break
            if within:
                inside.append(stripped)
        return inside
    return None


def _is_summary_line(line: str) -> bool:
    return bool(
        line
        and line != "(none)"
        and not _HEADING.match(line)
        and not _LONE_TAG.fullmatch(line)
        and not (line.startswith("[[") and line.endswith("]]"))
        and not _CUT_MARKER.fullmatch(line)
    )


def _untagged(line: str) -> str:
    match = _TAGGED.match(line)
    text = line[match.end() :] if match else line
    return " ".join(text.split())


def _is_cut(line: str, vocabulary: frozenset[str]) -> bool:
    ends: list[str] = []
    position = line.find(_ELLIPSIS)
    while position != -1:
        before = _WORDS.findall(line[:position])
        if before:
            ends.append(before[-1])
        position = line.find(_ELLIPSIS, position + 1)
    words = _WORDS.findall(line)
    if words:
        ends.append(words[-1])
    return any(word not in vocabulary for word in ends)


def vocabulary(history: Iterable[AnyMessage]) -> frozenset[str]:
    """Every whole word of the raw conversation."""
    words: set[str] = set()
    for message in history:
        words.update(_WORDS.findall(message.text))
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                words.update(_WORDS.findall(f"{call.name} {call.arguments}"))
    return frozenset(words)


def readability(window: Sequence[AnyMessage], history: Sequence[AnyMessage]) -> Readability:
    """The counts of the module docstring over the summary blocks of ``window``."""
    words = vocabulary(history)
    blocks = lines = tagged = duplicates = cuts = 0
    for message in window:
        if not isinstance(message, UserMessage):
            continue
        body = _body(message.text)
        if body is None:
            continue
        blocks += 1
        seen: set[str] = set()
        for raw in body:
            line = raw.strip()
            if not _is_summary_line(line):
                continue
            lines += 1
            tagged += _TAGGED.match(line) is not None
            key = _untagged(line)
            duplicates += key in seen
            seen.add(key)
            cuts += _is_cut(line, words)
    return Readability(blocks, lines, tagged, duplicates, cuts)


def pooled(records: Iterable[Mapping[str, int]]) -> dict[str, float | int | None]:
    """Counts summed over conversations, with the tagged share of all summary lines."""
    total = {
        "summary_blocks": 0,
        "summary_lines": 0,
        "tagged_lines": 0,
        "duplicate_lines": 0,
        "midword_cuts": 0,
    }
    for record in records:
        for key in total:
            total[key] += int(record.get(key, 0))
    lines = total["summary_lines"]
    share = round(total["tagged_lines"] / lines, 4) if lines else None
    return {**total, "tagged_share": share}
