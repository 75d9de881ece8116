"""Tool calls and shell commands as the extractive summariser reads them.

A call becomes one line (``name(args) -> result``); these helpers shorten its arguments,
pick the line of its result worth showing, and tell which file it writes or deletes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from ctxcore.json_text import loads_shallow
from ctxcore.messages import ToolCall
from ctxcore.summarize.extractive.features import MAX_LINE_CHARS, PATH, clip, collapse

__all__ = [
    "TASK_TOOL",
    "args_short",
    "call_path",
    "command_text",
    "json_fields",
    "parse_args",
    "result_line",
    "shell_command",
    "shell_removed",
    "shell_write_target",
    "writes_file",
    "written_lines",
]

_WRITE_TOOL = re.compile(
    r"write|edit|create|patch|apply|replace|save|update|insert|append|delete|remove|rename|move|mkdir"
)
TASK_TOOL = re.compile(r"todo|task|plan")
# Shell commands that write a file: redirection (not "2>&1"), tee, in-place sed.
_REDIRECT = re.compile(r"(?<![0-9&<>-])>>?\s*([\w./~@-]+)")
_TEE = re.compile(r"\btee\s+(?:-a\s+)?([\w./~@-]+)")
_SED_INPLACE = re.compile(r"\bsed\s+(?:-\w+\s+)*-i")
_FILE_TOKEN = re.compile(r"[\w./~@-]+\.\w+")
_PATH_KEYS: Final = ("path", "file_path", "filepath", "file", "filename", "notebook_path")
# The argument that holds a shell command.
_COMMAND_KEYS: Final = ("command", "cmd")
# A heredoc's opening (``cat <<'EOF' > a.py``): the lines up to its delimiter are a file's
# content, not the command.
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
# A command is kept whole up to this many characters: an edit (``sed -i '1261s/a/b/;1722s/c/d/'
# f.py``) cut after its first line number loses the others, which the agent re-issues later.
# Past it the command is a pasted script, shortened like any other value.
COMMAND_CHARS: Final = 1000
# A line of a JSON result is kept whole up to this many characters (a flight record of a
# search result, ~320 characters, fits); a longer field is read by its parts.
JSON_LINE_CHARS: Final = MAX_LINE_CHARS
# A key printed bare in a JSON line's path (``payment_methods.gift_card_1``); others quoted.
_NAME = re.compile(r"[A-Za-z_][\w-]*")


def result_line(lines: Sequence[tuple[str, bool]]) -> str:
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
        flat = collapse(value)
        limit = 120 if PATH.fullmatch(flat) else 80
        return json.dumps(clip(flat, limit, mark=True), ensure_ascii=False)
    text = json.dumps(value, ensure_ascii=False, default=str)
    # Cut at a word end, or the whole value goes: never half a token.
    return clip(text, 40, mark=True) or "…"


def parse_args(arguments: str) -> Any:
    """The decoded JSON arguments of a call (``{}`` when blank, None when not JSON)."""
    try:
        return loads_shallow(arguments) if arguments.strip() else {}
    except ValueError:
        return None


def command_text(parsed: Any) -> str | None:
    """A call's shell command as the agent wrote it, heredoc bodies left out (the file
    they write is named on the command's line), None when the call has no command."""
    if not isinstance(parsed, dict):
        return None
    command = shell_command(parsed)
    if command is None or not command.strip():
        return None
    text = "\n".join(_heredoc_split(command)[0])
    return text if len(text) <= COMMAND_CHARS else clip(collapse(text), COMMAND_CHARS, mark=True)


def _heredoc_lines(parsed: Any) -> list[str]:
    """The lines a call's shell command writes through heredocs (a script's code), in order;
    ``[]`` when it has none."""
    if not isinstance(parsed, dict):
        return []
    command = shell_command(parsed)
    return [] if command is None else _heredoc_split(command)[1]


def shell_command(parsed: Any) -> str | None:
    """A call's shell command as written, heredocs included; an argument vector (Codex's
    ``["bash", "-lc", "<script>"]``) joined by spaces, each part verbatim. None without one."""
    if not isinstance(parsed, dict):
        return None
    for key in _COMMAND_KEYS:
        value = parsed.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
            return " ".join(value)
    return None


def _heredoc_split(command: str) -> tuple[list[str], list[str]]:
    """A shell command's non-blank lines, stripped: those the shell reads as commands, and
    those its heredocs write (their delimiters are neither)."""
    commands: list[str] = []
    bodies: list[str] = []
    delimiter = ""
    for raw in command.splitlines():
        line = raw.strip()
        if delimiter:
            if line == delimiter:
                delimiter = ""
            elif line:
                bodies.append(line)
            continue
        if line:
            commands.append(line)
        opened = _HEREDOC.search(line)
        if opened:
            delimiter = opened.group(2)
    return commands, bodies


def args_short(arguments: str, parsed: Any) -> str:
    """A call's arguments as ``key=value, ...`` with long values shortened; a shell
    command whole (``command_text``) and alone: it says what the call did, and the flags a
    harness adds beside it (OpenHands' ``is_input``, a ``timeout``, a ``workdir``) do not. A
    ``command`` beside a ``path`` is an editor's sub-command (``create``, ``str_replace``): the
    other arguments follow it in brackets, shortened."""
    command = command_text(parsed)
    if command is not None and isinstance(parsed, dict):
        rest = {k: v for k, v in parsed.items() if k not in _COMMAND_KEYS}
        if not any(k in _PATH_KEYS for k in rest):
            return command
        return f"{command} [{clip(_pairs(rest), 160, mark=True)}]"
    text = _pairs(parsed) if isinstance(parsed, dict) else collapse(arguments)
    return clip(text, 160, mark=True)


def _pairs(parsed: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short_value(v)}" for k, v in parsed.items())


def written_lines(parsed: Any, writes: bool) -> list[str]:
    """The code lines a call writes, in order: the bodies of its shell command's heredocs
    and, for a call that writes a file (``writes``), its other text arguments (an editor's
    ``file_text`` or ``new_str``, a ``content``, each ``new_string`` of a list of edits), not
    the path nor what an edit replaces (``old_str``: no longer in the file). Blank lines left
    out, each stripped."""
    lines = _heredoc_lines(parsed)
    if writes and isinstance(parsed, dict):
        lines.extend(_argument_lines(parsed, top=True))
    return lines


def _argument_lines(value: Any, *, top: bool = False) -> list[str]:
    if isinstance(value, str):
        return [line.strip() for line in value.splitlines() if line.strip()]
    if isinstance(value, list):
        return [line for item in value for line in _argument_lines(item)]
    if not isinstance(value, dict):
        return []
    return [
        line
        for key, item in value.items()
        if not key.startswith("old") and key not in _PATH_KEYS and not (top and key in _COMMAND_KEYS)
        for line in _argument_lines(item)
    ]


def shell_write_target(command: str) -> str | None:
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


def shell_removed(command: str) -> list[str]:
    """Files a shell command visibly deletes (``rm a.py b.py``)."""
    first = command.split("\n", 1)[0]
    removed: list[str] = []
    for part in re.split(r"&&|;|\|\|", first):
        words = part.split()
        if words and words[0] == "rm":
            removed.extend(w for w in words[1:] if not w.startswith("-"))
    return removed


def writes_file(name: str, written: str | None, path: str | None) -> bool:
    """True when a tool call writes a file (by its name or its shell command)."""
    return bool(written) or (path is not None and _WRITE_TOOL.search(name) is not None)


def call_path(call: ToolCall, parsed: Any) -> str | None:
    """The file a call is about: a path-like argument, else the first path in its arguments."""
    if isinstance(parsed, dict):
        for key in _PATH_KEYS:
            value = parsed.get(key)
            if isinstance(value, str) and PATH.search(value):
                return value.strip()
    match = PATH.search(call.arguments)
    return match.group(0) if match else None


def json_fields(text: str) -> list[str] | None:
    """A result that is one JSON object or array, one line per top-level field (its
    ``"key":value`` as compact JSON) or per array item; None for anything else. Such a result
    is one line of JSON that a 200-character cut ends before its ids and amounts; a field's
    own line keeps them beside their key, in the result's own syntax.

    A field too long for one line is read by its parts (``_part_lines``): compact JSON has no
    space to cut at, and a cut record loses the values at its end (a fare, an id), so each
    nested record is a line of its own under its path (``flights[2]: {...}``)."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        value = loads_shallow(stripped)
    except ValueError:
        # Not JSON, or nested too deep (``loads_shallow``): read as text.
        return None
    if isinstance(value, dict):
        parts = [(f"{_compact(key)}:", _path("", key), item) for key, item in value.items()]
    elif isinstance(value, list):
        parts = [("", f"[{n}]", item) for n, item in enumerate(value)]
    else:
        return None
    lines: list[str] = []
    for head, path, item in parts:
        whole = head + _compact(item)
        if len(whole) <= JSON_LINE_CHARS:
            lines.append(whole)
        elif isinstance(item, dict | list):
            lines.extend(_part_lines(path, item))
        else:
            lines.append(_cut(head + json.dumps(item, ensure_ascii=False, default=str)))
    # A line whose path alone is longer than a line (a 400-character key) is cut to nothing.
    lines = [line for line in lines if line]
    return lines or None


def _part_lines(path: str, value: Any) -> list[str]:
    """The lines of a value too long for one: its scalar members together on the line of
    ``path`` (a record's own fields stay beside each other; an array's scalars in order,
    without their indices), each nested object or array on lines of its own under its path,
    recursively; a long scalar or a long array of scalars is cut at a word end of its spaced
    JSON (never a line per bare number)."""
    if isinstance(value, dict):
        members = list(value.items())
        scalars: Any = {key: item for key, item in members if not isinstance(item, dict | list)}
        nested = [(_path(path, key), item) for key, item in members if isinstance(item, dict | list)]
    elif isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        scalars = [item for item in value if not isinstance(item, dict | list)]
        nested = [(f"{path}[{n}]", item) for n, item in enumerate(value) if isinstance(item, dict | list)]
    else:
        return [_cut_line(path, value)]
    lines = [_cut_line(path, scalars)] if scalars else []
    for sub_path, item in nested:
        whole = f"{sub_path}: {_compact(item)}"
        lines.extend([whole] if len(whole) <= JSON_LINE_CHARS else _part_lines(sub_path, item))
    return lines


def _cut_line(path: str, value: Any) -> str:
    """``path: value`` within ``JSON_LINE_CHARS``: compact when it fits, else its spaced JSON
    cut at a word end and marked."""
    whole = f"{path}: {_compact(value)}"
    if len(whole) <= JSON_LINE_CHARS:
        return whole
    return _cut(f"{path}: {json.dumps(value, ensure_ascii=False, default=str)}")


def _cut(text: str) -> str:
    return clip(collapse(text), JSON_LINE_CHARS, mark=True)


def _path(parent: str, key: str) -> str:
    """``parent.key`` (a key that is no plain name quoted: ``parent["a b"]``)."""
    if _NAME.fullmatch(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{_compact(key)}]"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
