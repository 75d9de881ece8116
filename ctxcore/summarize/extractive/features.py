"""Line features, section rules and error detection of the extractive summariser.

A candidate line is worth a prior for its kind plus the rarity of its words (in
``select``). Section titles (of a contract or of an earlier summary) are classified by
keyword so lines can be routed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from ctxcore.markers import INTERNAL_USER_PREFIXES, TRUNCATED

__all__ = [
    "COMMENT",
    "CONSTRAINT",
    "DECISION",
    "ELLIPSIS",
    "MAX_LINE_CHARS",
    "PATH",
    "PENDING",
    "SENTENCE_SPLIT",
    "SPEAKER",
    "agent_line_kind",
    "classify_title",
    "clip",
    "collapse",
    "earlier_lines",
    "head_words",
    "is_error",
    "line_features",
    "meaningful",
    "scan",
    "split_tag",
    "spoken_runs",
    "tail_words",
    "tool_tag",
    "words_of",
]

ELLIPSIS: Final = " … "
MAX_LINE_CHARS = 320

PATH = re.compile(
    r"(?:~|\.{1,2})?/?(?:[\w.@-]+/)+[\w.@-]+"
    r"|\b[\w-]+\.(?:py|pyi|js|ts|tsx|jsx|go|rs|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|md|rst|txt|json|"
    r"yaml|yml|toml|ini|cfg|conf|lock|csv|sql|sh|html|css|xml|ipynb|env)\b"
)
# Error lines as tools print them. Anchored forms ("ValueError: ...", "Traceback ...",
# "FAILED ...", unittest's "FAIL: test (Case)", "error: ...") are strong; the unanchored
# ones still need a colon and a message, so source code such as "except ValueError:" or
# "raise TypeError(" is not one.
_ERROR_STRONG = re.compile(
    r"^(?:E\s+)?(?:Traceback \(most recent call last\)|[\w.]*(?:Error|Exception)(?::|$)"
    r"|FAILED\b|FAIL:|ERROR\b|(?:error|fatal|panic)(?:\[\w+\])?:)"
)
# "error:" must start a word: a parameter such as "raiseerror: bool" is no error.
_ERROR_WEAK = re.compile(r"\b(?:[\w.]*(?:Error|Exception)|error):\s|\bfailed\b|\bFAILED\b")
# The header of a Python traceback says only that frames follow: never a line of its own.
_TRACEBACK_START = "Traceback (most recent call last)"
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
# A word: two letters or digits in a row, or one digit. A line without one (binary noise,
# a rule of dashes, a code fence) is never a summary line.
_MEANINGFUL = re.compile(r"[^\W_]{2,}|\d")
# The source tag a summary line starts with (after its bullet): who wrote what it says.
_SOURCE_TAG = re.compile(r"^(user|assistant|tool [^\s:]+):\s+(?=\S)")
SENTENCE_SPLIT = re.compile(r"(?<=[.!?;])\s+(?=[A-Z0-9`\"'(\[])")
# A "Name: " label opening a transcript line; sentences split off the line keep it, so a
# summary line still says who said what.
SPEAKER = re.compile(r"^[A-Z][a-z][\w'.-]{0,30}(?: [A-Z][a-z][\w'.-]{0,30}){0,2}:\s+(?=\S)")
TAG_LINE = re.compile(r"^</?[a-z_][\w\-]*(?:\s[^>]*)?>$")
# Markdown headings and whole-line bold titles; numbered lines are content, not headings.
_HEADING = re.compile(r"^(?:#{1,6}\s+(.+?)|\*\*(.+?)\*\*):?\s*$")
_BOILERPLATE_TAGS: Final = ("meaning", "conflict_policy", "coverage", "instruction")
_HEADER_LINE = re.compile(
    r"^(?:processor|type|scope|authority|instruction_status|conflict_priority|type_note|strategy_status|"
    r"tool_action_state_status|covers):",
)
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
    # The pipeline blocks' "Task state": the work in progress (requests, steps, tool calls).
    ("work", ("task state",)),
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
    """True when ``text`` holds a word (two letters or digits in a row, or a digit)."""
    return _MEANINGFUL.search(text) is not None


def split_tag(line: str) -> tuple[str, str]:
    """``(tag, rest)`` of a summary line without its bullet; ``("", line)`` when untagged."""
    match = _SOURCE_TAG.match(line)
    if match is None:
        return "", line
    return match.group(1), line[match.end() :]


def spoken_runs(text: str) -> list[list[str]]:
    """The sentences of what one speaker said, in runs: a summary line that joined a
    speaker's sentences separates the ones not next to each other by an elision."""
    runs = [[p.strip() for p in SENTENCE_SPLIT.split(part) if p.strip()] for part in text.split(ELLIPSIS)]
    return [run for run in runs if run]


def tool_tag(name: str | None) -> str:
    """The source tag of a tool's output: ``tool <name>`` (one word)."""
    word = "_".join((name or "").split()).replace(":", "_")
    return f"tool {word or 'unknown'}"


def head_words(text: str, chars: int) -> str:
    """The longest prefix of ``text`` within ``chars`` characters that ends at a word end."""
    if chars >= len(text):
        return text
    if chars <= 0:
        return ""
    if text[chars].isspace():
        return text[:chars].rstrip()
    cut = max(text.rfind(" ", 0, chars), text.rfind("\n", 0, chars), text.rfind("\t", 0, chars))
    return text[:cut].rstrip() if cut > 0 else ""


def tail_words(text: str, chars: int) -> str:
    """The longest suffix of ``text`` within ``chars`` characters that starts at a word start."""
    if chars >= len(text):
        return text
    if chars <= 0:
        return ""
    start = len(text) - chars
    if text[start - 1].isspace():
        return text[start:].lstrip()
    match = re.search(r"\s", text[start:])
    return text[start + match.start() :].lstrip() if match else ""


def clip(text: str, limit: int = MAX_LINE_CHARS, *, mark: bool = False) -> str:
    """``text`` within ``limit`` characters, cut at a word end (never inside a word).

    ``mark`` ends a cut text with `` …``. A first word longer than ``limit`` (a hash, a
    blob) is kept whole when it fits ``MAX_LINE_CHARS``, else the result is empty.
    """
    if len(text) <= limit:
        return text
    suffix = " …" if mark else ""
    head = head_words(text, limit - len(suffix))
    if head:
        return head + suffix
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    if len(first) > MAX_LINE_CHARS:
        return ""
    return first + (suffix if len(first) < len(text.strip()) else "")


def is_error(line: str) -> bool:
    """True for a line that reports an error (stripped input; comments never do)."""
    if line.startswith(COMMENT):
        return False
    return _ERROR_STRONG.match(line) is not None or _ERROR_WEAK.search(line) is not None


def opens_with_error(line: str) -> bool:
    """True for a line that is an error report from its first word ("ValueError: ...",
    "FAILED ..."), not one that mentions a failure on the way ("... -> 3 failed")."""
    return not line.startswith(COMMENT) and _ERROR_STRONG.match(line) is not None


def words_of(text: str) -> frozenset[str]:
    """The content words of ``text`` (casefolded, stopwords left out)."""
    return frozenset(w for w in WORD.findall(text.casefold()) if w not in _STOPWORDS)


def line_features(text: str) -> tuple[frozenset[str], list[str]]:
    """The content words of a line and the paths it names.

    A line is worth its kind's prior and the rarity of its words; a hand-weighted count of
    its numbers, dates, names, paths, identifiers, errors and words of the request lost
    next-step references on both development halves and went (bench/README, issue 33).
    """
    paths: list[str] = PATH.findall(text)
    return words_of(text), paths


def scan(text: str) -> list[tuple[str, bool]]:
    """Non-trivial lines with an is-error flag; ``<tag>value</tag>`` becomes ``tag=value``."""
    out: list[tuple[str, bool]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not meaningful(line) or TAG_LINE.match(line) or line.startswith(_TRACEBACK_START):
            continue
        wrapped = _WRAPPED.match(line)
        if wrapped:
            line = f"{wrapped.group(1)}={wrapped.group(2)}"
        line = clip(collapse(line), 200)
        if line:
            out.append((line, is_error(line)))
    return out


def _skipped(line: str) -> bool:
    """Block headers, markers, tags and empty-section notes: never content."""
    return (
        not line
        or TAG_LINE.match(line) is not None
        or line.startswith(INTERNAL_USER_PREFIXES)
        or line.startswith("[[")
        or line == TRUNCATED
        or _HEADER_LINE.match(line) is not None
        or line.casefold() in ("(none)", "none", "summary:")
    )


def earlier_lines(text: str) -> Iterator[tuple[str, str, str]]:
    """``(section, tag, line)`` for each content line of an earlier summary: the heading
    it sat under ("" before any), its source tag ("" untagged) and its text."""
    section = ""
    skipping = ""
    for raw in text.splitlines():
        line = raw.strip()
        if skipping:
            if line.startswith(f"</{skipping}>") or line.endswith(f"</{skipping}>"):
                skipping = ""
            continue
        opened = next((t for t in _BOILERPLATE_TAGS if line.startswith(f"<{t}")), "")
        if opened:
            if f"</{opened}>" not in line:
                skipping = opened
            continue
        if _skipped(line):
            continue
        heading = _HEADING.match(line)
        if heading and len(line) < 90:
            section = (heading.group(1) or heading.group(2) or "").strip()
            continue
        if line.startswith("Summary:"):
            line = line[len("Summary:") :]
        tag, rest = split_tag(line.lstrip("-*• ").strip())
        yield section, tag, rest


def agent_line_kind(line: str) -> str:
    """What a line of the agent's own text is, for its prior."""
    if is_error(line):
        return "error"
    if PENDING.search(line):
        return "pending"
    if DECISION.search(line):
        return "decision"
    return "work"
