"""``extract``: every candidate line of a source, scored, deduplicated, in source order.

It walks the source message by message with one ``Extractor``: the task anchor and the
intent anchor are always kept, other real user messages compete on content, memory
blocks give their lines back, assistant text and tool calls become lines, and the newest
error is kept whatever else competes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolMessage, UserMessage
from ctxcore.summarize.extractive.candidates import Extractor
from ctxcore.summarize.extractive.features import (
    CONSTRAINT,
    EXCEPTION_NAME,
    MAX_LINE_CHARS,
    SPEAKER,
    collapse,
    is_error,
    split_tag,
    spoken_runs,
    tool_tag,
    words_of,
)
from ctxcore.summarize.extractive.items import BASE_SCORE, FILES_LOOKED_AT, FILES_WRITTEN, Item
from ctxcore.summarize.extractive.rules import ALL_RULES, Rules
from ctxcore.summarize.extractive.tools import result_line
from ctxcore.turns import is_real_user, tool_callers

__all__ = ["Candidates", "extract"]

_MUST_FIRST = 1e9
_MUST_LAST = 1e8
# A summary that is nothing but a long task statement has lost the work; the anchors are
# pinned verbatim outside summaries anyway, so here they get a bounded share.
_FIRST_SHARE = 0.35
_LAST_SHARE = 0.2
# Each further line from one message is worth this much less than the one before.
_DECAY = 0.6
_RECENCY = 2.0
# A kept failure line is ordered after every other line of its message.
_KEPT_ERROR_ORDER = 10**6


@dataclass(frozen=True)
class Candidates:
    """Candidates in source order, the rarity (idf) of their words, and the words the
    reference context already covers."""

    items: list[Item]
    idf: dict[str, float]
    covered: frozenset[str]


@dataclass(frozen=True)
class _Shape:
    """Where the real user messages and the tool results of a source are."""

    real: frozenset[int]
    first_real: int | None
    last_real: int | None
    callers: dict[int, int]
    # (caller index, call id) -> index of its result.
    results: dict[tuple[int, str], int]
    # Turns of people talking, with no tool activity, are a dialogue: see ``Extractor.dialogue``.
    dialogue: bool
    # A dialogue with both sides in it: its first and last user turns are no anchors.
    chat: bool

    @classmethod
    def of(cls, source: Sequence[AnyMessage]) -> _Shape:
        real = [i for i, m in enumerate(source) if is_real_user(m)]
        callers = tool_callers(source)
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
        chat = dialogue and any(isinstance(m, AssistantMessage) for m in source)
        first, last = (real[0], real[-1]) if real else (None, None)
        return cls(frozenset(real), first, last, callers, results, dialogue, chat)


def _reference(context: Sequence[AnyMessage]) -> tuple[frozenset[str], frozenset[str]]:
    """The lines (normalised) and the content words the reference context already holds."""
    known: set[str] = set()
    words: set[str] = set()
    for message in context:
        text = message.text
        words.update(words_of(text))
        for raw in text.splitlines():
            line = split_tag(raw.strip().lstrip("-*• ").strip())[1]
            if line:
                known.add(collapse(line).casefold())
            label = SPEAKER.match(line)
            if label is not None:
                # A summary line joining a speaker's sentences holds each of them.
                for run in spoken_runs(line[label.end() :]):
                    known.update(collapse(label.group(0) + piece).casefold() for piece in run)
    return frozenset(known), frozenset(words)


def _user(ex: Extractor, shape: _Shape, index: int, message: UserMessage) -> None:
    if shape.chat and index in shape.real:
        # In a chat every turn competes on what it says: the first and last of a span are
        # no task and no intent (those are pinned outside the summary anyway).
        ex.dialogue(index, message.text, "user")
    elif index == shape.first_real:
        ex.anchor(index, message.text, _MUST_FIRST, "request", _FIRST_SHARE)
    elif index == shape.last_real:
        category = "constraint" if CONSTRAINT.search(message.text) else "request"
        ex.anchor(index, message.text, _MUST_LAST, category, _LAST_SHARE)
    elif index in shape.real:
        if shape.dialogue:
            ex.dialogue(index, message.text, "user")
        else:
            ex.user(index, message.text)
    else:
        ex.memory_block(index, message.text)


def _assistant(
    ex: Extractor,
    shape: _Shape,
    source: Sequence[AnyMessage],
    index: int,
    message: AssistantMessage,
    used_lines: dict[int, str],
) -> None:
    if shape.dialogue:
        ex.dialogue(index, message.text, "assistant")
    else:
        ex.assistant(index, message)
    for pos, call in enumerate(message.tool_calls):
        found = shape.results.get((index, call.id))
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


def _tool_name(source: Sequence[AnyMessage], shape: _Shape, index: int, message: ToolMessage) -> str | None:
    """The name of the tool whose output ``message`` is: its own, else its call's."""
    if message.name:
        return message.name
    caller = source[shape.callers[index]] if index in shape.callers else None
    if isinstance(caller, AssistantMessage):
        return next((c.name for c in caller.tool_calls if c.id == message.tool_call_id), None)
    return None


def _walk(ex: Extractor, source: Sequence[AnyMessage], shape: _Shape) -> None:
    used_lines: dict[int, str] = {}
    for index, message in enumerate(source):
        if isinstance(message, SystemMessage):
            # Short system notes in a log are markers such as a session's date line.
            if len(message.text) <= MAX_LINE_CHARS:
                ex.add((index, 0), "fact", collapse(message.text), tag="", bonus=2.0)
        elif isinstance(message, UserMessage):
            _user(ex, shape, index, message)
        elif isinstance(message, AssistantMessage):
            _assistant(ex, shape, source, index, message, used_lines)
        elif isinstance(message, ToolMessage):
            tag = tool_tag(_tool_name(source, shape, index, message))
            if index not in shape.callers:
                ex.add((index, 0), "tool", result_line(ex.scanned(index, message)), tag=tag)
            ex.tool_output(index, message, used_lines.get(index, ""), tag)


def _errors_at(
    source: Sequence[AnyMessage], ex: Extractor, shape: _Shape, *, newest: bool
) -> list[tuple[int, str, str]]:
    """(index, line, tag) of the failure lines of the newest (or first) message with any, as
    this summariser's error detector flags them in a tool output or an earlier summary: the
    line naming an exception, which says what went wrong, and for the newest failure also
    its last line, the verdict ("FAILED (errors=7)")."""
    order = range(len(source) - 1, -1, -1) if newest else range(len(source))
    for index in order:
        message = source[index]
        if isinstance(message, ToolMessage):
            found = [
                (line, tool_tag(_tool_name(source, shape, index, message)))
                for line, error in ex.scanned(index, message)
                if error
            ]
        elif isinstance(message, UserMessage) and index not in shape.real:
            lines = (split_tag(raw.strip().lstrip("-*• ").strip()) for raw in message.text.splitlines())
            # An error is what a tool printed; an assistant's line about one ("Again,
            # `ValueError: ...`") is talk about an older failure, and would displace it.
            found = [(line, tag) for tag, line in lines if line and is_error(line) and _tool_or_untagged(tag)]
        else:
            continue
        if found:
            named = [f for f in found if EXCEPTION_NAME.search(f[0])] or found
            if not newest:
                return [(index, *named[0])]
            picked = [named[-1], found[-1]] if found[-1] != named[-1] else [named[-1]]
            return [(index, *f) for f in picked]
    return []


def _tool_or_untagged(tag: str) -> bool:
    return not tag or tag.startswith("tool")


def _keep_errors(ex: Extractor, source: Sequence[AnyMessage], shape: _Shape) -> None:
    # The newest failure is what the agent acts on next, and the first one is usually the
    # reproduction of what the task is about: both are kept whatever else competes (a
    # bounded share), under the same key as their ordinary candidates so each prints once.
    # An earlier summary in the source counts too, so by induction the conversation's first
    # and newest failures survive every later merge.
    newest = _errors_at(source, ex, shape, newest=True) if ex.rules.newest_failure else []
    kept = {line for _, line, _ in newest}
    for index, line, tag in newest:
        _keep_error(ex, index, line, tag, share=0.25)
    first = _errors_at(source, ex, shape, newest=False) if ex.rules.first_failure else []
    for index, line, tag in first:
        if line not in kept:
            _keep_error(ex, index, line, tag, share=0.2)


def _keep_file_lists(ex: Extractor, end: int) -> None:
    """One line naming every file the source wrote and did not delete afterwards, and one
    naming the other files its calls read or ran, newest first: a path costs a few tokens,
    and no other line says which files the agent has touched once the lines of those calls
    lose to newer work."""
    written = [p for p, at in _newest_first(ex.written) if ex.removed.get(p, (-1, 0)) < at]
    looked = [p for p, _ in _newest_first(ex.looked_at) if p not in ex.written]
    written = written if ex.rules.files_written else []
    looked = looked if ex.rules.files_looked_at else []
    for sub, (prefix, paths, share) in enumerate(
        ((FILES_WRITTEN, written, 0.1), (FILES_LOOKED_AT, looked, 0.08))
    ):
        if paths:
            item = Item(
                (end, sub),
                "file",
                prefix + ", ".join(paths),
                BASE_SCORE["file"],
                prefix,
                must=True,
                share=share,
                tag="assistant",
                keep_head=True,
            )
            ex.items.append(item)


def _keep_last_call(ex: Extractor) -> None:
    """The line of the source's newest call is kept: it is what the agent did just before
    the verbatim tail resumes, which no later line says."""
    lines = [it for it in ex.items if it.order == ex.last_call and not it.must]
    if lines and ex.rules.newest_call:
        ex.items.append(dataclasses.replace(lines[-1], must=True, share=0.1, whole=True))


def _newest_first(paths: dict[str, tuple[int, int]]) -> list[tuple[str, tuple[int, int]]]:
    return sorted(paths.items(), key=lambda kv: kv[1], reverse=True)


def _keep_error(ex: Extractor, index: int, line: str, tag: str, *, share: float) -> None:
    ex.items.append(
        Item(
            (index, _KEPT_ERROR_ORDER),
            "error",
            line,
            BASE_SCORE.get("error", 10.0),
            collapse(line).casefold(),
            frozenset(ex.features(line, tag)[1]),
            must=True,
            share=share,
            tag=tag,
            keep_head=True,
        )
    )


def _latest(ex: Extractor) -> list[Item]:
    """One item per key, the latest: the most recent state of a file, a task list or a
    repeated error is the one that matters; a file deleted later is no state at all."""
    latest: dict[str, Item] = {}
    for item in ex.items:
        previous = latest.get(item.key)
        if previous is None or item.order > previous.order or item.must:
            latest[item.key] = item
    return [
        it
        for it in latest.values()
        if not (it.category == "file" and ex.removed.get(it.key[len("file:") :], (-1, 0)) > it.order)
    ]


def _idf(items: Sequence[Item]) -> dict[str, float]:
    """How rare each word is among the candidates: rare words are what questions ask about."""
    df: dict[str, int] = {}
    for item in items:
        for word in item.words:
            df[word] = df.get(word, 0) + 1
    n = len(items) + 1
    return {w: math.log(n / (c + 0.5)) for w, c in df.items() if c + 0.5 < n}


def _diminish(items: list[Item]) -> None:
    """Each further line from the same message is worth less than the one before.

    Without this a single test run's forty ``ERROR test_x`` lines outrank every other
    step of the conversation; with it the budget spreads across messages.
    """
    by_message: dict[int, list[Item]] = {}
    for item in items:
        if not item.must and not item.independent:
            by_message.setdefault(item.order[0], []).append(item)
    for group in by_message.values():
        group.sort(key=lambda it: (-it.static, it.order))
        for rank, item in enumerate(group):
            item.decay *= _DECAY**rank


def extract(
    source: Sequence[AnyMessage],
    *,
    query: str,
    instruction: str,
    context: Sequence[AnyMessage],
    with_paths: bool,
    rules: Rules = ALL_RULES,
) -> Candidates:
    """The candidates of ``source`` (see the module docstring)."""
    known, context_words = _reference(context)
    ex = Extractor(words_of(f"{query} {instruction}"), known, with_paths, rules)
    shape = _Shape.of(source)
    _walk(ex, source, shape)
    _keep_errors(ex, source, shape)
    _keep_file_lists(ex, len(source))
    _keep_last_call(ex)
    if with_paths:
        for rank, (path, weight) in enumerate(ex.paths.items()):
            static = BASE_SCORE["paths"] * weight
            tag = ex.path_tags.get(path, "")
            ex.items.append(Item((len(source), rank), "paths", path, static, f"path:{path}", tag=tag))
    kept = _latest(ex)
    if rules.diminishing:
        _diminish(kept)
    # Later lines describe the current state; a mild bonus keeps the resume point.
    span = max(len(source), 1)
    for item in kept:
        if not item.must and rules.recency:
            item.static += _RECENCY * item.order[0] / span
    kept.sort(key=lambda it: it.order)
    return Candidates(kept, _idf(kept), context_words)
