"""Verify before commit: a block keeps what the agent is still working on, or is not saved.

Before a stage saves a block it computes the conversation's working set: the files and
symbols that the newest messages the block does not cover act on
(``ctxcore.summarize.working_set``). Each of them that the replaced steps mention must be
named in the block too. A missing one is restored from its newest line in those steps
(verbatim, tagged with its source), within the block's token target: the block's oldest
lines about something else make room; when they cannot, the block is not saved and its
steps stay raw. The outcome goes with the stage result.

Written apart from the eval's scorer (``tests/unit/test_independence.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.markers import INTERNAL_USER_PREFIXES
from ctxcore.messages import AnyMessage, AssistantMessage, ToolMessage, UserMessage
from ctxcore.summarize.bare import bare_line
from ctxcore.summarize.extractive.features import split_tag
from ctxcore.summarize.working_set import mentions, source_lines, working_set
from ctxcore.tokens import TokenCounter

__all__ = ["Verdict", "verify_block"]

# Restored lines take the place of the block's oldest lines about something else, within
# its token target. Without that, a block the summariser filled has no room: keeping those
# steps raw doubled the compactions on the development runs at 8k (half A: 148 -> 323 calls,
# next-step references 0.889 -> 0.795); letting blocks grow 1.25x instead cost half A 0.020
# at 8k (bench/README, issue 33).
# Where restored lines go: the block section about files and code.
_FILES_HEADING = "## Files and changes"
_NONE = "(none)"


@dataclass(frozen=True)
class Verdict:
    """The block text to save (None: keep the steps raw), how many lines were restored
    and how many working-set names the replaced steps mention."""

    text: str | None
    restored: int
    names: int


def _tag(message: AnyMessage) -> str:
    if isinstance(message, ToolMessage):
        return "tool " + "_".join((message.name or "unknown").split())
    if isinstance(message, AssistantMessage):
        return "assistant"
    if isinstance(message, UserMessage):
        return "user"
    return ""


def _tagged_lines(source: Sequence[AnyMessage]) -> list[tuple[str, str]]:
    """Every line of ``source`` a block could keep, with its source tag, in order: a line of
    bare names or numbers is none (a name only such lines mention needs no restoring)."""
    out: list[tuple[str, str]] = []
    for message in source:
        tag = _tag(message)
        if isinstance(message, UserMessage) and message.text.lstrip().startswith(INTERNAL_USER_PREFIXES):
            # An earlier block or a harness note: only its summary lines are content, each
            # with the tag it was written with (its header and headings are none).
            for line in source_lines([message]):
                if line.startswith("- "):
                    inner, rest = split_tag(line[2:])
                    if not bare_line(rest):
                        out.append((inner, rest))
            continue
        out.extend((tag, line) for line in source_lines([message]) if not bare_line(line))
    return out


def _insert(text: str, lines: Sequence[str]) -> str:
    """``text`` with ``lines`` under its files heading (replacing a ``(none)``), else at its end."""
    rows = text.splitlines()
    at = next((i for i, row in enumerate(rows) if row.strip() == _FILES_HEADING), None)
    if at is None:
        return text.rstrip("\n") + "\n" + "\n".join(lines)
    end = at + 1
    while end < len(rows) and not rows[end].lstrip().startswith("## "):
        end += 1
    body = [row for row in rows[at + 1 : end] if row.strip() != _NONE]
    return "\n".join([*rows[: at + 1], *body, *lines, *rows[end:]])


def verify_block(
    text: str,
    source: Sequence[AnyMessage],
    recent: Sequence[AnyMessage],
    target_tokens: int,
    counter: TokenCounter,
) -> Verdict:
    """Check ``text`` (a block summarising ``source``) against the working set of
    ``recent`` (the newest messages it does not cover); see the module docstring."""
    names = working_set(recent).names()
    if not names:
        return Verdict(text, 0, 0)
    lines = _tagged_lines(source)
    newest: dict[str, tuple[str, str]] = {}
    for tag, line in lines:
        for name in names:
            if name in line and mentions(line, frozenset([name])):
                newest[name] = (tag, line)
    touched = sorted(newest)
    missing = [n for n in touched if not mentions(text, frozenset([n]))]
    if not missing:
        return Verdict(text, 0, len(touched))
    restored: list[str] = []
    for name in missing:
        if restored and mentions("\n".join(restored), frozenset([name])):
            continue
        tag, line = newest[name]
        row = f"- {tag}: {line}" if tag else f"- {line}"
        if row not in restored:
            restored.append(row)
    out = _make_room(_insert(text, restored), restored, names, target_tokens, counter)
    if out is None:
        return Verdict(None, 0, len(touched))
    return Verdict(out, len(restored), len(touched))


def _make_room(
    text: str, restored: Sequence[str], names: frozenset[str], target_tokens: int, counter: TokenCounter
) -> str | None:
    """``text`` within ``target_tokens``: while over, the oldest summary line that names
    nothing of the working set (never a restored line nor one of the user's) goes. None when
    it cannot get there."""
    limit = target_tokens
    rows = text.splitlines()
    keep = set(restored)
    while counter.count_text("\n".join(rows)) > limit:
        drop = next(
            (
                i
                for i, row in enumerate(rows)
                if row.startswith("- ")
                and row not in keep
                and not row.startswith("- user:")
                and not mentions(row, names)
            ),
            None,
        )
        if drop is None:
            return None
        del rows[drop]
    return "\n".join(rows)
