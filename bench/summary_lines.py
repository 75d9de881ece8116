"""What the summaries in a run's final windows hold, line by line: how many lines, how many
repeat a line already printed in the same window, and how many are bare tokens (names,
paths or numbers with no word saying what they are), which a verbatim score rewards and an
agent cannot use.

Reads the JSONL of ``EvalConfig(windows_out=...)`` (one final window per run and policy).
Written for the bench alone: no compressor code or pattern is used here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["bare_token", "line_stats"]

# A summary block as the pipeline prints it.
_BLOCK_OPENING = "[ROUND_LEVEL_MEMORY_BLOCK]"
# A summary line: "- " and an optional source tag.
_LINE = re.compile(r"^- (?:(?:user|assistant|tool \S+): )?(?P<text>.+)$")
# A word a reader reads as prose: two or more lower-case letters standing alone ("`parent`
# is `''`." is a sentence; three letters was the first definition and read it as bare); a
# quoted phrase is prose too ("found 6 actions"), a quoted name ends at its quote ("pk"); a
# keyword before a closing quote or a line continuation is a word of code (``break'``).
_WORD = re.compile(r"(?:^|[\s(,;:\"])[a-z]{2,}(?=$|[\s),;:.!?'\\])")
# A capitalised word that opens the line (after a list number, a capitals label such as
# "THOUGHT: " or a comment's "# ") with more after it: a sentence's first word ("Restore
# `index.rst`.", "1. Remove `x`.") or a test runner's status ("FAILED tests/a.py::test_x");
# a name alone ("1. Arcsin"), a list of names ("Arcsin, Dagum") or a label ("Output: ['a']")
# has no space right after its first word. A capitals status and a colon before a name is a
# tool's status line ("FAIL: test_x (a.b.Case)", "ERROR: test_y"), not before a quoted one.
_OPENER = re.compile(
    r"^(?:(?:\d{1,3}[.)]\s+|[A-Z]{2,}:\s+|#+\s+)?[A-Z][A-Za-z]+[.!?]?\s+\S|[A-Z]{3,}:\s+[^\s`'\"])"
)
# Code: an assignment, comparison or arrow between operands (``method=request.method.upper(),``,
# ``a != b``, ``cmd -> returncode=0``), a mapping entry (``'ENGINE': 'django...',``), a call
# (``print(f"{e}")``, ``reproduce()``) or a subscript (``obj: Union["Dataset", "DataArray"],``),
# a power in a formula (``x^{k-1}``), a command-line option (``sed -i '114a x' f.py``). A
# code line or a command is the source line of the names in it.
_CODE = re.compile(
    r"[\w\])'\"}`]\s*(?:[=!<>]=?|->|[-+*/]=|\^)\s*[\w'\"\[({$\\`-]"
    r"|['\"]:\s*[\w'\"\[({]"
    r"|[A-Za-z_]\w*\(|[A-Za-z_]\w*\[(?!\])"
    r"|(?:^|[\s`])--?[a-z][\w-]*(?=\s|$)"
)
# A label that opens a list ("files written: ").
_LABEL = re.compile(r"^[a-z ]{3,30}: ")


def bare_token(text: str) -> bool:
    """True for a summary line (without bullet and tag) that is names, paths or numbers only,
    a short label aside: no word, no sentence opener, no code."""
    body = _LABEL.sub("", text, count=1)
    return _WORD.search(body) is None and _OPENER.match(body) is None and _CODE.search(body) is None


def _block_lines(messages: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or not content.startswith(_BLOCK_OPENING):
            continue
        for raw in content.splitlines():
            match = _LINE.match(raw.strip())
            if match:
                lines.append(match.group("text").strip())
    return lines


def line_stats(path: Path, policy: str = "full") -> dict[str, int]:
    """Summary lines, duplicate lines (within one window) and bare-token lines over the
    final windows of ``policy`` in ``path``."""
    total = duplicates = bare = 0
    for raw in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(raw)
        if row.get("policy") != policy:
            continue
        lines = _block_lines(row.get("messages") or [])
        total += len(lines)
        counts = Counter(" ".join(line.split()).casefold() for line in lines)
        duplicates += sum(n - 1 for n in counts.values())
        bare += sum(1 for line in lines if bare_token(line))
    return {"lines": total, "duplicates": duplicates, "bare": bare}
