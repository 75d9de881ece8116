"""``extract``: every candidate line of a source, scored, deduplicated, in source order.

It walks the source message by message with one ``Extractor``: the task anchor and the
intent anchor are always kept, other real user messages compete on content, memory
blocks give their lines back, assistant text and tool calls become lines, and a tool
output's error lines compete beside its first line. The first and newest failures, the
newest call and lines listing the files written or looked at are no longer kept whatever
competes, and no weight favours a message's first line or the later lines: those rules did
not raise the next-step references on both development halves (bench/README, issue 33,
"Every rule pays").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolMessage, UserMessage
from ctxcore.summarize.extractive.candidates import Extractor
from ctxcore.summarize.extractive.features import (
    CONSTRAINT,
    MAX_LINE_CHARS,
    collapse,
    tool_tag,
    words_of,
)
from ctxcore.summarize.extractive.items import BASE_SCORE, Item
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


def _reference(context: Sequence[AnyMessage]) -> frozenset[str]:
    """The content words the reference context already holds: a line adds only its others."""
    words: set[str] = set()
    for message in context:
        words.update(words_of(message.text))
    return frozenset(words)


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
                ex.add((index, 0), "fact", collapse(message.text), tag="")
        elif isinstance(message, UserMessage):
            _user(ex, shape, index, message)
        elif isinstance(message, AssistantMessage):
            _assistant(ex, shape, source, index, message, used_lines)
        elif isinstance(message, ToolMessage):
            tag = tool_tag(_tool_name(source, shape, index, message))
            if index not in shape.callers:
                ex.add((index, 0), "tool", result_line(ex.scanned(index, message)), tag=tag)
            ex.tool_output(index, message, used_lines.get(index, ""), tag)


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


def extract(
    source: Sequence[AnyMessage],
    *,
    context: Sequence[AnyMessage],
    with_paths: bool,
    rules: Rules = ALL_RULES,
) -> Candidates:
    """The candidates of ``source`` (see the module docstring)."""
    context_words = _reference(context)
    ex = Extractor(with_paths, rules)
    shape = _Shape.of(source)
    _walk(ex, source, shape)
    if with_paths:
        for rank, (path, weight) in enumerate(ex.paths.items()):
            static = BASE_SCORE["paths"] * weight
            tag = ex.path_tags.get(path, "")
            ex.items.append(Item((len(source), rank), "paths", path, static, f"path:{path}", tag=tag))
    kept = _latest(ex)
    kept.sort(key=lambda it: it.order)
    return Candidates(kept, _idf(kept), context_words)
