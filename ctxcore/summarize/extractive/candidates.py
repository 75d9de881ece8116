"""Candidate lines of the extractive summariser, built from source messages.

``Extractor`` holds the candidates of one call; each method reads one kind of source (a
user message, an assistant message, a tool call and its result, a line of an earlier
summary) and adds scored ``Item``s. ``extract`` (in ``extract``) walks a source with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from ctxcore.markers import INTERNAL_USER_PREFIXES
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage
from ctxcore.summarize.extractive.features import (
    CONSTRAINT,
    MAX_LINE_CHARS,
    SENTENCE_SPLIT,
    SPEAKER,
    agent_line_kind,
    classify_title,
    clip,
    collapse,
    earlier_lines,
    is_error,
    line_features,
    meaningful,
    opens_with_error,
    scan,
    spoken_runs,
    tool_tag,
)
from ctxcore.summarize.extractive.items import BASE_SCORE, Item, user_key
from ctxcore.summarize.extractive.lists import bare_glued, with_bare_joined, with_lists_joined
from ctxcore.summarize.extractive.rules import Rules
from ctxcore.summarize.extractive.tools import (
    COMMAND_CHARS,
    TASK_TOOL,
    args_short,
    call_path,
    command_text,
    json_fields,
    parse_args,
    result_line,
    shell_command,
    shell_removed,
    shell_write_target,
    writes_file,
    written_lines,
)
from ctxcore.summarize.prompts import BLOCK_SECTIONS

__all__ = ["Extractor"]

# A call's line is ordered after every text line of its message, from here.
_CALL_ORDER: Final = 10_000
# What a dialogue question is worth against a statement: it asks for a fact, and the
# answer that follows is what holds it (its words still say what was talked about).
_QUESTION_WEIGHT: Final = 0.5
# A file write as ``Extractor.tool_call`` prints it: ``<path> <- <call> -> <result>``.
_FILE_WRITE = re.compile(r"^\S+ <- ")
# Every kind of line's prior without the ``category_priors`` rule: their mean.
_FLAT_PRIOR: Final = 6.0


class Extractor:
    """Builds scored candidates from source messages (one instance per call)."""

    def __init__(self, with_paths: bool, rules: Rules) -> None:
        self.rules = rules
        self.with_paths = with_paths
        self.items: list[Item] = []
        # Path -> how much it matters: written > used by a tool > merely mentioned.
        self.paths: dict[str, float] = {}
        # Path -> the tag of the latest line naming it.
        self.path_tags: dict[str, str] = {}
        # Index -> a tool result's scanned lines, and whether they are its JSON fields.
        self._scans: dict[int, tuple[list[tuple[str, bool]], bool]] = {}
        # Files deleted later in the source: their last write is no longer current state.
        self.removed: dict[str, tuple[int, int]] = {}

    # scoring

    def prior(self, category: str) -> float:
        """The prior of a kind of line (one flat prior without the ``category_priors`` rule)."""
        return BASE_SCORE[category] if self.rules.category_priors else _FLAT_PRIOR

    def note_path(self, path: str, weight: float, tag: str) -> None:
        """Record a path for the paths section (when the contract has one)."""
        if self.with_paths:
            self.paths[path] = max(self.paths.get(path, 0.0), weight)
            self.path_tags[path] = tag

    def features(self, text: str, tag: str) -> frozenset[str]:
        """The content words of a line (noting the paths it names)."""
        words, paths = line_features(text)
        for path in paths:
            self.note_path(path, 1.0, tag)
        return words

    def add(
        self,
        order: tuple[int, int],
        category: str,
        text: str,
        *,
        tag: str,
        key: str | None = None,
        bonus: float = 0.0,
        section: str = "",
        limit: int = MAX_LINE_CHARS,
        call: bool = False,
    ) -> None:
        """One candidate line (nothing for a line without a word). A ``call`` line (a call
        and its result, or a line an earlier summary kept) is the line its names belong to:
        never joined or dropped as bare (``Rules.bare_joined``)."""
        text = clip(text.strip(), limit)
        if self.rules.bare_joined and not call:
            text = with_bare_joined(text)
        if len(text) < 3 or not meaningful(text):
            return
        norm = key or collapse(text).casefold()
        words = self.features(text, tag)
        static = self.prior(category) + bonus
        self.items.append(Item(order, category, text, static, norm, words, tag=tag, section=section))

    def anchor(self, index: int, text: str, priority: float, category: str, share: float) -> None:
        """A user message always kept: verbatim within ``share`` of the budget, else shortened."""
        if self.rules.bare_joined:
            # A harness's reminder prints a code fence or a name on a line of its own.
            text = with_bare_joined(text)
        if not meaningful(text):
            return
        words = self.features(text[:20_000], "user")
        self.items.append(
            Item(
                (index, 0),
                category,
                text.strip(),
                priority,
                user_key(text),
                words,
                must=True,
                share=share,
                tag="user",
            )
        )

    def user(self, index: int, text: str) -> None:
        """A real user message between the anchors: verbatim, competing on content."""
        category = "constraint" if CONSTRAINT.search(text) else "request"
        stripped = text.strip()
        if self.rules.bare_joined:
            # A harness's reminder prints a code fence or a name on a line of its own.
            stripped = with_bare_joined(stripped)
        if len(stripped) <= 2 * MAX_LINE_CHARS:
            if meaningful(stripped):
                words = self.features(stripped, "user")
                static = self.prior(category)
                self.items.append(
                    Item((index, 0), category, stripped, static, user_key(stripped), words, tag="user")
                )
            return
        self.lines(index, text, lambda _line: category, "user")

    def dialogue(self, index: int, text: str, tag: str) -> None:
        """A turn of a tool-free dialogue: every sentence is a fact of its own (neither side
        narrates agent work: a long turn can give its one informative sentence alone)."""
        sub = 0
        lines = [raw.strip() for raw in text.splitlines() if raw.strip()]
        if self.rules.bare_joined:
            # A speaker's line is no list item: it glues nothing and nothing is glued to it.
            lines = bare_glued(lines, lambda line: SPEAKER.match(line) is None, ", ")
        for line in lines:
            label = SPEAKER.match(line)
            prefix = label.group(0) if label else ""
            pieces = SENTENCE_SPLIT.split(line[len(prefix) :])
            if self.rules.bare_joined and not prefix:
                pieces = bare_glued(pieces, lambda _piece: True, " ")
            for piece in pieces:
                sub += 1
                self.chat((index, sub), prefix, piece, tag)

    def chat(
        self,
        order: tuple[int, int],
        prefix: str,
        piece: str,
        tag: str,
        *,
        section: str = "",
    ) -> None:
        """One dialogue sentence; its speaker label is printed but scores nothing, a
        sentence without a content word ("Cool!", "Thanks, Mel!") is no candidate, and a
        question is worth less than a statement."""
        piece = piece.strip()
        words = self.features(piece, tag)
        if not words or not meaningful(piece):
            return
        whole = f"{prefix}{piece}"
        text = clip(whole)
        if not meaningful(text) or (prefix and text == prefix.rstrip()):
            return
        norm = collapse(text).casefold()
        static = self.prior("chat")
        self.items.append(
            Item(
                order,
                "chat",
                text,
                static,
                norm,
                words,
                tag=tag,
                section=section,
                speaker=prefix if text.startswith(prefix) else "",
                trimmed=text != whole,
                decay=_QUESTION_WEIGHT if self.rules.question_weight and piece.endswith("?") else 1.0,
            )
        )

    # sources

    def lines(self, index: int, text: str, classify: Callable[[str], str], tag: str) -> None:
        """Every line of ``text`` (long ones split into sentences), classified by ``classify``."""
        if self.rules.bare_joined:
            text = with_bare_joined(text)
        sub = 0
        for raw in text.splitlines():
            line = raw.strip().lstrip("-*• ").strip()
            if not line:
                continue
            pieces = SENTENCE_SPLIT.split(line) if len(line) > MAX_LINE_CHARS else [line]
            for piece in pieces:
                sub += 1
                self.add((index, sub), classify(piece), piece, tag=tag)

    def memory_block(self, index: int, text: str) -> None:
        """Lines of an earlier summary, routed by the heading they sat under.

        An internal user message that is no memory block (a harness's format reminder) is
        read the same way; its lines are the user role's.
        """
        default_tag = "" if text.lstrip().startswith(INTERNAL_USER_PREFIXES) else "user"
        sub = 0
        for section, tag, line in earlier_lines(text):
            # A gap in the order between lines: only sentences printed next to each other
            # in the earlier line are next to each other again.
            sub += 2
            # A pipeline block's sections place its lines, they do not rank them: its lines
            # were chosen once on their merits and compete as facts again. A snapshot's
            # section says what kind of line it holds.
            kind = classify_title(section) if section and section not in BLOCK_SECTIONS else "fact"
            category = {"critical": "fact", "other": "fact", "paths": "file"}.get(kind, kind)
            if category == "fact" and tag.startswith("tool"):
                # What a tool showed keeps its kind through every merge: a file's latest
                # write and the failures it printed are state, not one fact among many.
                if _FILE_WRITE.match(line):
                    category = "file"
                elif opens_with_error(line):
                    category = "error"
            # The line keeps the tag it was written with (none for an untagged model reply).
            tag = tag or default_tag
            key = None
            if " <- " in line and (category == "file" or section in BLOCK_SECTIONS):
                # A file's write from an earlier block and a newer one of the same file:
                # only the latest is its state.
                key = "file:" + line.split(" <- ", 1)[0]
            label = SPEAKER.match(line)
            if label is not None and not is_error(line):
                # Each dialogue sentence kept by an earlier summary competes as one again,
                # also when the line joined several of one speaker ("ValueError: ..." is an
                # error line, not a speaker's).
                for run in spoken_runs(line[label.end() :]):
                    for piece in run:
                        sub += 1
                        self.chat((index, sub), label.group(0), piece, tag, section=section)
                    sub += 1
                continue
            # Lines of an earlier summary were already chosen once; requests carried over
            # from it outrank ordinary facts.
            bonus = (3.0 if category == "request" else 1.0) if self.rules.summary_bonus else 0.0
            self.add(
                (index, sub),
                category,
                line,
                tag=tag,
                key=key,
                bonus=bonus,
                section=section,
                # Chosen once already: a bare line there came whole from its source (a
                # call's line, a session's date) or was joined then. A harness's note (no
                # block) was never chosen: its bare lines are joined like any message's.
                call=not default_tag,
            )

    def assistant(self, index: int, message: AssistantMessage) -> None:
        """The lines of an assistant message's text, classified by what they say."""
        text = message.text
        if self.rules.lists_joined:
            text = with_lists_joined(text)
        self.lines(index, text, agent_line_kind, "assistant")

    def scanned(self, index: int, message: ToolMessage) -> list[tuple[str, bool]]:
        """The scanned lines of a tool result, computed once per message."""
        found = self._scans.get(index)
        if found is None:
            fields = json_fields(message.text) if self.rules.json_fields else None
            lines = scan(message.text) if fields is None else [(f, is_error(f)) for f in fields]
            found = self._scans[index] = (lines, fields is not None)
        return found[0]

    def tool_call(
        self, index: int, pos: int, call: ToolCall, result: ToolMessage | None, result_index: int
    ) -> str:
        """Add the one-line item for a call; returns the result line it used."""
        parsed = parse_args(call.arguments)
        args = args_short(call.arguments, parsed)
        # A line built from the call and its result takes the tag of the latest: the result.
        tag = "assistant" if result is None else tool_tag(result.name or call.name)
        # The tag names the tool already; the line need not say it again.
        named = tag != tool_tag(call.name) or not args

        def head(shown_args: str) -> str:
            return f"{call.name}({shown_args})" if named else shown_args

        failed = result is not None and result.metadata.get("is_error") is True
        line = ""
        if result is None:
            shown = "(no result)"
        else:
            line = result_line(self.scanned(result_index, result))
            shown = line or "(empty)"
            if result.metadata.get("cancelled") is True:
                shown = f"(cancelled) {shown}"
        name = call.name.casefold()
        path = call_path(call, parsed)
        command = shell_command(parsed)
        written = shell_write_target(command) if command is not None else None
        writes = writes_file(name, written, path)
        # A shell command is shown whole (``command_text``): never cut after its first
        # line number.
        whole = self.rules.commands_whole and command_text(parsed) is not None
        limit = COMMAND_CHARS + MAX_LINE_CHARS if whole else MAX_LINE_CHARS
        # The result line this call's line shows whole (``tool_output`` skips it).
        used = line
        room = limit - len(head(args)) - len(" -> ")
        if len(shown) > room:
            # The result line does not fit beside the call (a record of compact JSON has no
            # space to cut at): the call shows its head, and the line competes on its own.
            cut = clip(shown, room, mark=True)
            # ``clip`` keeps a first word longer than the room whole (a record has no space).
            shown = cut if 0 < len(cut) <= room else "…"
            used = ""
        item_text = f"{head(args)} -> {shown}"
        order = (index, _CALL_ORDER + pos)
        if failed or is_error(line):
            self.add(order, "error", item_text, tag=tag, limit=limit, call=True)
        elif writes:
            target = written or path or ""
            # Keyed by path: only the last write of each file survives deduplication, and
            # the path leads so that clipping the arguments never hides it. A shell
            # command is its own brief, whole.
            brief_args = args if limit > MAX_LINE_CHARS else clip(args, 60, mark=True)
            brief = f"{head(brief_args)} -> {shown}"
            self.add(
                order, "file", f"{target} <- {brief}", tag=tag, key=f"file:{target}", limit=limit, call=True
            )
        elif TASK_TOOL.search(name):
            self.add(order, "pending", item_text, tag=tag, key=f"task:{name}", limit=limit, call=True)
        else:
            self.add(order, "tool", item_text, tag=tag, limit=limit, call=True)
        if path:
            self.note_path(path, 6.0 if writes else 3.0, tag)
        if written:
            self.note_path(written, 6.0, tag)
        if command is not None and not failed:
            for gone in shell_removed(command):
                self.removed[gone] = order
        if self.rules.script_lines:
            # A script the agent writes is code it reuses in the next script (issue 33c),
            # through a heredoc or an editor's argument.
            for sub, code in enumerate(written_lines(parsed, writes)[: _CALL_ORDER - 1], start=1):
                self.add((index, (2 + pos) * _CALL_ORDER + sub), "work", code, tag="assistant")
        return used

    def tool_output(self, index: int, message: ToolMessage, used: str, tag: str) -> None:
        """Error lines of a tool result beyond the one already shown (and, for a JSON
        result, each further field: ``Rules.json_fields``)."""
        sub = 0
        shown = set(used.split(" | "))
        for line, error in self.scanned(index, message):
            if len(line) < 3 or line in shown:
                continue
            sub += 1
            if error and self.rules.output_errors:
                # The tool's own line (``FAIL: test_x (a.b.Case)``): never joined or dropped.
                self.add((index, sub), "error", line, tag=tag, call=True)
            elif self._scans[index][1]:
                # A field of a JSON result (``"user_id":"mia_kim_4397"``) competes as a line.
                self.add((index, sub), "tool", line, tag=tag, call=True)
