"""What a shell command does to files, read the way the eval's probes need it.

The probes ask which files an agent edited and which it looked at. A command is split into
simple commands (at ``&&``, ``||``, ``;``, ``|`` and line ends) by ``shlex`` in non-POSIX
mode, so a quoted ``">"`` stays quoted and is never taken for a redirection. Heredoc bodies
are taken out before tokenising (their lines are data, not shell), but stay searchable for
Python's ``open(path, "w")``, the usual way agents write a file from a heredoc script.

Written for the harness from the shell's grammar; it shares nothing with the summariser's
own command parsing (an independence test checks that).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["FileEffects", "file_effects", "repo_relative"]

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][\w]*)\1")
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&", "\n", ";;", "|&"})
# shlex joins adjacent punctuation (";\n", "&&\n"): such a run is still one separator.
_SEPARATOR_CHARS = frozenset("();|&\n")
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>"})
_PY_OPEN_WRITE = re.compile(r"""open\(\s*(['"])([^'"\n]+)\1\s*,\s*(['"])[^'"]*[wa][^'"]*\3""")
_VIEWERS = frozenset({"cat", "nl", "head", "tail"})
_REPO_PREFIX = re.compile(r"^(?:/testbed/|/workspace/[^/\s]+/|(?:\./)+)")


@dataclass
class FileEffects:
    """Files a command writes and Python files it prints."""

    written: list[str] = field(default_factory=list)
    viewed: list[str] = field(default_factory=list)


def repo_relative(path: str) -> str:
    """``path`` without a leading ``/testbed/``, ``/workspace/<repo>/`` or ``./``."""
    return _REPO_PREFIX.sub("", path.strip())


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "'\"":
        return token[1:-1]
    return token


def _split_heredocs(command: str) -> tuple[str, str]:
    """(shell text without heredoc bodies, the bodies)."""
    shell: list[str] = []
    bodies: list[str] = []
    lines = command.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        shell.append(line)
        i += 1
        for match in _HEREDOC.finditer(line):
            delimiter = match.group(2)
            while i < len(lines) and lines[i].strip() != delimiter:
                bodies.append(lines[i])
                i += 1
            i += 1  # the delimiter line
    return "\n".join(shell), "\n".join(bodies)


def _tokens(shell: str) -> list[str]:
    # A line end separates commands unless quoted, so it is punctuation, not whitespace.
    lexer = shlex.shlex(shell, posix=False, punctuation_chars="();<>|&\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: the shell would refuse to run the command
        return []


def _simple_commands(shell: str) -> Iterator[list[str]]:
    current: list[str] = []
    for token in _tokens(shell):
        if token in _SEPARATORS or set(token) <= _SEPARATOR_CHARS:
            if current:
                yield current
            current = []
        else:
            current.append(token)
    if current:
        yield current


def _sed_files(args: list[str]) -> list[str]:
    """Operands of ``sed`` that are files (the script is the first operand unless -e/-f)."""
    files: list[str] = []
    script_given = False
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg in ("-e", "-f", "--expression", "--file"):
            script_given = True
            skip_next = True
            continue
        if arg.startswith("-") and len(arg) > 1:
            continue
        if not script_given:
            script_given = True
            continue
        files.append(_unquote(arg))
    return files


def _redirect_targets(words: list[str]) -> list[str]:
    out: list[str] = []
    for n, word in enumerate(words[:-1]):
        if word in _WRITE_REDIRECTS:
            target = _unquote(words[n + 1])
            if target and not target.startswith(("&", "/dev/")):
                out.append(target)
    return out


def _operands(words: list[str]) -> list[str]:
    """Arguments without redirections and their targets (``2>`` leaves a bare ``2``)."""
    out: list[str] = []
    skip = False
    for n, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word in _WRITE_REDIRECTS or word in ("<", ">&", "<<", "<<<"):
            skip = True
            if out and out[-1].isdigit() and n > 0 and words[n - 1] == out[-1]:
                out.pop()
            continue
        out.append(word)
    return out


def file_effects(command: str) -> FileEffects:
    """Files ``command`` writes (``sed -i``, ``>``/``>>`` targets, Python ``open(..., 'w'|'a')``)
    and the ``.py`` files it prints (``cat``, ``nl``, ``head``, ``tail``, ``sed -n``)."""
    shell, bodies = _split_heredocs(command)
    effects = FileEffects()
    for words in _simple_commands(shell):
        effects.written.extend(_redirect_targets(words))
        # Leading variable assignments (FOO=1 cmd ...) are not the command.
        start = 0
        while start < len(words) and re.match(r"^[A-Za-z_]\w*=", words[start]):
            start += 1
        if start >= len(words):
            continue
        name = words[start].rsplit("/", 1)[-1]
        args = _operands(words[start + 1 :])
        if name == "sed":
            in_place = any(a.startswith("-i") or a.startswith("--in-place") for a in args)
            quiet = any(re.match(r"^-[a-zA-Z]*n", a) for a in args) or "--quiet" in args
            files = _sed_files(args)
            if in_place:
                effects.written.extend(files)
            elif quiet:
                effects.viewed.extend(f for f in files if f.endswith(".py"))
        elif name in _VIEWERS:
            effects.viewed.extend(_unquote(a) for a in args if _unquote(a).endswith(".py"))
    for text in (shell, bodies):
        effects.written.extend(m.group(2) for m in _PY_OPEN_WRITE.finditer(text))
    effects.written = [repo_relative(p) for p in effects.written if repo_relative(p)]
    effects.viewed = [repo_relative(p) for p in effects.viewed if repo_relative(p)]
    return effects
