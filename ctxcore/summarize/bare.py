"""Bare lines: names or numbers with no plain word saying what they are.

One definition for the summarisers and the check before commit: the extractive summariser
joins a list of bare items to the sentence that introduces it and any other bare line to the
line before it (``extractive.lists``), and ``pipeline.verify`` never restores a bare line
into a block. A line such as ``src/a.py`` or ``  526`` or ``1. Arcsin`` or a code fence
tells the agent nothing on its own.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["bare_line", "fence_line"]

# A word of prose or code: three lower-case letters standing alone, not part of a path, a
# dotted name or a decorator (``src/a.py``, ``axis.py``, ``os.path``, ``@classmethod``). The
# stricter form the list joining had (no word in quotes or backticks, none before a
# parenthesis) cost half A one next-step reference at 8k and at 16k through the check before
# commit and changed nothing else (bench/README, issue 33).
_PLAIN_WORD: Final = re.compile(r"(?<![\w./@-])[a-z]{3,}(?![\w/-]|\.\w)")
# A name or a value in single or double quotes, no space in it (a string of code, a
# dictionary key, ``'(foo{1,3})'``): no word of prose.
_QUOTED_NAME: Final = re.compile(r"(['\"])[^\s'\"]*\1")
# A line of backticked spans and nothing else but a one-word label (`` `printf "114a\n..."` ``,
# ``Needs: `Piecewise`, `exp` ``): names or a snippet with no sentence saying what they are.
_BACKTICKED_ALONE: Final = re.compile(r"^\s*(?:[A-Z]\w*:\s*)?`[^`]+`(?:,\s*`[^`]+`)*[.:;,]?\s*$")
# A code fence alone (```bash): its language is no word of the text. Counted bare, with the
# bare_joined rule: A 16k 0.941 -> 0.946, bare-token lines 65 -> 60; the rest equal within
# one reference (bench/README, issue 33).
_FENCE: Final = re.compile(r"^\s*(?:`{3,}|~{3,})[\w+-]*\s*$")


def fence_line(line: str) -> bool:
    """True for a code fence alone (```` ```bash ````, ``~~~``): markup, no content."""
    return _FENCE.match(line) is not None


def bare_line(line: str) -> bool:
    """True for a line of names or numbers only: no plain word says what they are (a name
    in quotes, ``'widget'``, is none)."""
    if _FENCE.match(line) is not None or _BACKTICKED_ALONE.match(line) is not None:
        return True
    return _PLAIN_WORD.search(_QUOTED_NAME.sub(" ", line)) is None
