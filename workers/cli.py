"""The ``ctxcore`` command line: the parser and ``main``.

It stays on argparse on purpose: the standard library costs no dependency and no import
time (each command imports what it needs when it runs), and ``main(argv)`` is what the tests
drive. Conventions: every option and positional has help and shows its default
(``ArgumentDefaultsHelpFormatter``); the shared options (``--config``) come from one parent
parser that every subcommand uses; the ``--help`` epilog lists every ``CTXCORE_*`` variable,
generated from ``Settings``; an error is one line naming its input, and a non-zero exit.
The commands are in ``workers/commands.py`` (``eval`` in ``workers/eval_command.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ctxcore import __version__
from ctxcore.config import environment_variables
from ctxcore.errors import CtxcoreError
from workers import commands, local_model
from workers.cli_parser import Parser, missing_extra, port, positive_float, positive_int
from workers.commands import bundled_sample
from workers.eval_command import EVAL_POLICIES, cmd_eval

__all__ = ["EVAL_POLICIES", "build_parser", "bundled_sample", "main"]


_MODEL_HELP = "model name picking the tokenizer (default: engine.tokenizer_model, else cl100k_base)"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default; an option whose default is computed (None here) says in
    its help what it is, so no "(default: None)" is printed."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or "(default" in text:
            return text
        return super()._get_help_string(action) or text


def environment_epilog() -> str:
    """The ``CTXCORE_*`` variables with their defaults, from the ``Settings`` model."""
    lines = [
        "environment variables (override the --config file; lists, maps and whole sections are",
        "JSON, null is none; in TOML the same keys are [section] key = value):",
    ]
    names = environment_variables()
    width = max(len(name) for name, _ in names)
    lines += [f"  {name:<{width}}  {default}" for name, default in names]
    lines.append(
        "<ID> is a tenant id; a tenant's null values and missing MODEL__* keys mean the global ones."
    )
    return "\n".join(lines)


def build_parser() -> Parser:
    """The argument parser with every subcommand."""
    common = Parser(add_help=False)
    common.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML settings file (default: $CTXCORE_CONFIG_FILE, else none); CTXCORE_* variables "
        "override it, see `ctxcore --help`",
    )
    parser = Parser(
        prog="ctxcore",
        description="A context engine for LLM agents.",
        epilog=environment_epilog(),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ctxcore {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(
        name: str, text: str, func: Any, *options: tuple[str, dict[str, Any]]
    ) -> argparse.ArgumentParser:
        """A subcommand with ``options``: each ``(flag, add_argument's keywords)``."""
        p = sub.add_parser(name, help=text, description=text, parents=[common], formatter_class=HelpFormatter)
        p.set_defaults(func=func)
        parser.commands.append((name, text))
        for flag, spec in options:
            p.add_argument(flag, **spec)
        return p

    model_option = ("--model", {"default": None, "help": _MODEL_HELP})
    conversation = [("tenant", {"help": "tenant id"}), ("conversation", {"help": "conversation id"})]
    command(
        "count",
        "token counts of the conversations of a JSONL file",
        commands.cmd_count,
        (
            "file",
            {"nargs": "?", "help": "JSONL of {'id', 'messages': [...]} (default: the bundled sample runs)"},
        ),
        model_option,
        ("--json", {"action": "store_true", "help": "print JSON instead of a table"}),
    )
    command(
        "demo",
        "run the distributed service on the bundled sample runs",
        commands.cmd_demo,
        (
            "--timeout",
            {
                "type": positive_float,
                "default": 100.0,
                "metavar": "SECONDS",
                "help": "seconds before the demo wraps up",
            },
        ),
    )
    command(
        "worker",
        "start a Celery compaction worker",
        commands.cmd_worker,
        (
            "--concurrency",
            {
                "type": positive_int,
                "default": None,
                "metavar": "N",
                "help": "worker pool size (default: worker.concurrency of the settings, 2)",
            },
        ),
        (
            "--loglevel",
            {"default": "INFO", "choices": ("DEBUG", "INFO", "WARNING", "ERROR"), "help": "Celery log level"},
        ),
        (
            "--hostname",
            {
                "default": None,
                "metavar": "NAME",
                "help": "node name shown in Flower, e.g. worker1@%%h (default: Celery's celery@<host>)",
            },
        ),
        (
            "--node",
            {
                "default": "all",
                "choices": ("all", "stages", "drain"),
                "help": "queues to consume: all (on RabbitMQ a stages node and a drain node, started "
                "together), stages (worker.concurrency processes) or drain (new jobs, one process)",
            },
        ),
    )
    command(
        "flower",
        "monitor the workers with Flower (the configured Redis and key prefix, on "
        "flower.host:flower.port, 127.0.0.1:5555; another address needs flower.basic_auth; "
        "Flower's other options after --, e.g. -- --persistent=True)",
        commands.cmd_flower,
        (
            "flower_args",
            {
                "nargs": argparse.REMAINDER,
                "metavar": "-- FLOWER_OPTION",
                "help": "Flower's own options, after '--' (not --address, --port or --basic-auth: the "
                "flower.* settings set them)",
            },
        ),
    )
    command(
        "serve",
        "serve the HTTP API",
        commands.cmd_serve,
        ("--host", {"default": None, "help": "address to bind (default: http.host, 127.0.0.1)"}),
        ("--port", {"type": port, "default": None, "help": "port to bind (default: http.port, 8080)"}),
        ("--workers", {"type": positive_int, "help": "API processes on the port (default: http.workers, 1)"}),
    )

    token = command("token", "manage bearer tokens of the HTTP API", None)
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", title="actions", required=True)
    create = token_sub.add_parser(
        "create",
        help="print a new token and the config lines of its sha256",
        description="Print a new bearer token (once) and both config forms of its sha256.",
        parents=[common],
        formatter_class=HelpFormatter,
    )
    create.add_argument("tenant", help="the tenant id the token authenticates as")
    create.set_defaults(func=commands.cmd_token_create)

    command(
        "compact",
        "offline batch compaction of a JSONL file",
        commands.cmd_compact,
        ("file", {"help": "JSONL of {'id', 'messages': [...]}, one conversation a line"}),
        (
            "--out",
            {
                "required": True,
                "help": "where to write the windows (JSONL); replaced only when the batch ends",
            },
        ),
        (
            "--budget",
            {
                "type": positive_int,
                "required": True,
                "metavar": "TOKENS",
                "help": "token budget of each window",
            },
        ),
        model_option,
        (
            "--continue-on-error",
            {
                "action": "store_true",
                "help": "name each conversation that fails on stderr, write the others, exit 1",
            },
        ),
    )
    ev = command(
        "eval",
        "replay conversations through policies and score their windows",
        cmd_eval,
        ("file", {"help": "JSONL of {'id', 'messages': [...], 'qa'?: [...]}"}),
        (
            "--policy",
            {
                "required": True,
                "metavar": "NAME,...",
                "help": f"comma-separated policies to replay side by side: {', '.join(EVAL_POLICIES)}",
            },
        ),
        (
            "--baseline",
            {
                "default": "steps",
                "help": "policy wins and losses are counted against, added when missing ('none': no baseline)",
            },
        ),
        (
            "--windows-out",
            {
                "metavar": "FILE",
                "help": "write each conversation's final window per policy here, JSONL (default: not written)",
            },
        ),
        (
            "--recall",
            {
                "choices": ("off", "auto"),
                "default": "off",
                "help": "auto: every listed full also runs as full+recall (archive, recall tool, auto-recall)",
            },
        ),
    )
    size = ev.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--budget",
        type=positive_int,
        metavar="TOKENS",
        help="token budget of every window (or --budget-ratio)",
    )
    size.add_argument(
        "--budget-ratio",
        type=positive_float,
        metavar="R",
        help="budget as a share of each conversation's tokens (or --budget)",
    )
    for flag, spec in (
        ("--json", {"metavar": "FILE", "help": "write the full JSON report here (default: not written)"}),
        (
            "--plot",
            {
                "metavar": "PNG",
                "help": "write a PNG plot here; needs pip install 'ctxcore[plot]' (default: none)",
            },
        ),
        (
            "--limit",
            {
                "type": positive_int,
                "default": None,
                "metavar": "K",
                "help": "only the first K conversations (default: all)",
            },
        ),
        (
            "--ids",
            {
                "default": None,
                "metavar": "ID,...",
                "help": "only these conversation ids, comma-separated (default: all)",
            },
        ),
        (
            "--step-stride",
            {
                "type": positive_int,
                "default": 1,
                "metavar": "N",
                "help": "a window every N assistant steps without a user message",
            },
        ),
        (
            "--lag",
            {
                "type": int,
                "default": 0,
                "metavar": "N",
                "help": "full's compactions land N windows after they were asked for (a lagging worker; "
                "the windows between are served by the fast path's rules); 0: before the window",
            },
        ),
        model_option,
        ("--quiet", {"action": "store_true", "help": "print the overall row only"}),
        ("--progress", {"action": "store_true", "help": "print each conversation's time to stderr"}),
    ):
        ev.add_argument(flag, **spec)

    command(
        "inspect",
        "show a conversation's compaction: status, blocks, journal",
        commands.cmd_inspect,
        *conversation,
        ("--history", {"action": "store_true", "help": "also print the last 20 kept versions"}),
        ("--json", {"action": "store_true", "help": "the whole compaction state as JSON"}),
    )
    command(
        "rollback",
        "restore an earlier state version (as a new version)",
        commands.cmd_rollback,
        *conversation,
        ("version", {"type": positive_int, "help": "the kept version to make current again"}),
    )

    model = command("model", "a local summarisation model (the local-model extra)", None)
    local_model.add_model_parser(model, common, HelpFormatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxcore`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.missing_command()
    try:
        return int(args.func(args, sys.stdout))
    except (CtxcoreError, OSError) as exc:
        print(f"ctxcore: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        # Installed without the extra the command needs: say which, not a traceback.
        line = missing_extra(exc, args.command)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ctxcore: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
