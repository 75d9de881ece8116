"""Rule compression of one tool output: detect its kind, keep what matters for that kind.

Pure string functions (no model, no I/O, no clock), used by ``MessageSummaryOffloader``.
What each kind keeps:

* ``json``: the structure (keys, nesting, item counts) and the first few items of each
  list, plus items that mention the current request's terms.
* ``html``: the visible text (scripts, styles and tags dropped), then as plain text.
* ``log``: the first lines (command, return code), error and failure lines with failing
  test names, summary lines, and the last lines.
* ``git_diff``: file names, hunk headers and changed lines; unchanged context dropped.
* ``search_results``: per-file match counts and the matches that mention the request's
  terms (then the first matches).
* ``plain_text``: repeated lines collapsed, then head, tail and request-term lines.

Every compressor returns None when it cannot save at least ``min_savings_ratio``.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from itertools import islice
from typing import Any

from ctxcore.json_text import loads_shallow

__all__ = ["Compressed", "ContentType", "RuleBudget", "compress", "detect", "truncate_middle"]


class ContentType(StrEnum):
    """The kinds of tool output the router tells apart."""

    JSON = "json"
    HTML = "html"
    LOG = "log"
    GIT_DIFF = "git_diff"
    SEARCH_RESULTS = "search_results"
    PLAIN_TEXT = "plain_text"


@dataclass(frozen=True)
class RuleBudget:
    """How small the result should be and what the reader is looking for.

    Attributes:
        max_chars: target length of the compressed text.
        terms: lowercase terms of the latest user request and the tool call's arguments.
        min_savings_ratio: below this relative saving the original is kept.
    """

    max_chars: int
    terms: tuple[str, ...] = ()
    min_savings_ratio: float = 0.1


@dataclass(frozen=True)
class Compressed:
    """A compressed text and what it was."""

    text: str
    content_type: ContentType


# --- router -------------------------------------------------------------------------------

_DIFF = re.compile(r"^(?:diff --git |@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@)", re.M)
_HTML = re.compile(
    r"<(?:html|head|body|div|span|p|a|table|tr|td|ul|ol|li|script|style|h[1-6]|meta|link)\b[^>]*>", re.I
)
_SEARCH_LINE = re.compile(r"^[^\s:]+:\d+[:-]")
_LOG_SIGNAL = re.compile(
    r"Traceback \(most recent call last\)|^\s*File \"[^\"]+\", line \d+|\b(?:FAILED|ERROR|PASSED|FAIL)\b"
    r"|\b\d+ (?:passed|failed|errors?)\b|^=+ .+ =+$|\b(?:error|warning)(?:\[\w+\])?:|^\s+at [\w.$<>]+\(.*\)$"
    r"|\bException\b|\bAssertionError\b|^(?:make|npm|cargo|gradle)\b.*\berr",
    re.M,
)
_ERROR_LINE = re.compile(
    r"error|exception|traceback|fail|fatal|assert|panic|denied|not found|cannot|undefined|invalid|"
    r"\bE\s{2,}|warning",
    re.I,
)
_TEST_NAME = re.compile(
    r"(?:FAILED|ERROR|FAIL:)\s+\S+|\S+::\S+ (?:FAILED|ERROR)|^\S+ \.\.\. (?:FAIL|ERROR)", re.M
)
_SUMMARY_LINE = re.compile(r"^=+ .* =+$|\b\d+ (?:passed|failed|errors?|skipped)\b|^(?:OK|FAILED)\b", re.M)


def _parse_json(text: str) -> Any | None:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return loads_shallow(stripped)
    except ValueError:
        return None


_SCAN_CHARS = 40_000


def detect(text: str) -> ContentType:
    """The kind of ``text``: diff, JSON, HTML, search results, log, else plain text."""
    if _DIFF.search(text):
        return ContentType.GIT_DIFF
    if _parse_json(text) is not None:
        return ContentType.JSON
    lowered = text[:2000].lower()
    if "<!doctype html" in lowered or "<html" in lowered or _at_least(_HTML, text[:20000], 5):
        return ContentType.HTML
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and sum(1 for line in lines if _SEARCH_LINE.match(line)) >= 0.3 * len(lines):
        return ContentType.SEARCH_RESULTS
    sample = text if len(text) <= _SCAN_CHARS else text[: _SCAN_CHARS // 2] + "\n" + text[-_SCAN_CHARS // 2 :]
    if "Traceback (most recent call last)" in sample or _at_least(_LOG_SIGNAL, sample, 2):
        return ContentType.LOG
    return ContentType.PLAIN_TEXT


def _at_least(pattern: re.Pattern[str], text: str, count: int) -> bool:
    return sum(1 for _ in islice(pattern.finditer(text), count)) >= count


# --- shared helpers -----------------------------------------------------------------------


def truncate_middle(text: str, max_chars: int, separator: str = "\n...\n") -> str:
    """Head and tail of ``text`` joined by ``separator``, at most ``max_chars`` long."""
    if len(text) <= max_chars:
        return text
    room = max(max_chars - len(separator), 2)
    head = room // 2
    return text[:head] + separator + text[len(text) - (room - head) :]


@lru_cache(maxsize=256)
def _terms_pattern(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    # One alternation instead of a substring test per term: lines x terms adds up fast.
    if not terms:
        return None
    return re.compile("|".join(re.escape(t.lower()) for t in sorted(terms, key=len, reverse=True)))


def _matching(lines: Sequence[str], terms: tuple[str, ...]) -> list[int]:
    """Indices of the lines that mention a term (case-insensitive)."""
    pattern = _terms_pattern(terms)
    return [] if pattern is None else [i for i, line in enumerate(lines) if pattern.search(line.lower())]


_GAP_NOTE_CHARS = 30


def _select(lines: Sequence[str], groups: Iterable[Iterable[int]], max_chars: int) -> str:
    """Lines chosen group by group (in priority order) while they fit, rendered in order
    with a note for each gap."""
    chosen: set[int] = set()
    used = 0
    for group in groups:
        for i in group:
            if i in chosen or not 0 <= i < len(lines):
                continue
            # A line that opens a gap also costs its "lines omitted" note.
            cost = len(lines[i]) + 1 + (0 if i - 1 in chosen else _GAP_NOTE_CHARS)
            if used + cost > max_chars and chosen:
                continue  # a shorter line later in the group may still fit
            chosen.add(i)
            used += cost
    out: list[str] = []
    previous = -1
    for i in sorted(chosen):
        if i > previous + 1:
            out.append(f"... [{i - previous - 1} lines omitted] ...")
        out.append(lines[i])
        previous = i
    if previous < len(lines) - 1:
        out.append(f"... [{len(lines) - 1 - previous} lines omitted] ...")
    return "\n".join(out)


# --- compressors --------------------------------------------------------------------------

_STRING_CAP = 160


def _shrink(value: Any, items: int, terms: tuple[str, ...], depth: int = 0) -> Any:
    """A smaller value of the same shape: long strings cut, lists cut to a few items."""
    if isinstance(value, str):
        return value if len(value) <= _STRING_CAP else value[:_STRING_CAP] + "…"
    if isinstance(value, dict):
        if depth >= 6:
            return f"{{… {len(value)} keys}}"
        return {k: _shrink(v, items, terms, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        if depth >= 6:
            return f"[… {len(value)} items]"
        keep = list(range(min(items, len(value))))
        keep += [
            i
            for i in range(len(keep), len(value))
            if terms and _matching([json.dumps(value[i], ensure_ascii=False)], terms)
        ][:items]
        out = [_shrink(value[i], items, terms, depth + 1) for i in keep]
        if len(keep) < len(value):
            out.append(f"… {len(value) - len(keep)} more of {len(value)} items")
        return out
    return value


def _json(text: str, budget: RuleBudget) -> str:
    value = _parse_json(text)
    header = (
        f"JSON array of {len(value)} items\n"
        if isinstance(value, list)
        else f"JSON object with {len(value) if isinstance(value, dict) else 0} keys\n"
    )
    best = ""
    for items in (5, 3, 2, 1, 0):
        best = header + json.dumps(
            _shrink(value, items, budget.terms), ensure_ascii=False, separators=(",", ":")
        )
        if len(best) <= budget.max_chars:
            break
    return best


_SCRIPT = re.compile(r"<(script|style|noscript)\b.*?</\1\s*>", re.I | re.S)
_TAG = re.compile(r"<[^>]+>")


def _html(text: str, budget: RuleBudget) -> str:
    visible = html.unescape(_TAG.sub(" ", _SCRIPT.sub(" ", text)))
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in visible.splitlines()]
    return _plain("\n".join(line for line in lines if line), budget)


def _log(text: str, budget: RuleBudget) -> str:
    lines = text.splitlines()
    n = len(lines)
    errors = [i for i, line in enumerate(lines) if _ERROR_LINE.search(line)]
    tests = [i for i, line in enumerate(lines) if _TEST_NAME.search(line)]
    summary = [i for i, line in enumerate(lines) if _SUMMARY_LINE.search(line)]
    groups = [
        tests,
        summary,
        range(max(n - 5, 0), n),
        list(reversed(errors)),  # the latest errors matter most
        range(min(2, n)),  # the command and its return code
        [i + 1 for i in errors],
        range(max(n - 40, 0), n),
    ]
    return _select(lines, groups, budget.max_chars)


def _diff(text: str, budget: RuleBudget) -> str:
    kept: list[str] = []
    in_hunk = False
    for line in text.splitlines():
        if line.startswith(("diff --git", "--- ", "+++ ")):
            in_hunk = False
        elif line.startswith("@@"):
            in_hunk = True
        elif (in_hunk and line.startswith((" ", "\\"))) or line.startswith("index "):
            continue
        kept.append(line)
    return "\n".join(kept)


def _search(text: str, budget: RuleBudget) -> str:
    lines = text.splitlines()
    matches = [i for i, line in enumerate(lines) if _SEARCH_LINE.match(line)]
    files = Counter(lines[i].split(":", 1)[0] for i in matches)
    overview = f"{len(matches)} matches in {len(files)} files: " + ", ".join(
        f"{name} ({count})" for name, count in files.most_common(20)
    )
    relevant = [matches[i] for i in _matching([lines[j] for j in matches], budget.terms)]
    others = [i for i in range(len(lines)) if i not in set(matches)]
    body = _select(lines, [others[:3], relevant, matches[:5], matches], budget.max_chars - len(overview) - 1)
    return overview + "\n" + body


def _normalise(line: str) -> str:
    return re.sub(r"\d+", "#", " ".join(line.split()).lower())


def _plain(text: str, budget: RuleBudget) -> str:
    lines: list[str] = []
    counts: Counter[str] = Counter()
    blank = False
    for line in text.splitlines():
        if not line.strip():
            if not blank:
                lines.append("")
            blank = True
            continue
        blank = False
        key = _normalise(line)
        counts[key] += 1
        if counts[key] == 1:
            lines.append(line)
    repeated = sum(c - 1 for c in counts.values())
    deduped = "\n".join(lines) + (f"\n[{repeated} repeated lines collapsed]" if repeated else "")
    if len(deduped) <= budget.max_chars:
        return deduped
    n = len(lines)
    relevant = _matching(lines, budget.terms)
    return _select(lines, [range(min(5, n)), range(max(n - 5, 0), n), relevant, range(n)], budget.max_chars)


_COMPRESSORS = {
    ContentType.JSON: _json,
    ContentType.HTML: _html,
    ContentType.LOG: _log,
    ContentType.GIT_DIFF: _diff,
    ContentType.SEARCH_RESULTS: _search,
    ContentType.PLAIN_TEXT: _plain,
}


def compress(text: str, budget: RuleBudget) -> Compressed | None:
    """Compress ``text`` by its kind; None when that saves less than the minimum ratio."""
    kind = detect(text)
    result = _COMPRESSORS[kind](text, budget)
    return None if len(result) > len(text) * (1 - budget.min_savings_ratio) else Compressed(result, kind)
