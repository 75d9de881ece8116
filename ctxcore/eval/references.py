"""Next-step references: what an agent writes next that it learned earlier, and whether a window holds it.

At each checkpoint of a run (the first assistant message at or after 40, 60, 80 and 95% of its
messages) the *references* are the tokens of that assistant message and the next two (their
text and the values of their tool-call arguments) of four kinds:

* ``path``: a token with a ``/`` whose last segment has an extension, or a bare file name
  with an extension from ``FILE_EXTENSIONS``;
* ``identifier``: at least 4 characters, snake_case, CamelCase/camelCase or a dotted name;
* ``number``: a run of at least 3 digits;
* ``quoted``: 4-200 characters between matching quotes or backticks, not one plain word.

A reference counts only when it occurs earlier in the conversation and in neither the system
messages nor the first user message (the task: every window holds it). It is *recent* when
it first occurs in the 10 messages before the checkpoint, *stale* when every earlier
occurrence is more than 10 messages back. A window *holds* a reference when it occurs
verbatim, at word boundaries, in the window's text: message contents and tool-call argument
values (tool definitions are not part of it).

Written from this definition alone: no compressor, rule or summariser code, pattern or
constant is used here (``tests/unit/test_independence.py``).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal

from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage, message_text

__all__ = [
    "CHECKPOINT_SHARES",
    "FILE_EXTENSIONS",
    "KINDS",
    "Checkpoint",
    "Reference",
    "bounded",
    "call_values",
    "checkpoints",
    "extract",
    "held",
    "message_texts",
    "sign_test",
    "window_text",
]

Kind = Literal["path", "identifier", "number", "quoted"]
KINDS: tuple[Kind, ...] = ("path", "identifier", "number", "quoted")
CHECKPOINT_SHARES = (0.40, 0.60, 0.80, 0.95)
NEXT_ASSISTANTS = 3
RECENT_MESSAGES = 10
MIN_IDENTIFIER = 4

# A space-separated string reads better than a hundred-line list for a set of words.
FILE_EXTENSIONS = frozenset(
    [
        "py",
        "pyi",
        "pyx",
        "pxd",
        "c",
        "h",
        "cc",
        "cpp",
        "hpp",
        "cxx",
        "rs",
        "go",
        "java",
        "kt",
        "scala",
        "rb",
        "php",
        "js",
        "jsx",
        "ts",
        "tsx",
        "mjs",
        "cjs",
        "css",
        "scss",
        "html",
        "htm",
        "xml",
        "json",
        "jsonl",
        "yaml",
        "yml",
        "toml",
        "ini",
        "cfg",
        "conf",
        "txt",
        "md",
        "rst",
        "csv",
        "tsv",
        "sql",
        "sh",
        "bash",
        "zsh",
        "ps1",
        "bat",
        "lock",
        "log",
        "diff",
        "patch",
        "ipynb",
        "r",
        "jl",
        "lua",
        "pl",
        "swift",
        "m",
        "mm",
        "ex",
        "exs",
        "erl",
        "hs",
        "ml",
        "clj",
        "vue",
        "svelte",
        "proto",
        "gradle",
        "mk",
        "cmake",
        "dockerfile",
        "env",
        "tex",
        "bib",
        "po",
        "mo",
        "dat",
        "npy",
        "pkl",
        "png",
        "jpg",
        "jpeg",
        "gif",
        "svg",
        "pdf",
        "zip",
        "gz",
        "tar",
    ]
)

# A token: word characters, dots, slashes and dashes, as paths and dotted names are written.
_TOKEN = re.compile(r"[\w./-]+")
_DIGITS = re.compile(r"(?<!\w)\d{3,}(?!\w)")
_QUOTED = re.compile(r"""(?<!\w)(["'`])([^\n"'`]{4,200})\1(?!\w)""")  # 4-200 characters
_NAME_PART = re.compile(r"[A-Za-z_]\w*")
_PLAIN_WORD = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class Reference:
    """One reference of a checkpoint: its text, its kind and where it was seen before."""

    text: str
    kind: Kind
    first_seen: int
    last_seen: int

    def recent(self, at: int) -> bool:
        """First seen in the ``RECENT_MESSAGES`` messages before message ``at``."""
        return self.first_seen >= at - RECENT_MESSAGES

    def stale(self, at: int) -> bool:
        """Every earlier occurrence is more than ``RECENT_MESSAGES`` messages before ``at``."""
        return self.last_seen < at - RECENT_MESSAGES


@dataclass(frozen=True)
class Checkpoint:
    """The assistant message at ``index`` (into the run's non-system messages), the share of the
    run it was chosen at, and the references of it and the next assistant messages."""

    share: float
    index: int
    references: tuple[Reference, ...] = field(default=())


def call_values(arguments: str) -> list[str]:
    """The string and number values of a tool call's arguments (JSON decoded, nested values
    included); arguments that are not JSON are one value as written."""
    try:
        decoded = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return [arguments]
    out: list[str] = []
    stack: list[Any] = [decoded]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            stack.extend(reversed(value))
        elif isinstance(value, str):
            out.append(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.append(str(value))
    return out


def message_texts(message: AnyMessage) -> list[str]:
    """A message's content and, for an assistant message, its tool-call argument values."""
    parts = [message_text(message)]
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            parts.extend(call_values(call.arguments))
    return parts


def window_text(messages: Iterable[AnyMessage]) -> str:
    """The text a window holds: every message's content and tool-call argument values."""
    return "\n".join(part for message in messages for part in message_texts(message))


def _is_path(token: str) -> bool:
    name = token.rstrip("/").rsplit("/", 1)[-1]
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem or not ext or not ext.isalnum():
        return False
    return "/" in token or ext.lower() in FILE_EXTENSIONS


def _is_identifier(token: str) -> bool:
    if len(token) < MIN_IDENTIFIER:
        return False
    if "." in token:
        parts = token.split(".")
        return len(parts) > 1 and all(_NAME_PART.fullmatch(p) for p in parts)
    if not _NAME_PART.fullmatch(token):
        return False
    if "_" in token.strip("_"):  # snake_case: an underscore inside the name
        return True
    # CamelCase / camelCase: both cases, and an upper-case letter after the first character.
    return any(c.islower() for c in token) and any(c.isupper() for c in token[1:])


def _kind(token: str) -> Kind | None:
    if _is_path(token):
        return "path"
    if "/" not in token and _is_identifier(token):
        return "identifier"
    return None


def extract(text: str) -> Iterator[tuple[str, Kind]]:
    """Every reference-shaped token of ``text`` with its kind (repeats included). A quoted
    string that is one path, identifier or number is that kind, not ``quoted``."""
    for match in _TOKEN.finditer(text):
        token = match.group(0).strip(".-")
        kind = _kind(token) if token else None
        if kind is not None:
            yield token, kind
    for match in _DIGITS.finditer(text):
        yield match.group(0), "number"
    for match in _QUOTED.finditer(text):
        inner = match.group(2)
        if not inner.strip() or _PLAIN_WORD.fullmatch(inner):
            continue
        single = _TOKEN.fullmatch(inner)
        if single is not None and (_kind(inner) is not None or inner.isdigit()):
            continue  # found above as the token it is
        yield inner, "quoted"


def bounded(text: str) -> re.Pattern[str]:
    """``text`` as a pattern that matches it verbatim and not inside a longer word."""
    return re.compile(r"(?<!\w)" + re.escape(text) + r"(?!\w)")


def checkpoints(messages: Sequence[AnyMessage], system: Sequence[AnyMessage]) -> list[Checkpoint]:
    """The run's checkpoints with their references (see the module docstring).

    ``messages`` are the run's non-system messages in log order. A share with no assistant
    message at or after it has no checkpoint (a run shorter than its checkpoints); two shares
    that fall on the same assistant message give one checkpoint.
    """
    assistants = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
    if not assistants:
        return []
    texts = ["\n".join(message_texts(m)) for m in messages]
    first_user = next((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), None)
    known = "\n".join(
        [*(message_text(m) for m in system), texts[first_user] if first_user is not None else ""]
    )
    out: list[Checkpoint] = []
    seen: set[int] = set()
    for share in CHECKPOINT_SHARES:
        start = math.ceil(share * len(messages))
        index = next((i for i in assistants if i >= start), None)
        if index is None or index in seen:
            continue
        seen.add(index)
        nxt = [i for i in assistants if i >= index][:NEXT_ASSISTANTS]
        candidates: dict[str, Kind] = {}
        for i in nxt:
            for text, kind in extract(texts[i]):
                candidates.setdefault(text, kind)
        # The earlier messages as one text (the task left out), each message's start noted,
        # so each candidate is one scan rather than one per message.
        pieces = ["" if j == first_user else texts[j] for j in range(index)]
        starts = list(accumulate((len(piece) + 1 for piece in pieces[:-1]), initial=0))
        earlier = "\n".join(pieces)
        refs: list[Reference] = []
        for text, kind in candidates.items():
            pattern = bounded(text)
            if pattern.search(known):
                continue
            found = [m.start() for m in pattern.finditer(earlier)]
            if found:
                first = bisect.bisect_right(starts, found[0]) - 1
                last = bisect.bisect_right(starts, found[-1]) - 1
                refs.append(Reference(text, kind, first, last))
        out.append(Checkpoint(share, index, tuple(refs)))
    return out


def held(reference: Reference, text: str) -> bool:
    """True when ``text`` holds ``reference`` verbatim at word boundaries."""
    return bounded(reference.text).search(text) is not None


def sign_test(wins: int, losses: int) -> float | None:
    """Two-sided sign test p-value of ``wins`` against ``losses`` (ties left out); None with none."""
    n = wins + losses
    if n == 0:
        return None
    k = min(wins, losses)
    tail: float = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return round(min(1.0, 2 * tail), 4)
