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

__all__ = ["bare_line"]

# A word of prose or code: three lower-case letters standing alone, not part of a path or a
# dotted name (``src/a.py``, ``os.path``). The stricter form the list joining had (no word in
# quotes or backticks, none before a parenthesis) cost half A one next-step reference at 8k
# and at 16k through the check before commit and changed nothing else (bench/README, issue 33).
_PLAIN_WORD: Final = re.compile(r"(?<![\w./-])[a-z]{3,}(?![\w/-])")
# A code fence alone (```bash): its language is no word of the text. Counted bare, with the
# bare_joined rule: A 16k 0.941 -> 0.946, bare-token lines 65 -> 60; the rest equal within
# one reference (bench/README, issue 33).
_FENCE: Final = re.compile(r"^\s*(?:`{3,}|~{3,})[\w+-]*\s*$")


def bare_line(line: str) -> bool:
    """True for a line of names or numbers only: no plain word says what they are."""
    return _FENCE.match(line) is not None or _PLAIN_WORD.search(line) is None
