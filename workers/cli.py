"""The ``ctxcore`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from ctxcore.errors import CtxcoreError
from ctxcore.messages import from_openai
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window


def bundled_sample() -> Path:
    """Path of the bundled sample conversations."""
    return Path(str(resources.files("ctxcore").joinpath("samples", "agent_runs.jsonl")))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CtxcoreError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if isinstance(record, list):
                record = {"id": f"line-{n}", "messages": record}
            if not isinstance(record, dict) or "messages" not in record:
                raise CtxcoreError(f"{path}:{n}: expected an object with 'messages' or a list of messages")
            records.append(record)
    return records


def cmd_count(args: argparse.Namespace, out: TextIO) -> int:
    """Print token counts per conversation of a JSONL file."""
    path = Path(args.file) if args.file else bundled_sample()
    counter = TiktokenCounter(args.model)
    rows = []
    for record in _read_jsonl(path):
        messages = from_openai(record["messages"])
        rows.append(
            {
                "id": str(record.get("id", "?")),
                "messages": len(messages),
                "tokens": counter.count_messages(messages),
                "violations": len(check_window(messages)),
            }
        )
    if args.json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return 0
    width = max([len(r["id"]) for r in rows] + [12])
    out.write(f"{'conversation':<{width}}  {'messages':>8}  {'tokens':>8}  {'violations':>10}\n")
    for r in rows:
        out.write(f"{r['id']:<{width}}  {r['messages']:>8}  {r['tokens']:>8}  {r['violations']:>10}\n")
    total = sum(r["tokens"] for r in rows)
    out.write(f"{'total':<{width}}  {sum(r['messages'] for r in rows):>8}  {total:>8}\n")
    out.write(f"encoding: {counter.encoding_name} ({path})\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="ctxcore", description="A context engine for LLM agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    count = sub.add_parser("count", help="token counts of conversations in a JSONL file")
    count.add_argument("file", nargs="?", help="JSONL of {'messages': [...]} (default: the bundled sample)")
    count.add_argument("--model", default=None, help="model name picking the tokenizer (default cl100k_base)")
    count.add_argument("--json", action="store_true", help="print JSON instead of a table")
    count.set_defaults(func=cmd_count)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxcore`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args, sys.stdout))
    except (CtxcoreError, OSError) as exc:
        print(f"ctxcore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
