"""Numbered code listings in a tool's output (``nl -ba``, ``cat -n``, an editor's view).

The agent comes back to code it viewed: it quotes the lines with their numbers when it
reasons about them and edits them by number (``sed -i '526s/…/…/'``), many steps after the
view (bench/README, issue 33, "viewed code"). Each listed line is a candidate of its own,
its line number in front, so that a summary can keep the few lines that matter of a long
view with the numbers the agent will use.
"""

from __future__ import annotations

import re
from typing import Final

from ctxcore.summarize.extractive.features import collapse

__all__ = ["numbered_lines"]

# A line number, a tab, the code: how ``nl -ba`` and ``cat -n`` print a file's line.
_NUMBERED: Final = re.compile(r"^\s*(\d+)\t(.*\S)")
# Lines read from one output at most: a listing of a whole large file is not read to its end.
_MAX_LINES: Final = 400


def numbered_lines(text: str) -> list[str]:
    """``"<number> <code>"`` for each non-blank numbered line of ``text``, in order."""
    out: list[str] = []
    for raw in text.splitlines():
        found = _NUMBERED.match(raw)
        if found is None:
            continue
        out.append(f"{found.group(1)} {collapse(found.group(2))}")
        if len(out) >= _MAX_LINES:
            break
    return out
