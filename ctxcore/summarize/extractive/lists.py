"""Lines of bare names or numbers, and the agent's lists of them joined to their sentence."""

from __future__ import annotations

import re
from collections.abc import Callable

from ctxcore.summarize.bare import bare_line, fence_line
from ctxcore.summarize.extractive.features import words_of

__all__ = ["bare_glued", "with_bare_joined", "with_lists_joined"]

# A bare line that opens what follows it: a label ("`axis.py`:") or a decorator
# ("@classmethod"): it belongs with the next line, not the one before.
_OPENS_NEXT = re.compile(r"(?::|^@\S+)$")
# An item of the agent's own list: "1. ...", "2) ...", "- ...", "* ...".
_LIST_ITEM = re.compile(r"^(?:\d{1,3}[.)]|[-*•])\s+\S")


def with_lists_joined(text: str) -> str:
    """``text`` with each run of the agent's list items that are bare names ("1. Arcsin")
    joined to the sentence that introduces them, one line: a list of bare names is no use
    without what it lists. A list item that is a sentence stays a line of its own."""
    out: list[str] = []
    joined = False
    for raw in text.splitlines():
        line = raw.strip()
        item = _LIST_ITEM.match(line)
        if item is not None and bare_line(line):
            # No sentence to join it to: a bare name alone says nothing.
            if out and (joined or not bare_line(out[-1])):
                body = line[item.end() - 1 :].strip()
                out[-1] = f"{out[-1]}{'; ' if joined else ' '}{body}"
                joined = True
            continue
        out.append(line)
        joined = False
    return "\n".join(out)


def with_bare_joined(text: str) -> str:
    """``text`` with each bare line (a name or number alone, ``bare_line``) joined to the
    line it belongs to, ``"; "`` between: a label or a decorator to the line after it, any
    other to the line before it; a code fence alone is markup and goes. ``""`` when no line
    of ``text`` has a word. A bare line is kept only inside the line it belongs to: alone it
    tells the agent nothing."""
    out: list[str] = []
    held: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or fence_line(line):
            continue
        if bare_line(line):
            if held or _OPENS_NEXT.search(line):
                held.append(line)
            elif out:
                out[-1] = f"{out[-1]}; {line}"
            continue
        if held:
            line = " ".join([*held, line])
            held = []
        out.append(line)
    if held and out:
        out[-1] = "; ".join([out[-1], *held])
    return "\n".join(out)


def bare_glued(parts: list[str], joinable: Callable[[str], bool], glue: str) -> list[str]:
    """``parts`` with each bare one that has content words (a list item such as ``- **Cabin:**
    Basic Economy``, ``Gift Card 1: $198``, an opening "Certainly!") glued to the part
    before it, or to the part after it when it comes first: alone it is a bare-token line.
    Only parts ``joinable`` accepts glue or are glued to (never a speaker's line); a part
    without content words ("Thanks, Mel!") stays as it is (no candidate anyway)."""
    out: list[str] = []
    held: list[str] = []
    for part in parts:
        if joinable(part) and bare_line(part) and words_of(part):
            if out and joinable(out[-1]):
                out[-1] = f"{out[-1]}{glue}{part}"
            else:
                held.append(part)
            continue
        if held and joinable(part):
            part = glue.join([*held, part])
        else:
            out.extend(held)
        held = []
        out.append(part)
    out.extend(held)
    return out
