"""Conversations to replay: JSONL records, message groups and the points where windows are taken.

A record is ``{"id", "messages": [...], "qa"?: [...]}`` (the format of ``tests/data``). Its
``meta`` is never read: it may hold the answers (rewards, gold actions).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxcore.errors import UsageError
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolMessage, from_openai
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector

__all__ = [
    "Conversation",
    "QAItem",
    "groups",
    "load_conversations",
    "numbered_records",
    "read_records",
    "window_points",
]


@dataclass(frozen=True)
class QAItem:
    """One question of a conversation with its gold answer and evidence (source message ids)."""

    question: str
    answer: str
    evidence: tuple[str, ...] = ()
    category: str = ""

    @property
    def answerable(self) -> bool:
        """False for adversarial questions, whose gold answer is that the chat never says."""
        return (
            self.category != "adversarial"
            and bool(self.answer.strip())
            and not self.answer.strip().casefold().startswith("not mentioned")
        )


@dataclass(frozen=True)
class Conversation:
    """A conversation ready for replay: system messages apart, the rest in log order."""

    id: str
    system: tuple[AnyMessage, ...]
    messages: tuple[AnyMessage, ...]
    qa: tuple[QAItem, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = field(default=())

    @property
    def has_tools(self) -> bool:
        """True for a tool run (at least one tool result)."""
        return any(isinstance(m, ToolMessage) for m in self.messages)


def numbered_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each non-blank line of a JSONL file; a bare list of
    messages becomes ``{"id": "line-N", "messages": ...}``. A malformed line is a
    ``CtxcoreError`` naming ``file:line``."""
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if isinstance(record, list):
                record = {"messages": record}
            if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
                raise UsageError(f"{path}:{n}: expected an object with 'messages' or a list of messages")
            record.setdefault("id", f"line-{n}")
            yield n, record


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (a bare list of messages becomes ``{"messages": ...}``)."""
    return [record for _, record in numbered_records(path)]


def _qa(record: Mapping[str, Any]) -> tuple[QAItem, ...]:
    items = []
    for entry in record.get("qa") or []:
        if not isinstance(entry, Mapping) or "question" not in entry or "answer" not in entry:
            continue
        evidence = entry.get("evidence") or []
        items.append(
            QAItem(
                question=str(entry["question"]),
                answer=str(entry["answer"]),
                evidence=tuple(str(e) for e in evidence if isinstance(e, str | int)),
                category=str(entry.get("category") or ""),
            )
        )
    return tuple(items)


def conversation(record: Mapping[str, Any]) -> Conversation:
    """A ``Conversation`` from one record (only ``id``, ``messages``, ``qa`` and ``tools`` are read).

    System messages are sent with each window request, never logged (DESIGN), so every
    system message of the record goes to the window's system part, in order.
    """
    messages = from_openai(list(record["messages"]))
    system = tuple(m for m in messages if isinstance(m, SystemMessage))
    rest = tuple(m for m in messages if not isinstance(m, SystemMessage))
    tools = record.get("tools") or ()
    return Conversation(
        id=str(record.get("id")),
        system=system,
        messages=rest,
        qa=_qa(record),
        tools=tuple(t for t in tools if isinstance(t, Mapping)),
    )


def load_conversations(path: str | Path) -> list[Conversation]:
    """Every conversation of a JSONL file, in file order."""
    return [conversation(r) for r in read_records(path)]


def groups(messages: Sequence[AnyMessage]) -> list[list[AnyMessage]]:
    """Append units, as an agent appends them: a user message, or an assistant message with its
    tool results. A tool message that follows no assistant message joins the previous group."""
    out: list[list[AnyMessage]] = []
    for message in messages:
        if isinstance(message, ToolMessage) and out:
            out[-1].append(message)
        else:
            out.append([message])
    return out


def window_points(
    units: Sequence[Sequence[AnyMessage]], *, step_stride: int = 1, detector: UserDetector | None = None
) -> list[int]:
    """Indices of the groups after which a window is taken (and scored).

    After every real user message (the model answers it next), after every ``step_stride``
    assistant steps without one, and after the last group. The default (1) asks for a
    window before every model call, as an agent using the service does; a larger stride
    bounds the windows of long tool runs (fewer, larger compactions).
    """
    det = detector or DEFAULT_DETECTOR
    points: list[int] = []
    steps_since = 0
    for i, unit in enumerate(units):
        if unit and det.is_real(unit[0]):
            points.append(i)
            steps_since = 0
            continue
        if unit and isinstance(unit[0], AssistantMessage):
            steps_since += 1
        if steps_since >= step_stride:
            points.append(i)
            steps_since = 0
    if units and (not points or points[-1] != len(units) - 1):
        points.append(len(units) - 1)
    return points
