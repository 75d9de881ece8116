"""Lines of bare names or numbers, and the agent's lists of them joined to their sentence."""

from __future__ import annotations

import re

from ctxcore.summarize.bare import bare_line

__all__ = ["with_bare_joined", "with_lists_joined"]

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
    line before it, ``"; "`` between; ``""`` when no line of ``text`` has a word. A bare line
    is kept only inside the line it belongs to: alone it tells the agent nothing."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if bare_line(line):
            if out:
                out[-1] = f"{out[-1]}; {line}"
            continue
        out.append(line)
    return "\n".join(out)
