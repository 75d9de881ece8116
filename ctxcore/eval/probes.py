"""Probes: facts of a raw agent run that a resumed agent needs, and whether a window holds them.

Each probe is computed from the raw messages alone (never from a window), so every policy
is asked the same questions. A probe with no value in a run is left out of that run.

* ``edited_files`` (set): paths of editor ``create``/``str_replace``/``insert``/``undo_edit``
  calls, and files shell commands write (``sed -i``, ``>``/``>>``, Python ``open(p, 'w'|'a')``).
* ``viewed_files`` (set): editor ``view`` paths and ``.py`` files printed by ``cat``, ``nl``,
  ``head``, ``tail`` or ``sed -n``, minus the edited ones.
* ``first_exception`` / ``last_exception``: the exception line of the first / last Python
  traceback in tool output (the first line after its frames, 160 chars); the last one is
  the later of that and the last tool-output line starting ``FAILED ``.
* ``last_failing_test``: the test id of the last pytest ``FAILED``/``ERROR`` summary line,
  or of the last unittest ``FAIL:``/``ERROR:`` line.
* ``newest_head``: the first 300 chars of the newest non-blank tool output.
* ``last_commands`` (set): per call of the last 3 assistant messages with calls, its
  ``path`` argument, else the first 200 chars of its ``command``.

Paths are repo-relative. A value is *present* in a window when, whitespace-normalised, it
is a substring of the window's text (message texts, each call's name and its decoded
argument values, normalised the same way). Set probes score the share present.

``ProbeTracker`` reads a run one message at a time, so the probes at every window point of
a replay cost one pass over the run, however large its outputs.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxcore.eval.shell import file_effects, repo_relative
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, message_text

__all__ = [
    "PROBES",
    "ProbeTracker",
    "Probes",
    "WindowText",
    "find_probes",
    "normalise_space",
    "score_probes",
]

PROBES = (
    "edited_files",
    "viewed_files",
    "first_exception",
    "last_exception",
    "last_failing_test",
    "newest_head",
    "last_commands",
)
SET_PROBES = frozenset({"edited_files", "viewed_files", "last_commands"})

_EDITS = frozenset({"create", "str_replace", "insert", "undo_edit"})
_TRACEBACK_HEADER = "Traceback (most recent call last):"
_EXCEPTION_CHARS = 160
_HEAD_CHARS = 300
_COMMAND_CHARS = 200
_RECENT_CALLERS = 3
_PYTEST_ID = re.compile(r"^(?:FAILED|ERROR) (\S+)")
_UNITTEST_ID = re.compile(r"^(?:FAIL|ERROR): (\S+ \([^)\s]+\))")


def normalise_space(text: str) -> str:
    """``text`` with every run of whitespace made one space, stripped."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Probes:
    """The probes of a run (or of its first messages); None / empty where it has none."""

    edited_files: frozenset[str] = frozenset()
    viewed_files: frozenset[str] = frozenset()
    first_exception: str | None = None
    last_exception: str | None = None
    last_failing_test: str | None = None
    newest_head: str | None = None
    last_commands: frozenset[str] = frozenset()
    malformed_calls: int = 0

    def present(self) -> dict[str, str | frozenset[str]]:
        """The probes this run has, by name."""
        return {name: value for name in PROBES if (value := getattr(self, name))}


def _decoded(call: ToolCall) -> dict[str, Any] | None:
    try:
        value = json.loads(call.arguments)
    except (json.JSONDecodeError, TypeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _flatten(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping | list | tuple):
        for item in value.values() if isinstance(value, Mapping) else value:
            yield from _flatten(item)
    elif value is not None:
        yield str(value)


class WindowText:
    """A window's normalised text, built once and asked many probes."""

    def __init__(self, messages: Sequence[AnyMessage]) -> None:
        parts: list[str] = []
        for message in messages:
            parts.append(message_text(message))
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls:
                    parts.append(call.name)
                    args = _decoded(call)
                    parts.extend(_flatten(args) if args is not None else [call.arguments])
        self.text = normalise_space("\n".join(parts))

    def has(self, value: str) -> bool:
        """True when ``value``, whitespace-normalised, is a substring of the window."""
        wanted = normalise_space(value)
        return bool(wanted) and wanted in self.text


class ProbeTracker:
    """Probes of a run read so far; ``add`` each raw message in log order."""

    def __init__(self) -> None:
        self._position = 0
        self._edited: set[str] = set()
        self._viewed: set[str] = set()
        self._first_exception: str | None = None
        self._last_traceback: tuple[int, int, str] | None = None
        self._last_failed_line: tuple[int, int, str] | None = None
        self._last_test: str | None = None
        self._newest_head: str | None = None
        self._recent: deque[tuple[str, ...]] = deque(maxlen=_RECENT_CALLERS)
        self._malformed = 0

    def add(self, message: AnyMessage) -> None:
        """Take one more raw message into account."""
        self._position += 1
        if isinstance(message, AssistantMessage) and message.tool_calls:
            self._recent.append(tuple(v for v in map(self._call, message.tool_calls) if v))
        elif isinstance(message, ToolMessage):
            self._tool_output(message_text(message))

    def _call(self, call: ToolCall) -> str | None:
        args = _decoded(call)
        if args is None:
            self._malformed += 1
            return None
        command, path = args.get("command"), args.get("path")
        if isinstance(path, str) and path.strip():
            rel = repo_relative(path)
            if command in _EDITS:
                self._edited.add(rel)
            elif command == "view":
                self._viewed.add(rel)
            return rel
        if isinstance(command, str) and command.strip():
            effects = file_effects(command)
            self._edited.update(effects.written)
            self._viewed.update(effects.viewed)
            return normalise_space(command[:_COMMAND_CHARS])
        return None

    def _tool_output(self, text: str) -> None:
        if not text.strip():
            return
        self._newest_head = normalise_space(text)[:_HEAD_CHARS]
        lines = text.splitlines()
        frames_indent: int | None = None
        for n, line in enumerate(lines):
            stripped = line.strip()
            if not stripped:
                continue
            indent = len(line) - len(line.lstrip())
            if stripped.startswith(_TRACEBACK_HEADER):
                frames_indent = indent
                continue
            if frames_indent is not None and indent <= frames_indent:
                # The first line back at the header's indentation ends the frames.
                exception = stripped[:_EXCEPTION_CHARS]
                frames_indent = None
                if self._first_exception is None:
                    self._first_exception = exception
                self._last_traceback = (self._position, n, exception)
            if stripped.startswith("FAILED "):
                self._last_failed_line = (self._position, n, stripped[:_EXCEPTION_CHARS])
            match = _PYTEST_ID.match(stripped)
            if match and ("::" in match.group(1) or ".py" in match.group(1)):
                self._last_test = match.group(1)
                continue
            match = _UNITTEST_ID.match(stripped)
            if match:
                self._last_test = match.group(1)

    def snapshot(self) -> Probes:
        """The probes of every message added so far."""
        candidates = [c for c in (self._last_traceback, self._last_failed_line) if c is not None]
        last = max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None
        commands = frozenset(v for values in self._recent for v in values)
        return Probes(
            edited_files=frozenset(self._edited),
            viewed_files=frozenset(self._viewed - self._edited),
            first_exception=self._first_exception,
            last_exception=last,
            last_failing_test=self._last_test,
            newest_head=self._newest_head,
            last_commands=commands,
            malformed_calls=self._malformed,
        )


def find_probes(history: Iterable[AnyMessage]) -> Probes:
    """The probes of a whole run."""
    tracker = ProbeTracker()
    for message in history:
        tracker.add(message)
    return tracker.snapshot()


def score_probes(window: WindowText | None, probes: Probes) -> dict[str, float]:
    """Each probe the run has -> the share of it present in ``window`` (None: a failed window,
    which scores 0 on every probe)."""
    out: dict[str, float] = {}
    for name, value in probes.present().items():
        if window is None:
            out[name] = 0.0
        elif isinstance(value, frozenset):
            out[name] = sum(window.has(v) for v in value) / len(value)
        else:
            out[name] = float(window.has(value))
    return out
