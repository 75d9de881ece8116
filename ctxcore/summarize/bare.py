"""Bare lines: names or numbers with no plain word saying what they are.

One definition for the summarisers and the check before commit: the extractive summariser
joins a list of bare items to the sentence that introduces it (``extractive.lists``), and
``pipeline.verify`` never restores a bare line into a block. A line such as ``src/a.py`` or
``  526`` or ``1. Arcsin`` tells the agent nothing on its own.
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


def bare_line(line: str) -> bool:
    """True for a line of names or numbers only: no plain word says what they are."""
    return _PLAIN_WORD.search(line) is None
