"""``ctxcore eval``: replay conversations through context policies and score every window
(``ctxcore.eval``), its inputs checked before the run starts."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from ctxcore.errors import UsageError
from workers.commands import counter_for, settings_for

__all__ = ["EVAL_POLICIES", "cmd_eval"]

# ``ctxcore.eval.POLICIES`` by name: importing the harness for every command would cost ~0.7 s.
EVAL_POLICIES = (
    "truncate",
    "steps",
    "mask",
    "lossless",
    "rules",
    "current_round",
    "dialogue",
    "round_level",
    "full",
    "full+recall",
)


def _check_eval_inputs(args: argparse.Namespace) -> int:
    """Everything that can be checked before the run, so it fails in a second, not after an
    hour; the number of conversations the run will evaluate."""
    from ctxcore.eval.data import read_records

    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'ctxcore[plot]'")
    for option, value in (("--json", args.json), ("--plot", args.plot)):
        if value and not Path(value).resolve().parent.is_dir():
            raise UsageError(f"{option} {value}: directory {Path(value).resolve().parent} does not exist")
    records = read_records(args.file)
    if not records:
        raise UsageError(f"{args.file}: no conversations (the file is empty)")
    ids = [str(r["id"]) for r in records]
    if not args.ids:
        return min(len(ids), args.limit or len(ids))
    wanted = [i for i in args.ids.split(",") if i]
    unknown = [i for i in wanted if i not in set(ids)]
    if unknown or not wanted:
        shown = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
        raise UsageError(
            f"--ids {args.ids}: no conversation {', '.join(unknown)} in {args.file} (ids: {shown})"
        )
    selected = len(set(wanted) & set(ids))
    return min(selected, args.limit or selected)


def cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    """Replay conversations through context policies and score every window (``ctxcore.eval``)."""
    total = _check_eval_inputs(args)
    from tqdm import tqdm

    from ctxcore.eval import EvalConfig, evaluate_file
    from ctxcore.eval.report import format_report, plot_report
    from workers.runtime import build_model

    settings = settings_for(args)
    counter = counter_for(args, settings)
    config = EvalConfig(
        policies=[p.strip() for p in args.policy.split(",") if p.strip()],
        baseline=None if args.baseline == "none" else args.baseline,
        windows_out=args.windows_out,
        recall=args.recall,
        budget=args.budget,
        budget_ratio=args.budget_ratio,
        limit=args.limit,
        ids=args.ids.split(",") if args.ids else None,
        step_stride=args.step_stride,
        settings=settings,
        lag=args.lag,
        model=build_model(settings.model, counter),
        counter=counter,
    )
    # One step per (conversation, policy) replay, the unit of ``progress``.
    runs = total * len(config.run_policies)
    with tqdm(total=runs, unit="run", file=sys.stderr, disable=not sys.stderr.isatty()) as bar:

        def progress(result: Any) -> None:
            if args.progress:
                bar.write(f"{result.id} {result.policy}: {result.elapsed_seconds:.1f}s", file=sys.stderr)
            bar.update(1)

        report = evaluate_file(args.file, config, progress=progress)
    out.write(format_report(report, per_conversation=not args.quiet))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        out.write(f"wrote {args.json}\n")
    if args.windows_out:
        out.write(f"wrote {args.windows_out}\n")
    if args.plot:
        plot_report(report, args.plot)
        out.write(f"wrote {args.plot}\n")
    return 0
