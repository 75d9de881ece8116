"""``ExtractiveModel``: the offline, deterministic summariser (the embedded default).

It never reads the prompt's wording: it works from the ``OutputContract`` the compressor
passes beside the prompt. From the contract's source messages it collects candidate
lines: the user's own requests and corrections verbatim, tool calls with a one-line
result, the latest write of each file, errors, decisions, dense facts, and the lines of
earlier summaries. It then picks lines greedily by value per token, where a line's value
is a prior for its kind (a file's latest state, an error, a correction...) plus its
features (numbers, dates, names, paths, identifiers, overlap with the query) plus the
rarity of the words it would add that the summary does not hold yet. Chosen lines are
printed in their original order, routed to the contract's sections or blocks, never over
the token target. Same input, same output; no endpoint, no key.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from ctxcore.markers import INTERNAL_USER_PREFIXES
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from ctxcore.summarize.model import Completion, ContractBlock, OutputContract, Usage
from ctxcore.tokens import TiktokenCounter, TokenCounter
from ctxcore.turns import is_real_user, tool_callers

__all__ = ["ExtractiveModel"]

ELLIPSIS: Final = " … "
_MAX_LINE_CHARS = 320
_MIN_FILL_TOKENS = 6
# After this many candidates in a row that do not fit, the rest will not either.
_MAX_SKIPS = 400

# --- features -------------------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,:]\d+)*%?(?![\w])")
_DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    r"|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2}\b"
    r"|\b\d{1,2} (?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*,? \d{4}\b",
    re.IGNORECASE,
)
_NAME = re.compile(r"\b[A-Z][a-z]{2,}(?:\s[A-Z][a-z]{2,})*\b")
_PATH = re.compile(
    r"(?:~|\.{1,2})?/?(?:[\w.@-]+/)+[\w.@-]+"
    r"|\b[\w-]+\.(?:py|pyi|js|ts|tsx|jsx|go|rs|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|md|rst|txt|json|"
    r"yaml|yml|toml|ini|cfg|conf|lock|csv|sql|sh|html|css|xml|ipynb|env)\b"
)
_IDENT = re.compile(r"`[^`\n]{1,80}`|\b[A-Za-z]\w*_\w+\b|\b[a-z]+[A-Z]\w+\b|\b\w+\(\)|\b[A-Z]{2,}\d*\b")
# Error lines as tools print them. Anchored forms ("ValueError: ...", "Traceback ...",
# "FAILED ...", unittest's "FAIL: test (Case)", "error: ...") are strong; the unanchored
# ones still need a colon and a message, so source code such as "except ValueError:" or
# "raise TypeError(" is not one.
_ERROR_STRONG = re.compile(
    r"^(?:E\s+)?(?:Traceback \(most recent call last\)|[\w.]*(?:Error|Exception)(?::|$)"
    r"|FAILED\b|FAIL:|ERROR\b|(?:error|fatal|panic)(?:\[\w+\])?:)"
)
_ERROR_WEAK = re.compile(r"\b[\w.]*(?:Error|Exception|error):\s|\bfailed\b|\bFAILED\b")
_COMMENT = ("#", "//", "/*", "* ")
_WORD = re.compile(r"[a-z][a-z0-9_']{3,}|\d+(?:[.:]\d+)*")

_DECISION = re.compile(
    r"\b(?:decided|decision|chose|choose|will use|going with|instead of|switched to|agreed|"
    r"conclusion|root cause|the fix|fixed|resolved|confirmed|because)\b",
    re.IGNORECASE,
)
_PENDING = re.compile(
    r"\b(?:next step|next,|todo|to do|remaining|pending|still need|needs? to|will now|not yet|left to)\b",
    re.IGNORECASE,
)
_CONSTRAINT = re.compile(
    r"\b(?:don't|do not|never|always|must|should|instead|actually|prefer|make sure|only|"
    r"without|no longer|stop|wrong|rather)\b",
    re.IGNORECASE,
)
_WRITE_TOOL = re.compile(
    r"write|edit|create|patch|apply|replace|save|update|insert|append|delete|remove|rename|move|mkdir"
)
_TASK_TOOL = re.compile(r"todo|task|plan")
_MEANINGFUL = re.compile(r"[A-Za-z0-9]")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?;])\s+(?=[A-Z0-9`\"'(\[])")
# A "Name: " label opening a transcript line; sentences split off the line keep it, so a
# summary line still says who said what.
_SPEAKER = re.compile(r"^[A-Z][a-z][\w'.-]{0,30}(?: [A-Z][a-z][\w'.-]{0,30}){0,2}:\s+(?=\S)")
# Markdown headings and whole-line bold titles; numbered lines are content, not headings.
_HEADING = re.compile(r"^(?:#{1,6}\s+(.+?)|\*\*(.+?)\*\*):?\s*$")
_SECTION_LIKE = re.compile(r"(?m)^(#|</?state_snapshot>)")
_TAG_LINE = re.compile(r"^</?[a-z_][\w\-]*(?:\s[^>]*)?>$")
_WRAPPED = re.compile(r"^<([a-z_][\w\-]*)>([^<]{0,80})</\1>$")
# Shell commands that write a file: redirection (not "2>&1"), tee, in-place sed.
_REDIRECT = re.compile(r"(?<![0-9&<>-])>>?\s*([\w./~@-]+)")
_TEE = re.compile(r"\btee\s+(?:-a\s+)?([\w./~@-]+)")
_SED_INPLACE = re.compile(r"\bsed\s+(?:-\w+\s+)*-i")
_FILE_TOKEN = re.compile(r"[\w./~@-]+\.\w+")
_BOILERPLATE_TAGS: Final = ("meaning", "conflict_policy", "coverage", "instruction")
_HEADER_LINE = re.compile(
    r"^(?:processor|type|scope|authority|instruction_status|conflict_priority|type_note|strategy_status|"
    r"tool_action_state_status|covers):",
)
_PATH_KEYS: Final = ("path", "file_path", "filepath", "file", "filename", "notebook_path")
_STOPWORD_TEXT: Final = (
    "this that with from have what when where which will would could should there their about into "
    "your than then them they were been being does done make just also some more most only other "
    "please thanks thank want need like over such very here"
)
_STOPWORDS: Final = frozenset(_STOPWORD_TEXT.split())

# --- sections -------------------------------------------------------------------------------

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
_ROUTES: Final = MappingProxyType(
    {
        "request": ("request", "constraint", "work"),
        "constraint": ("constraint", "request", "decision"),
        "tool": ("work", "file"),
        "file": ("file", "paths", "work"),
        "paths": ("paths", "file"),
        "error": ("error", "decision", "pending"),
        "decision": ("decision", "work"),
        "pending": ("pending", "work"),
        "work": ("work",),
        "fact": ("decision",),
        "chat": ("decision",),
        "other": (),
    }
)
# Prior value of a line by what it is; the words it covers and its features add to it.
_BASE_SCORE: Final = MappingProxyType(
    {
        "request": 8.0,
        "constraint": 12.0,
        "error": 10.0,
        "file": 15.0,
        "tool": 6.0,
        "pending": 6.0,
        "decision": 6.0,
        "work": 2.0,
        "fact": 3.0,
        "paths": 2.0,
        "other": 1.0,
        # A sentence of a dialogue: no prior at all, it is worth what it says.
        "chat": 0.0,
    }
)
_MUST_FIRST = 1e9
_MUST_LAST = 1e8
# A summary that is nothing but a long task statement has lost the work; the anchors are
# pinned verbatim outside summaries anyway, so here they get a bounded share.
_FIRST_SHARE = 0.35
_LAST_SHARE = 0.2
# Each further line from one message is worth this much less than the one before.
_DECAY = 0.6
# Value per cost**_COST_EXPONENT: below 1 so that the selection does not degrade into a
# heap of three-word fragments, close to 1 so that long low-content lines lose.
_COST_EXPONENT = 0.75
_LINE_OVERHEAD = 2
_RECENCY = 2.0
_FILE_SHARE = 0.2


# Keywords match at a word start: "artifacts" must not count as "facts".
_SECTION_PATTERNS: Final = tuple(
    (category, re.compile(r"\b(?:" + "|".join(re.escape(k) for k in keys) + ")"))
    for category, keys in _SECTION_RULES
)


def _classify_title(title: str) -> str:
    lowered = title.casefold()
    for category, pattern in _SECTION_PATTERNS:
        if pattern.search(lowered):
            return category
    return "other"


@dataclass
class _Item:
    """A candidate line: where it came from, what it is and what it is worth.

    ``static`` is its prior plus its features; ``words`` the content words it would add
    to the summary (each worth its rarity in the source, once); ``decay`` discounts the
    second, third... line taken from one message.
    """

    order: tuple[int, int]
    category: str
    text: str
    static: float
    key: str
    words: frozenset[str] = frozenset()
    must: bool = False
    # For anchors: the largest share of the budget they may take whole.
    share: float = 1.0
    decay: float = 1.0
    tokens: int = field(default=-1, compare=False)
    # A line of an earlier summary: chosen on its own once already, so the lines of one
    # memory block do not share a message's diminishing returns.
    independent: bool = False

    @property
    def weight(self) -> float:
        """The line's value without coverage, used to drop the weakest line first."""
        return self.static * self.decay


def _user_key(text: str) -> str:
    # Harness messages repeat word for word (format reminders); one copy is enough.
    return "user:" + " ".join(text.split()).casefold()


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int = _MAX_LINE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _is_error(line: str) -> bool:
    """True for a line that reports an error (stripped input; comments never do)."""
    if line.startswith(_COMMENT):
        return False
    return _ERROR_STRONG.match(line) is not None or _ERROR_WEAK.search(line) is not None


def _scan(text: str) -> list[tuple[str, bool]]:
    """Non-trivial lines with an is-error flag; ``<tag>value</tag>`` becomes ``tag=value``."""
    out: list[tuple[str, bool]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not _MEANINGFUL.search(line) or _TAG_LINE.match(line):
            continue
        wrapped = _WRAPPED.match(line)
        if wrapped:
            line = f"{wrapped.group(1)}={wrapped.group(2)}"
        line = _clip(_collapse(line), 200)
        out.append((line, _is_error(line)))
    return out


def _result_line(lines: Sequence[tuple[str, bool]]) -> str:
    """What a tool call did: its first error line if any, else its first meaningful line
    (plus the next one when the first is as terse as ``returncode=0``)."""
    if not lines:
        return ""
    error = next((line for line, is_error in lines if is_error), None)
    if error is not None:
        return error
    first = lines[0][0]
    if len(first) < 24 and len(lines) > 1:
        return f"{first} | {lines[1][0]}"
    return first


def _short_value(value: Any) -> str:
    if isinstance(value, str):
        flat = _collapse(value)
        limit = 120 if _PATH.fullmatch(flat) else 80
        return json.dumps(_clip(flat, limit), ensure_ascii=False)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return _clip(text, 40)


def _parse_args(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None


def _args_short(arguments: str, parsed: Any) -> str:
    if isinstance(parsed, dict):
        text = ", ".join(f"{k}={_short_value(v)}" for k, v in parsed.items())
    else:
        text = _collapse(arguments)
    return _clip(text, 160)


def _shell_write_target(command: str) -> str | None:
    """The file a shell command writes, if it visibly writes one."""
    if _SED_INPLACE.search(command):
        # The sed script is quoted; the files follow the last quote.
        files: list[str] = _FILE_TOKEN.findall(command.rsplit("'", 1)[-1])
        if files:
            return files[-1]
    first = command.split("\n", 1)[0]
    match = _REDIRECT.search(first) or _TEE.search(first)
    if match is None:
        return None
    target = str(match.group(1))
    return None if target.startswith("/dev/") else target


def _shell_removed(command: str) -> list[str]:
    """Files a shell command visibly deletes (``rm a.py b.py``)."""
    first = command.split("\n", 1)[0]
    removed: list[str] = []
    for part in re.split(r"&&|;|\|\|", first):
        words = part.split()
        if words and words[0] == "rm":
            removed.extend(w for w in words[1:] if not w.startswith("-"))
    return removed


def _writes_file(name: str, written: str | None, path: str | None) -> bool:
    """True when a tool call writes a file (by its name or its shell command)."""
    return bool(written) or (path is not None and _WRITE_TOOL.search(name) is not None)


def _call_path(call: ToolCall, parsed: Any) -> str | None:
    if isinstance(parsed, dict):
        for key in _PATH_KEYS:
            value = parsed.get(key)
            if isinstance(value, str) and _PATH.search(value):
                return value.strip()
    match = _PATH.search(call.arguments)
    return match.group(0) if match else None


class _Extractor:
    """Builds scored candidates from source messages (one instance per call)."""

    def __init__(self, query_words: frozenset[str], known: frozenset[str], with_paths: bool) -> None:
        self.query_words = query_words
        self.known = known
        self.with_paths = with_paths
        self.items: list[_Item] = []
        # Path -> how much it matters: written > used by a tool > merely mentioned.
        self.paths: dict[str, float] = {}
        self._scans: dict[int, list[tuple[str, bool]]] = {}
        # Files deleted later in the source: their last write is no longer current state.
        self.removed: dict[str, tuple[int, int]] = {}

    # scoring

    def note_path(self, path: str, weight: float) -> None:
        if self.with_paths:
            self.paths[path] = max(self.paths.get(path, 0.0), weight)

    def features(self, text: str) -> tuple[float, frozenset[str]]:
        """The feature value of a line and its content words."""
        numbers = min(len(_NUMBER.findall(text)), 6)
        dates = len(_DATE.findall(text))
        names = min(len(_NAME.findall(text)) - (1 if text[:1].isupper() else 0), 6)
        paths = _PATH.findall(text)
        idents = min(len(_IDENT.findall(text)), 6)
        errors = 1 if _is_error(text) else 0
        words = frozenset(w for w in _WORD.findall(text.casefold()) if w not in _STOPWORDS)
        overlap = len(self.query_words & words) if self.query_words else 0
        if self.with_paths:
            for path in paths:
                self.note_path(path, 1.0)
        value = (
            0.8 * numbers
            + 2.0 * dates
            + 0.5 * max(names, 0)
            + 1.5 * min(len(paths), 4)
            + 0.5 * idents
            + 3.0 * errors
            + 2.0 * overlap
        )
        return value, words

    def add(
        self,
        order: tuple[int, int],
        category: str,
        text: str,
        *,
        key: str | None = None,
        bonus: float = 0.0,
        independent: bool = False,
    ) -> None:
        text = text.strip()
        if len(text) < 3 or not _MEANINGFUL.search(text):
            return
        text = _clip(text)
        norm = key or _collapse(text).casefold()
        value, words = self.features(text)
        static = _BASE_SCORE[category] + bonus + value
        if norm in self.known:
            static *= 0.3
        self.items.append(_Item(order, category, text, static, norm, words, independent=independent))

    def anchor(self, index: int, text: str, priority: float, category: str, share: float) -> None:
        """A user message always kept: verbatim within ``share`` of the budget, else shortened."""
        words = self.features(text[:20_000])[1]
        self.items.append(
            _Item(
                (index, 0), category, text.strip(), priority, _user_key(text), words, must=True, share=share
            )
        )

    def user(self, index: int, text: str) -> None:
        """A real user message between the anchors: verbatim, competing on content."""
        category = "constraint" if _CONSTRAINT.search(text) else "request"
        stripped = text.strip()
        if len(stripped) <= 2 * _MAX_LINE_CHARS:
            if _MEANINGFUL.search(stripped):
                value, words = self.features(stripped)
                static = _BASE_SCORE[category] + value
                self.items.append(_Item((index, 0), category, stripped, static, _user_key(stripped), words))
            return
        self.lines(index, text, lambda _line: category)

    def dialogue(self, index: int, text: str) -> None:
        """A turn of a tool-free dialogue: every sentence is a fact of its own.

        Without tools, neither side is narrating agent work: what both say is the content
        (a chat between people, questions and answers), so both compete on content alone
        and a long turn can give its one informative sentence without its small talk.
        """
        sub = 0
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            label = _SPEAKER.match(line)
            prefix = label.group(0) if label else ""
            for piece in _SENTENCE_SPLIT.split(line[len(prefix) :]):
                sub += 1
                self.chat((index, sub), prefix, piece, independent=True)

    def chat(self, order: tuple[int, int], prefix: str, piece: str, *, independent: bool = False) -> None:
        """One dialogue sentence; its speaker label is printed but scores nothing, and a
        sentence without a content word ("Cool!", "Thanks, Mel!") is no candidate."""
        piece = piece.strip()
        value, words = self.features(piece)
        if not words or not _MEANINGFUL.search(piece):
            return
        text = _clip(f"{prefix}{piece}")
        norm = _collapse(text).casefold()
        static = _BASE_SCORE["chat"] + value
        if norm in self.known:
            static *= 0.3
        self.items.append(_Item(order, "chat", text, static, norm, words, independent=independent))

    # sources

    def lines(self, index: int, text: str, classify: Callable[[str], str]) -> None:
        sub = 0
        for raw in text.splitlines():
            line = raw.strip().lstrip("-*• ").strip()
            if not line:
                continue
            pieces = _SENTENCE_SPLIT.split(line) if len(line) > _MAX_LINE_CHARS else [line]
            for piece in pieces:
                sub += 1
                self.add((index, sub), classify(piece), piece)

    def memory_block(self, index: int, text: str) -> None:
        """Lines of an earlier summary, routed by the heading they sat under."""
        category = "fact"
        skipping = ""
        sub = 0
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
            if (
                not line
                or _TAG_LINE.match(line)
                or line.startswith(INTERNAL_USER_PREFIXES)
                or line.startswith("[[")
                or _HEADER_LINE.match(line)
                or line.casefold() in ("(none)", "none", "summary:")
            ):
                continue
            heading = _HEADING.match(line)
            if heading and len(line) < 90:
                title = heading.group(1) or heading.group(2) or ""
                kind = _classify_title(title)
                category = {"critical": "fact", "other": "fact", "paths": "file"}.get(kind, kind)
                continue
            if line.startswith("Summary:"):
                line = line[len("Summary:") :]
            sub += 1
            line = line.lstrip("-*• ").strip()
            label = _SPEAKER.match(line)
            if label is not None and not _is_error(line):
                # A dialogue sentence kept by an earlier summary competes as one again
                # ("ValueError: ..." is an error line, not a speaker's).
                self.chat((index, sub), label.group(0), line[label.end() :], independent=True)
                continue
            # Lines of an earlier summary were already chosen once; requests carried over
            # from it outrank ordinary facts.
            self.add(
                (index, sub), category, line, bonus=3.0 if category == "request" else 1.0, independent=True
            )

    def assistant(self, index: int, message: AssistantMessage) -> None:
        def classify(line: str) -> str:
            if _is_error(line):
                return "error"
            if _PENDING.search(line):
                return "pending"
            if _DECISION.search(line):
                return "decision"
            return "work"

        self.lines(index, message.text, classify)

    def scanned(self, index: int, message: ToolMessage) -> list[tuple[str, bool]]:
        """The scanned lines of a tool result, computed once per message."""
        lines = self._scans.get(index)
        if lines is None:
            lines = self._scans[index] = _scan(message.text)
        return lines

    def tool_call(
        self, index: int, pos: int, call: ToolCall, result: ToolMessage | None, result_index: int
    ) -> str:
        """Add the one-line item for a call; returns the result line it used."""
        parsed = _parse_args(call.arguments)
        head = f"{call.name}({_args_short(call.arguments, parsed)})"
        failed = result is not None and result.metadata.get("is_error") is True
        line = ""
        if result is None:
            shown = "(no result)"
        else:
            line = _result_line(self.scanned(result_index, result))
            shown = line or "(empty)"
            if result.metadata.get("cancelled") is True:
                shown = f"(cancelled) {shown}"
        item_text = f"{head} -> {shown}"
        name = call.name.casefold()
        path = _call_path(call, parsed)
        command = parsed.get("command") if isinstance(parsed, dict) else None
        written = _shell_write_target(command) if isinstance(command, str) else None
        order = (index, 10_000 + pos)
        if failed or _is_error(line):
            self.add(order, "error", item_text)
        elif _writes_file(name, written, path):
            target = written or path or ""
            # Keyed by path: only the last write of each file survives deduplication, and
            # the path leads so that clipping the arguments never hides it.
            brief = f"{call.name}({_clip(_args_short(call.arguments, parsed), 60)}) -> {shown}"
            self.add(order, "file", f"{target} <- {brief}", key=f"file:{target}")
        elif _TASK_TOOL.search(name):
            self.add(order, "pending", item_text, key=f"task:{name}")
        else:
            self.add(order, "tool", item_text)
        if path:
            self.note_path(path, 6.0 if _writes_file(name, written, path) else 3.0)
        if written:
            self.note_path(written, 6.0)
        if isinstance(command, str) and not failed:
            for gone in _shell_removed(command):
                self.removed[gone] = order
        return line

    def tool_output(self, index: int, message: ToolMessage, used: str) -> None:
        """Error lines and dense lines of a tool result beyond the one already shown."""
        sub = 0
        shown = set(used.split(" | "))
        for line, is_error in self.scanned(index, message):
            if len(line) < 3 or line in shown:
                continue
            sub += 1
            if is_error:
                self.add((index, sub), "error", line)
            elif (
                not line.startswith(_COMMENT)
                and len(line.split()) >= 4
                and (_PATH.search(line) or _DATE.search(line))
            ):
                # A bare path is a directory listing; a path with words around it
                # (a grep hit, a log line) says something about it.
                self.add((index, sub), "fact", line)


def _extract(
    source: Sequence[AnyMessage],
    *,
    query: str,
    instruction: str,
    context: Sequence[AnyMessage],
    with_paths: bool,
) -> tuple[list[_Item], dict[str, float], frozenset[str]]:
    """Candidates in source order, the rarity (idf) of their words, and the words the
    reference context already covers."""
    words = {w for w in _WORD.findall(f"{query} {instruction}".casefold()) if w not in _STOPWORDS}
    known: set[str] = set()
    context_words: set[str] = set()
    for message in context:
        text = message.text
        context_words.update(w for w in _WORD.findall(text.casefold()) if w not in _STOPWORDS)
        for raw in text.splitlines():
            line = raw.strip().lstrip("-*• ").strip()
            if line:
                known.add(_collapse(line).casefold())
    ex = _Extractor(frozenset(words), frozenset(known), with_paths)

    real = [i for i, m in enumerate(source) if is_real_user(m)]
    real_set = frozenset(real)
    first_real = real[0] if real else None
    last_real = real[-1] if real else None
    callers = tool_callers(source)
    # Turns of people talking, with no tool activity, are a dialogue: see ``_Extractor.dialogue``.
    dialogue = (
        bool(real)
        and not callers
        and not any(isinstance(m, AssistantMessage) and m.tool_calls for m in source)
    )
    results: dict[tuple[int, str], int] = {}
    for tool_index, caller in callers.items():
        tool = source[tool_index]
        if isinstance(tool, ToolMessage):
            results.setdefault((caller, tool.tool_call_id), tool_index)
    used_lines: dict[int, str] = {}

    for index, message in enumerate(source):
        if isinstance(message, SystemMessage):
            # Short system notes in a log are markers such as a session's date line.
            if len(message.text) <= _MAX_LINE_CHARS:
                ex.add((index, 0), "fact", _collapse(message.text), bonus=2.0)
            continue
        if isinstance(message, UserMessage):
            if index == first_real:
                ex.anchor(index, message.text, _MUST_FIRST, "request", _FIRST_SHARE)
            elif index == last_real:
                category = "constraint" if _CONSTRAINT.search(message.text) else "request"
                ex.anchor(index, message.text, _MUST_LAST, category, _LAST_SHARE)
            elif index in real_set:
                if dialogue:
                    ex.dialogue(index, message.text)
                else:
                    ex.user(index, message.text)
            else:
                ex.memory_block(index, message.text)
        elif isinstance(message, AssistantMessage):
            if dialogue:
                ex.dialogue(index, message.text)
            else:
                ex.assistant(index, message)
            for pos, call in enumerate(message.tool_calls):
                found = results.get((index, call.id))
                result = source[found] if found is not None else None
                line = ex.tool_call(
                    index,
                    pos,
                    call,
                    result if isinstance(result, ToolMessage) else None,
                    found if found is not None else -1,
                )
                if found is not None:
                    used_lines[found] = line
        elif isinstance(message, ToolMessage):
            if index not in callers:
                ex.add((index, 0), "tool", f"tool result: {_result_line(ex.scanned(index, message))}")
            ex.tool_output(index, message, used_lines.get(index, ""))

    newest = _newest_error(source, ex, real_set)
    if newest is not None:
        index, line = newest
        # The newest failure is what the agent acts on next: kept whatever else competes (a
        # bounded share), under the same key as its ordinary candidate so it prints once.
        # An earlier summary in the source counts too, so the line survives later merges.
        ex.items.append(
            _Item(
                (index, 10**6),
                "error",
                line,
                _BASE_SCORE.get("error", 10.0),
                _collapse(line).casefold(),
                frozenset(ex.features(line)[1]),
                must=True,
                share=0.25,
            )
        )

    if with_paths:
        for rank, (path, weight) in enumerate(ex.paths.items()):
            static = _BASE_SCORE["paths"] * weight
            ex.items.append(_Item((len(source), rank), "paths", path, static, f"path:{path}"))

    # Deduplicate, keeping the latest occurrence: the most recent state of a file, a
    # task list or a repeated error is the one that matters.
    latest: dict[str, _Item] = {}
    for item in ex.items:
        previous = latest.get(item.key)
        if previous is None or item.order > previous.order or item.must:
            latest[item.key] = item
    kept = [
        it
        for it in latest.values()
        if not (it.category == "file" and ex.removed.get(it.key[len("file:") :], (-1, 0)) > it.order)
    ]
    _diminish(kept)
    # Later lines describe the current state; a mild bonus keeps the resume point.
    span = max(len(source), 1)
    for item in kept:
        if not item.must:
            item.static += _RECENCY * item.order[0] / span
    kept.sort(key=lambda it: it.order)
    return kept, _idf(kept), frozenset(context_words)


def _newest_error(
    source: Sequence[AnyMessage], ex: _Extractor, real: frozenset[int]
) -> tuple[int, str] | None:
    """(index, line) of the last line this summariser's error detector flags: in a tool
    output, or among the lines of an earlier summary in the source."""
    for index in range(len(source) - 1, -1, -1):
        message = source[index]
        if isinstance(message, ToolMessage):
            found = [line for line, is_error in ex.scanned(index, message) if is_error]
        elif isinstance(message, UserMessage) and index not in real:
            lines = (raw.strip().lstrip("-*• ").strip() for raw in message.text.splitlines())
            found = [line for line in lines if line and _is_error(line)]
        else:
            continue
        if found:
            return index, found[-1]
    return None


def _idf(items: Sequence[_Item]) -> dict[str, float]:
    """How rare each word is among the candidates: rare words are what questions ask about."""
    df: dict[str, int] = {}
    for item in items:
        for word in item.words:
            df[word] = df.get(word, 0) + 1
    n = len(items) + 1
    return {w: math.log(n / (c + 0.5)) for w, c in df.items() if c + 0.5 < n}


def _diminish(items: list[_Item]) -> None:
    """Each further line from the same message is worth less than the one before.

    Without this a single test run's forty ``ERROR test_x`` lines outrank every other
    step of the conversation; with it the budget spreads across messages.
    """
    by_message: dict[int, list[_Item]] = {}
    for item in items:
        if not item.must and not item.independent:
            by_message.setdefault(item.order[0], []).append(item)
    for group in by_message.values():
        group.sort(key=lambda it: (-it.static, it.order))
        for rank, item in enumerate(group):
            item.decay = _DECAY**rank


class _Budgeter:
    """Token counting and trimming with one counter."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def count(self, text: str) -> int:
        return self.counter.count_text(text)

    def fit(self, text: str, limit: int, *, head_tail: bool) -> str:
        """The longest prefix (or head + tail) of ``text`` within ``limit`` tokens."""
        if limit <= 0:
            return ""
        if self.count(text) <= limit:
            return text
        lo, hi = 0, len(text)
        best = ""
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = self._cut(text, mid, head_tail)
            if self.count(candidate) <= limit:
                best, lo = candidate, mid + 1
            else:
                hi = mid - 1
        return best

    @staticmethod
    def _cut(text: str, chars: int, head_tail: bool) -> str:
        if chars <= 0:
            return ""
        if head_tail:
            head = (chars * 2 + 2) // 3
            tail = chars - head
            return text[:head].rstrip() + ELLIPSIS + (text[len(text) - tail :].lstrip() if tail else "")
        return text[:chars].rstrip() + "…"


def _bullet(item: _Item) -> str:
    text = item.text
    if "\n" in text:
        # A verbatim message may contain its own "## Heading" lines; indenting those
        # keeps the snapshot's sections unambiguous for any parser.
        text = _SECTION_LIKE.sub(r"  \1", text)
    return f"- {text}\n"


class _Selection:
    """Greedy choice of lines within a budget, valuing each word once (lazy re-scoring).

    Covering words is submodular, so a line's value only falls as others are chosen:
    a popped line whose fresh value still beats the next best in the heap is the true
    best, and the others need not be re-scored (the classic lazy greedy).
    """

    def __init__(self, idf: dict[str, float], covered: frozenset[str], budgeter: _Budgeter) -> None:
        self.idf = idf
        self.covered = set(covered)
        self.budgeter = budgeter

    def value(self, item: _Item) -> float:
        fresh = sum(self.idf.get(w, 0.0) for w in item.words if w not in self.covered)
        return item.decay * (item.static + fresh)

    @staticmethod
    def cost(item: _Item) -> float:
        tokens = item.tokens if item.tokens >= 0 else len(item.text) / 4.0
        return float((tokens + _LINE_OVERHEAD) ** _COST_EXPONENT)

    def tokens(self, item: _Item) -> int:
        if item.tokens < 0:
            item.tokens = self.budgeter.count(_bullet(item))
        return item.tokens

    def run(self, items: Sequence[_Item], budget: int) -> list[_Item]:
        """The chosen items (some shortened) in original order."""
        chosen: list[_Item] = []
        used = 0
        for item in sorted((it for it in items if it.must), key=lambda it: (-it.static, it.order)):
            remaining = budget - used
            room = min(remaining, max(int(budget * item.share), _MIN_FILL_TOKENS))
            if self.tokens(item) > room:
                # The user's own words are kept even when they must be shortened.
                text = self.budgeter.fit(item.text, room - _LINE_OVERHEAD, head_tail=True)
                if not text:
                    continue
                item = _Item(item.order, item.category, text, item.static, item.key, item.words, must=True)
            used += self.tokens(item)
            chosen.append(item)
            self.covered.update(item.words)

        rest = [it for it in items if not it.must]
        # The latest state of each file is reserved a share of the budget first: it is
        # what a resumed agent needs most and its lines are long, so pure value per token
        # would let many short facts crowd it out.
        reserved = [it for it in rest if it.category == "file"]
        if reserved:
            cap = min(budget, used + int(budget * _FILE_SHARE))
            taken, used, _ = self._greedy(reserved, cap, used)
            chosen.extend(taken)
            ids = {id(it) for it in taken}
            rest = [it for it in rest if id(it) not in ids]
        taken, used, skipped = self._greedy(rest, budget, used)
        chosen.extend(taken)
        remaining = budget - used
        if skipped is not None and remaining >= _MIN_FILL_TOKENS + _LINE_OVERHEAD:
            # The best line that did not fit fills the rest of the budget, shortened.
            text = self.budgeter.fit(skipped.text, remaining - _LINE_OVERHEAD, head_tail=False)
            if text:
                trimmed = _Item(skipped.order, skipped.category, text, skipped.static, skipped.key)
                trimmed.decay = skipped.decay
                if self.tokens(trimmed) <= remaining:
                    chosen.append(trimmed)
        return sorted(chosen, key=lambda it: it.order)

    def _greedy(
        self, items: Sequence[_Item], budget: int, used: int
    ) -> tuple[list[_Item], int, _Item | None]:
        """Lazy greedy by value per cost up to ``budget``; (taken, used, best item that missed)."""
        taken: list[_Item] = []
        heap = [(-self.value(it) / self.cost(it), it.order, n) for n, it in enumerate(items)]
        heapq.heapify(heap)
        skipped: _Item | None = None
        misses = 0
        while heap and budget - used >= _MIN_FILL_TOKENS:
            _, order, n = heapq.heappop(heap)
            item = items[n]
            fresh = self.value(item) / self.cost(item)
            if heap and fresh < -heap[0][0]:
                heapq.heappush(heap, (-fresh, order, n))
                continue
            if self.tokens(item) <= budget - used:
                taken.append(item)
                used += item.tokens
                self.covered.update(item.words)
                misses = 0
                continue
            skipped = skipped or item
            misses += 1
            if misses > _MAX_SKIPS:
                break
        return taken, used, skipped


def _route(sections: Sequence[str]) -> Callable[[str], int]:
    kinds = [_classify_title(s) for s in sections]
    critical = next((i for i, k in enumerate(kinds) if k == "critical"), len(sections) - 1)
    table: dict[str, int] = {}
    for category, preferred in _ROUTES.items():
        target = next((kinds.index(p) for p in preferred if p in kinds), critical)
        table[category] = target
    return lambda category: table.get(category, critical)


class ExtractiveModel:
    """A deterministic offline ``ModelClient`` that summarises by extraction.

    It reads the ``OutputContract`` (never the prompt text) and answers in the format the
    contract asks for: a ``<state_snapshot>`` with one ``## <section>`` per contract
    section, or ``{"blocks": [{"block_id", "summary"}]}`` with exactly the contract's block
    ids. Every output stays within its token target as measured by ``counter`` (default
    ``TiktokenCounter()``) and within ``max_tokens``. Without a contract it returns a head
    and tail excerpt of the last user message.
    """

    def __init__(self, counter: TokenCounter | None = None, *, name: str = "extractive") -> None:
        self.counter: TokenCounter = counter if counter is not None else TiktokenCounter()
        self._name = name
        self._budget = _Budgeter(self.counter)

    @property
    def name(self) -> str:
        """``extractive`` unless another name was given."""
        return self._name

    def __repr__(self) -> str:
        return f"ExtractiveModel(name={self._name!r})"

    def complete(
        self,
        messages: Sequence[AnyMessage],
        *,
        max_tokens: int,
        contract: OutputContract | None = None,
    ) -> Completion:
        """Summarise ``contract``'s sources (or excerpt the last user message without one)."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if contract is None:
            text = self._excerpt(messages, max_tokens)
        elif contract.kind == "state_snapshot":
            text = self._snapshot(contract, min(contract.target_tokens, max_tokens))
        else:
            text = self._blocks(contract, max_tokens)
        input_tokens = self.counter.count_messages(messages)
        output_tokens = self.count(text)
        return Completion(
            text, Usage(input_tokens, output_tokens, input_tokens + output_tokens, calls=1, model=self._name)
        )

    def count(self, text: str) -> int:
        """Tokens of ``text`` with this model's counter."""
        return self.counter.count_text(text)

    # --- formats -------------------------------------------------------------------------

    def _excerpt(self, messages: Sequence[AnyMessage], max_tokens: int) -> str:
        last = next((m for m in reversed(messages) if isinstance(m, UserMessage)), None)
        if last is None:
            return ""
        return self._budget.fit(last.text, max_tokens, head_tail=True)

    def _snapshot(self, contract: OutputContract, budget: int) -> str:
        sections = contract.sections or ["Critical Context"]
        skeleton = self._render_snapshot(sections, [[] for _ in sections])
        available = budget - self.count(skeleton)
        if available < _MIN_FILL_TOKENS:
            return self._budget.fit(skeleton, budget, head_tail=False)
        items, idf, covered = _extract(
            contract.source,
            query=contract.query,
            instruction=contract.instruction,
            context=contract.context,
            with_paths="paths" in {_classify_title(s) for s in sections},
        )
        chosen = _Selection(idf, covered, self._budget).run(items, available)
        route = _route(sections)
        while True:
            grouped: list[list[_Item]] = [[] for _ in sections]
            for item in chosen:
                grouped[route(item.category)].append(item)
            text = self._render_snapshot(sections, grouped)
            if self.count(text) <= budget or not chosen:
                return text if self.count(text) <= budget else self._budget.fit(text, budget, head_tail=False)
            # Token counts of joined lines can exceed the sum of their parts by a token
            # or two; drop the weakest line and try again.
            weakest = min(chosen, key=lambda it: (it.must, it.weight, it.order))
            chosen = [it for it in chosen if it is not weakest]

    @staticmethod
    def _render_snapshot(sections: Sequence[str], grouped: Sequence[Sequence[_Item]]) -> str:
        parts = ["<state_snapshot>\n"]
        for title, items in zip(sections, grouped, strict=True):
            parts.append(f"## {title}\n")
            if items:
                parts.extend(_bullet(it) for it in items)
            else:
                parts.append("(none)\n")
        parts.append("</state_snapshot>")
        return "".join(parts)

    def _blocks(self, contract: OutputContract, max_tokens: int) -> str:
        blocks = contract.blocks
        skeleton = self._render_blocks(blocks, ["" for _ in blocks])
        available = max(max_tokens - self.count(skeleton), 0)
        targets = [b.target_tokens for b in blocks]
        total = sum(targets)
        if total > available:
            targets = [t * available // total for t in targets]
        candidates = [
            _extract(
                b.source,
                query=contract.query,
                instruction=contract.instruction,
                context=contract.context,
                with_paths=False,
            )
            for b in blocks
        ]
        summaries = [self._fill(found, target) for found, target in zip(candidates, targets, strict=True)]
        for _ in range(50):
            text = self._render_blocks(blocks, summaries)
            if self.count(text) <= max_tokens:
                return text
            # JSON escaping (quotes, newlines) costs tokens the per-block targets did not
            # see; shave the longest summary and re-check.
            longest = max(range(len(summaries)), key=lambda i: len(summaries[i]))
            targets[longest] = int(targets[longest] * 0.85)
            summaries[longest] = self._fill(candidates[longest], targets[longest])
        return skeleton

    def _fill(self, found: tuple[list[_Item], dict[str, float], frozenset[str]], target: int) -> str:
        """Bullet lines of the best candidates within ``target`` tokens."""
        if target < _MIN_FILL_TOKENS:
            return ""
        items, idf, covered = found
        chosen = _Selection(idf, covered, self._budget).run(items, target)
        while True:
            text = "".join(_bullet(it) for it in chosen).rstrip("\n")
            if self.count(text) <= target:
                return text
            if not chosen:
                return self._budget.fit(text, target, head_tail=False)
            weakest = min(chosen, key=lambda it: (it.must, it.weight, it.order))
            chosen = [it for it in chosen if it is not weakest]

    @staticmethod
    def _render_blocks(blocks: Sequence[ContractBlock], summaries: Sequence[str]) -> str:
        payload = {
            "blocks": [{"block_id": b.block_id, "summary": s} for b, s in zip(blocks, summaries, strict=True)]
        }
        return json.dumps(payload, ensure_ascii=False)
