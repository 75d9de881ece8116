"""Line features, section rules and error detection of the extractive summariser.

A candidate line is worth a prior for its kind plus what it carries: numbers, dates,
names, paths, identifiers, an error, overlap with the query. Section titles (of a
contract or of an earlier summary) are classified by keyword so lines can be routed.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "COMMENT",
    "CONSTRAINT",
    "DATE",
    "DECISION",
    "ELLIPSIS",
    "MAX_LINE_CHARS",
    "PATH",
    "PENDING",
    "SENTENCE_SPLIT",
    "SPEAKER",
    "classify_title",
    "collapse",
    "is_error",
    "line_features",
    "meaningful",
    "scan",
    "words_of",
]

ELLIPSIS: Final = " … "
MAX_LINE_CHARS = 320

NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,:]\d+)*%?(?![\w])")
DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    r"|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2}\b"
    r"|\b\d{1,2} (?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*,? \d{4}\b",
    re.IGNORECASE,
)
NAME = re.compile(r"\b[A-Z][a-z]{2,}(?:\s[A-Z][a-z]{2,})*\b")
PATH = re.compile(
    r"(?:~|\.{1,2})?/?(?:[\w.@-]+/)+[\w.@-]+"
    r"|\b[\w-]+\.(?:py|pyi|js|ts|tsx|jsx|go|rs|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|md|rst|txt|json|"
    r"yaml|yml|toml|ini|cfg|conf|lock|csv|sql|sh|html|css|xml|ipynb|env)\b"
)
IDENT = re.compile(r"`[^`\n]{1,80}`|\b[A-Za-z]\w*_\w+\b|\b[a-z]+[A-Z]\w+\b|\b\w+\(\)|\b[A-Z]{2,}\d*\b")
# Error lines as tools print them. Anchored forms ("ValueError: ...", "Traceback ...",
# "FAILED ...", unittest's "FAIL: test (Case)", "error: ...") are strong; the unanchored
# ones still need a colon and a message, so source code such as "except ValueError:" or
# "raise TypeError(" is not one.
_ERROR_STRONG = re.compile(
    r"^(?:E\s+)?(?:Traceback \(most recent call last\)|[\w.]*(?:Error|Exception)(?::|$)"
    r"|FAILED\b|FAIL:|ERROR\b|(?:error|fatal|panic)(?:\[\w+\])?:)"
)
_ERROR_WEAK = re.compile(r"\b[\w.]*(?:Error|Exception|error):\s|\bfailed\b|\bFAILED\b")
COMMENT = ("#", "//", "/*", "* ")
WORD = re.compile(r"[a-z][a-z0-9_']{3,}|\d+(?:[.:]\d+)*")

DECISION = re.compile(
    r"\b(?:decided|decision|chose|choose|will use|going with|instead of|switched to|agreed|"
    r"conclusion|root cause|the fix|fixed|resolved|confirmed|because)\b",
    re.IGNORECASE,
)
PENDING = re.compile(
    r"\b(?:next step|next,|todo|to do|remaining|pending|still need|needs? to|will now|not yet|left to)\b",
    re.IGNORECASE,
)
CONSTRAINT = re.compile(
    r"\b(?:don't|do not|never|always|must|should|instead|actually|prefer|make sure|only|"
    r"without|no longer|stop|wrong|rather)\b",
    re.IGNORECASE,
)
_MEANINGFUL = re.compile(r"[A-Za-z0-9]")
SENTENCE_SPLIT = re.compile(r"(?<=[.!?;])\s+(?=[A-Z0-9`\"'(\[])")
# A "Name: " label opening a transcript line; sentences split off the line keep it, so a
# summary line still says who said what.
SPEAKER = re.compile(r"^[A-Z][a-z][\w'.-]{0,30}(?: [A-Z][a-z][\w'.-]{0,30}){0,2}:\s+(?=\S)")
TAG_LINE = re.compile(r"^</?[a-z_][\w\-]*(?:\s[^>]*)?>$")
_WRAPPED = re.compile(r"^<([a-z_][\w\-]*)>([^<]{0,80})</\1>$")
_STOPWORD_TEXT: Final = (
    "this that with from have what when where which will would could should there their about into "
    "your than then them they were been being does done make just also some more most only other "
    "please thanks thank want need like over such very here"
)
_STOPWORDS: Final = frozenset(_STOPWORD_TEXT.split())

# First matching rule classifies a section title; the order resolves titles that mention
# several things ("Current Task Facts, Decisions..." is about facts, not the task).
_SECTION_RULES: Final = (
    ("paths", ("relevant files", "structure")),
    ("critical", ("critical",)),
    ("pending", ("pending", "next", "resume", "open work", "remaining", "todo")),
    ("decision", ("decision", "fact", "finding", "durable", "conclusion")),
    ("error", ("blocker", "risk", "verification", "error", "evidence", "fix", "invalid")),
    ("request", ("request", "task", "intent", "goal", "user message")),
    ("constraint", ("constraint", "preference", "requirement", "acceptance", "criteria")),
    ("file", ("file", "code", "artifact", "concept", "understanding", "codebase", "repository")),
    ("work", ("work", "execution", "progress", "state", "performed", "histor", "solving", "status")),
)
# Keywords match at a word start: "artifacts" must not count as "facts".
_SECTION_PATTERNS: Final = tuple(
    (category, re.compile(r"\b(?:" + "|".join(re.escape(k) for k in keys) + ")"))
    for category, keys in _SECTION_RULES
)


def classify_title(title: str) -> str:
    """The kind of content a section title asks for (``other`` when none matches)."""
    lowered = title.casefold()
    for category, pattern in _SECTION_PATTERNS:
        if pattern.search(lowered):
            return category
    return "other"


def collapse(text: str) -> str:
    """``text`` with every run of whitespace as one space."""
    return " ".join(text.split())


def meaningful(text: str) -> bool:
    """True when ``text`` holds a letter or a digit."""
    return _MEANINGFUL.search(text) is not None


def clip(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` within ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def is_error(line: str) -> bool:
    """True for a line that reports an error (stripped input; comments never do)."""
    if line.startswith(COMMENT):
        return False
    return _ERROR_STRONG.match(line) is not None or _ERROR_WEAK.search(line) is not None


def words_of(text: str) -> frozenset[str]:
    """The content words of ``text`` (casefolded, stopwords left out)."""
    return frozenset(w for w in WORD.findall(text.casefold()) if w not in _STOPWORDS)


def line_features(text: str, query_words: frozenset[str]) -> tuple[float, frozenset[str], list[str]]:
    """The feature value of a line, its content words and the paths it names."""
    numbers = min(len(NUMBER.findall(text)), 6)
    dates = len(DATE.findall(text))
    names = min(len(NAME.findall(text)) - (1 if text[:1].isupper() else 0), 6)
    paths: list[str] = PATH.findall(text)
    idents = min(len(IDENT.findall(text)), 6)
    errors = 1 if is_error(text) else 0
    words = words_of(text)
    overlap = len(query_words & words) if query_words else 0
    value = (
        0.8 * numbers
        + 2.0 * dates
        + 0.5 * max(names, 0)
        + 1.5 * min(len(paths), 4)
        + 0.5 * idents
        + 3.0 * errors
        + 2.0 * overlap
    )
    return value, words, paths


def scan(text: str) -> list[tuple[str, bool]]:
    """Non-trivial lines with an is-error flag; ``<tag>value</tag>`` becomes ``tag=value``."""
    out: list[tuple[str, bool]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not meaningful(line) or TAG_LINE.match(line):
            continue
        wrapped = _WRAPPED.match(line)
        if wrapped:
            line = f"{wrapped.group(1)}={wrapped.group(2)}"
        line = clip(collapse(line), 200)
        out.append((line, is_error(line)))
    return out
