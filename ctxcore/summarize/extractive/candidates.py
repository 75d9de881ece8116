"""Candidate lines of the extractive summariser, built from source messages.

``Extractor`` holds the candidates of one call; each method reads one kind of source (a
user message, an assistant message, a tool call and its result, a line of an earlier
summary) and adds scored ``Item``s. ``extract`` (in ``extract``) walks a source with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ctxcore.markers import INTERNAL_USER_PREFIXES
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage
from ctxcore.summarize.extractive.features import (
    COMMENT,
    CONSTRAINT,
    DATE,
    DECISION,
    MAX_LINE_CHARS,
    PATH,
    PENDING,
    SENTENCE_SPLIT,
    SPEAKER,
    TAG_LINE,
    classify_title,
    clip,
    collapse,
    is_error,
    line_features,
    meaningful,
    scan,
)
from ctxcore.summarize.extractive.tools import (
    TASK_TOOL,
    args_short,
    call_path,
    parse_args,
    result_line,
    shell_removed,
    shell_write_target,
    writes_file,
)

__all__ = ["BASE_SCORE", "Extractor", "Item", "user_key"]

# Prior value of a line by what it is; the words it covers and its features add to it.
BASE_SCORE: Final = MappingProxyType(
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
# Markdown headings and whole-line bold titles; numbered lines are content, not headings.
_HEADING = re.compile(r"^(?:#{1,6}\s+(.+?)|\*\*(.+?)\*\*):?\s*$")
_BOILERPLATE_TAGS: Final = ("meaning", "conflict_policy", "coverage", "instruction")
_HEADER_LINE = re.compile(
    r"^(?:processor|type|scope|authority|instruction_status|conflict_priority|type_note|strategy_status|"
    r"tool_action_state_status|covers):",
)


@dataclass
class Item:
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


def user_key(text: str) -> str:
    """The deduplication key of a user message."""
    # Harness messages repeat word for word (format reminders); one copy is enough.
    return "user:" + " ".join(text.split()).casefold()


class Extractor:
    """Builds scored candidates from source messages (one instance per call)."""

    def __init__(self, query_words: frozenset[str], known: frozenset[str], with_paths: bool) -> None:
        self.query_words = query_words
        self.known = known
        self.with_paths = with_paths
        self.items: list[Item] = []
        # Path -> how much it matters: written > used by a tool > merely mentioned.
        self.paths: dict[str, float] = {}
        self._scans: dict[int, list[tuple[str, bool]]] = {}
        # Files deleted later in the source: their last write is no longer current state.
        self.removed: dict[str, tuple[int, int]] = {}

    # scoring

    def note_path(self, path: str, weight: float) -> None:
        """Record a path for the paths section (when the contract has one)."""
        if self.with_paths:
            self.paths[path] = max(self.paths.get(path, 0.0), weight)

    def features(self, text: str) -> tuple[float, frozenset[str]]:
        """The feature value of a line and its content words."""
        value, words, paths = line_features(text, self.query_words)
        for path in paths:
            self.note_path(path, 1.0)
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
        """One candidate line (nothing for a line without a letter or a digit)."""
        text = text.strip()
        if len(text) < 3 or not meaningful(text):
            return
        text = clip(text)
        norm = key or collapse(text).casefold()
        value, words = self.features(text)
        static = BASE_SCORE[category] + bonus + value
        if norm in self.known:
            static *= 0.3
        self.items.append(Item(order, category, text, static, norm, words, independent=independent))

    def anchor(self, index: int, text: str, priority: float, category: str, share: float) -> None:
        """A user message always kept: verbatim within ``share`` of the budget, else shortened."""
        words = self.features(text[:20_000])[1]
        self.items.append(
            Item((index, 0), category, text.strip(), priority, user_key(text), words, must=True, share=share)
        )

    def user(self, index: int, text: str) -> None:
        """A real user message between the anchors: verbatim, competing on content."""
        category = "constraint" if CONSTRAINT.search(text) else "request"
        stripped = text.strip()
        if len(stripped) <= 2 * MAX_LINE_CHARS:
            if meaningful(stripped):
                value, words = self.features(stripped)
                static = BASE_SCORE[category] + value
                self.items.append(Item((index, 0), category, stripped, static, user_key(stripped), words))
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
            label = SPEAKER.match(line)
            prefix = label.group(0) if label else ""
            for piece in SENTENCE_SPLIT.split(line[len(prefix) :]):
                sub += 1
                self.chat((index, sub), prefix, piece, independent=True)

    def chat(self, order: tuple[int, int], prefix: str, piece: str, *, independent: bool = False) -> None:
        """One dialogue sentence; its speaker label is printed but scores nothing, and a
        sentence without a content word ("Cool!", "Thanks, Mel!") is no candidate."""
        piece = piece.strip()
        value, words = self.features(piece)
        if not words or not meaningful(piece):
            return
        text = clip(f"{prefix}{piece}")
        norm = collapse(text).casefold()
        static = BASE_SCORE["chat"] + value
        if norm in self.known:
            static *= 0.3
        self.items.append(Item(order, "chat", text, static, norm, words, independent=independent))

    # sources

    def lines(self, index: int, text: str, classify: Callable[[str], str]) -> None:
        """Every line of ``text`` (long ones split into sentences), classified by ``classify``."""
        sub = 0
        for raw in text.splitlines():
            line = raw.strip().lstrip("-*• ").strip()
            if not line:
                continue
            pieces = SENTENCE_SPLIT.split(line) if len(line) > MAX_LINE_CHARS else [line]
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
                or TAG_LINE.match(line)
                or line.startswith(INTERNAL_USER_PREFIXES)
                or line.startswith("[[")
                or _HEADER_LINE.match(line)
                or line.casefold() in ("(none)", "none", "summary:")
            ):
                continue
            heading = _HEADING.match(line)
            if heading and len(line) < 90:
                title = heading.group(1) or heading.group(2) or ""
                kind = classify_title(title)
                category = {"critical": "fact", "other": "fact", "paths": "file"}.get(kind, kind)
                continue
            if line.startswith("Summary:"):
                line = line[len("Summary:") :]
            sub += 1
            line = line.lstrip("-*• ").strip()
            label = SPEAKER.match(line)
            if label is not None and not is_error(line):
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
        """The lines of an assistant message's text, classified by what they say."""

        def classify(line: str) -> str:
            if is_error(line):
                return "error"
            if PENDING.search(line):
                return "pending"
            if DECISION.search(line):
                return "decision"
            return "work"

        self.lines(index, message.text, classify)

    def scanned(self, index: int, message: ToolMessage) -> list[tuple[str, bool]]:
        """The scanned lines of a tool result, computed once per message."""
        lines = self._scans.get(index)
        if lines is None:
            lines = self._scans[index] = scan(message.text)
        return lines

    def tool_call(
        self, index: int, pos: int, call: ToolCall, result: ToolMessage | None, result_index: int
    ) -> str:
        """Add the one-line item for a call; returns the result line it used."""
        parsed = parse_args(call.arguments)
        head = f"{call.name}({args_short(call.arguments, parsed)})"
        failed = result is not None and result.metadata.get("is_error") is True
        line = ""
        if result is None:
            shown = "(no result)"
        else:
            line = result_line(self.scanned(result_index, result))
            shown = line or "(empty)"
            if result.metadata.get("cancelled") is True:
                shown = f"(cancelled) {shown}"
        item_text = f"{head} -> {shown}"
        name = call.name.casefold()
        path = call_path(call, parsed)
        command = parsed.get("command") if isinstance(parsed, dict) else None
        written = shell_write_target(command) if isinstance(command, str) else None
        order = (index, 10_000 + pos)
        if failed or is_error(line):
            self.add(order, "error", item_text)
        elif writes_file(name, written, path):
            target = written or path or ""
            # Keyed by path: only the last write of each file survives deduplication, and
            # the path leads so that clipping the arguments never hides it.
            brief = f"{call.name}({clip(args_short(call.arguments, parsed), 60)}) -> {shown}"
            self.add(order, "file", f"{target} <- {brief}", key=f"file:{target}")
        elif TASK_TOOL.search(name):
            self.add(order, "pending", item_text, key=f"task:{name}")
        else:
            self.add(order, "tool", item_text)
        if path:
            self.note_path(path, 6.0 if writes_file(name, written, path) else 3.0)
        if written:
            self.note_path(written, 6.0)
        if isinstance(command, str) and not failed:
            for gone in shell_removed(command):
                self.removed[gone] = order
        return line

    def tool_output(self, index: int, message: ToolMessage, used: str) -> None:
        """Error lines and dense lines of a tool result beyond the one already shown."""
        sub = 0
        shown = set(used.split(" | "))
        for line, error in self.scanned(index, message):
            if len(line) < 3 or line in shown:
                continue
            sub += 1
            if error:
                self.add((index, sub), "error", line)
            elif (
                not line.startswith(COMMENT)
                and len(line.split()) >= 4
                and (PATH.search(line) or DATE.search(line))
            ):
                # A bare path is a directory listing; a path with words around it
                # (a grep hit, a log line) says something about it.
                self.add((index, sub), "fact", line)
