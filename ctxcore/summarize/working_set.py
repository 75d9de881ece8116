"""The working set: the files and symbols the newest messages of a conversation act on.

A summary replaces older steps; what the agent does next mostly touches what it is doing
now. The newest messages a summary does not cover (the raw tail) name the files the agent
is still working on and the functions, classes and attributes it handles there. A stage
checks before it commits a block that the replaced steps' lines naming them are in it
(``ctxcore.pipeline.verify``).

Written from what an agent's tool calls and messages look like, apart from the eval's
scorer (``tests/unit/test_independence.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from ctxcore.json_text import loads_shallow
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, message_text

__all__ = ["WorkingSet", "files_in", "mentions", "source_lines", "symbols_in", "working_set"]

# A file: a path with a slash whose last part has an extension, or a bare name with one.
_FILE = re.compile(r"(?<![\w/.-])(?:[\w.@-]+/)*[\w@-][\w.@-]*\.[A-Za-z][A-Za-z0-9]{0,7}(?![\w/-])")
# A symbol the agent handles: a dotted name, a snake_case or CamelCase name, a call.
_SYMBOL = re.compile(
    r"(?<![\w.])(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*(?!\w)"
    r"|(?<![\w.])[A-Za-z]\w*_\w+(?!\w)"
    r"|(?<![\w.])_+[A-Za-z]\w{2,}(?!\w)"
    r"|(?<![\w.])[A-Z][a-z0-9]+[A-Z]\w*(?!\w)"
    r"|(?<![\w.])[a-z]+[A-Z]\w*(?!\w)"
    r"|(?<![\w.])[A-Za-z_]\w{3,}(?=\()"
)
# Extensions that make a dotted word a file and not an attribute access ("self.name").
_SOURCE_EXTENSIONS_TEXT: Final = (
    "py pyi pyx c h cc cpp hpp rs go java kt rb php js jsx ts tsx json yaml yml toml ini cfg "
    "txt md rst csv sql sh html css xml lock log diff patch"
)
_SOURCE_EXTENSIONS: Final = frozenset(_SOURCE_EXTENSIONS_TEXT.split())
# Names too common in shell lines and prose to say what the agent works on.
_COMMON_TEXT: Final = (
    "self.assert print_function __init__ __name__ __main__ returncode os.path sys.path sys.argv"
)
_COMMON: Final = frozenset(_COMMON_TEXT.split())
# How many newest messages define the working set: the agent's current step and the few
# before it; older tail messages are context the summary does not replace anyway.
RECENT_MESSAGES: Final = 6
# Symbols shorter than this are too generic to track ("os.x", "a_b").
_MIN_SYMBOL = 4


@dataclass(frozen=True)
class WorkingSet:
    """Files (as written, and by their last path part) and symbols the newest messages name."""

    files: frozenset[str]
    symbols: frozenset[str]

    @property
    def empty(self) -> bool:
        """True when the newest messages name nothing to keep."""
        return not self.files and not self.symbols

    def names(self) -> frozenset[str]:
        """Every file and symbol, for matching against a line."""
        return self.files | self.symbols


def _texts(message: AnyMessage) -> Iterable[str]:
    yield message_text(message)
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            try:
                decoded = loads_shallow(call.arguments) if call.arguments.strip() else {}
            except ValueError:
                yield call.arguments
                continue
            if isinstance(decoded, dict):
                for value in decoded.values():
                    if isinstance(value, str):
                        yield value
                    elif isinstance(value, list):
                        # An argument vector (``["bash", "-lc", "<script>"]``).
                        yield from (part for part in value if isinstance(part, str))
            elif isinstance(decoded, str):
                yield decoded


def files_in(text: str) -> set[str]:
    """The file names in ``text`` (``a/b.py`` also as ``b.py``)."""
    out: set[str] = set()
    for match in _FILE.finditer(text):
        name = match.group(0).strip(".")
        if name.rsplit(".", 1)[-1].casefold() not in _SOURCE_EXTENSIONS:
            continue
        out.add(name)
        out.add(name.rsplit("/", 1)[-1])
    return out


def symbols_in(text: str) -> set[str]:
    """The symbols (dotted, snake_case, CamelCase names, called names) in ``text``."""
    out: set[str] = set()
    for match in _SYMBOL.finditer(text):
        name = match.group(0)
        if len(name) < _MIN_SYMBOL or name in _COMMON:
            continue
        if "." in name and name.rsplit(".", 1)[-1].casefold() in _SOURCE_EXTENSIONS:
            continue
        out.add(name)
    return out


def working_set(recent: Sequence[AnyMessage], *, last: int = RECENT_MESSAGES) -> WorkingSet:
    """The files and symbols the ``last`` newest of ``recent`` (system messages aside) name.

    The agent's own messages and calls say what it acts on; a tool's output counts only for
    files, since every name in a listing would make everything current.
    """
    messages = [m for m in recent if not isinstance(m, SystemMessage)][-last:]
    files: set[str] = set()
    symbols: set[str] = set()
    for message in messages:
        for text in _texts(message):
            files |= files_in(text)
            if isinstance(message, AssistantMessage):
                symbols |= symbols_in(text)
    return WorkingSet(frozenset(files), frozenset(symbols - files))


def mentions(line: str, names: frozenset[str]) -> bool:
    """True when ``line`` names one of ``names`` as a whole word."""
    if not names:
        return False
    return any(_whole(line, name) for name in names if name in line)


def _whole(line: str, name: str) -> bool:
    start = line.find(name)
    while start >= 0:
        end = start + len(name)
        before = line[start - 1] if start else " "
        after = line[end] if end < len(line) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        start = line.find(name, start + 1)
    return False


def source_lines(
    messages: Sequence[AnyMessage], names: frozenset[str] | None = None, *, limit: int = 300
) -> list[str]:
    """The lines of ``messages`` (texts and call arguments) that name one of ``names``
    (every line when None), whitespace collapsed, each at most ``limit`` characters (longer
    lines are no code a summary can keep: minified or binary output), in order, each once."""
    out: dict[str, None] = {}
    for message in messages:
        for text in _texts(message):
            for raw in text.splitlines():
                line = " ".join(raw.split())
                if line and len(line) <= limit and (names is None or mentions(line, names)):
                    out.setdefault(line, None)
    return list(out)
