"""Benchmark: does each rule of the extractive summariser pay? (issue 33, item 2)

For each development half (``bench/dev_split.json``) and budget, ``full`` runs once with
every rule of ``ExtractiveModel`` (``ctxcore/summarize/extractive/rules.py``) and once with
each named rule switched off, as

    ctxcore eval minisweagent_dev.jsonl --ids <half> --policy full --budget B --lag 0

does with that summariser. It prints, per rule, the next-step references held (overall and
stale) with and without it, the difference, and the runs where the rule wins / loses with
the two-sided sign test; the summary's bare-token lines are in ``retention.py``. It asserts
nothing.

    .venv/bin/python bench/rule_ablation.py --budgets 16000 8000 --jobs 2 --jsonl ablation.jsonl
    .venv/bin/python bench/rule_ablation.py --rules category_priors bare_joined --budgets 16000
    .venv/bin/python bench/rule_ablation.py --rules category_priors lists_joined --together

Data: ``CTXCORE_DATA_DIR`` (default ``../shared/data``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from ctxcore.eval import ConversationResult, EvalConfig, evaluate_file
from ctxcore.eval.next_step import reference_figures, run_score
from ctxcore.eval.references import sign_test
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.extractive.rules import names, without
from ctxcore.tokens import TiktokenCounter

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.summary_lines import line_stats  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = Path(os.environ.get("CTXCORE_DATA_DIR", HERE.parents[1] / "shared" / "data"))
SPLIT = HERE / "dev_split.json"
ALL = "(every rule)"


def one(data: Path, ids: list[str], budget: int, off: str) -> dict[str, Any]:
    """``full`` on ``ids`` at ``budget`` with rule ``off`` switched off (``ALL``: none)."""
    counter = TiktokenCounter()
    rules = without() if off == ALL else without(*off.split("+"))
    results: list[ConversationResult] = []
    config = EvalConfig(
        policies=["full"],
        budget=budget,
        ids=ids,
        baseline=None,
        model=ExtractiveModel(counter, rules=rules),
        counter=counter,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # What full's summaries hold in the final windows (bench/summary_lines.py).
        config.windows_out = Path(tmp) / "windows.jsonl"
        evaluate_file(data, config, progress=results.append)
        lines = line_stats(config.windows_out) if config.windows_out.exists() else None
    refs = reference_figures(results, None)
    return {
        "off": off,
        "budget": budget,
        "overall": refs["overall"],
        "stale": refs["stale"],
        "runs": {r.id: run_score(r) for r in results},
        "calls": sum(r.summariser_calls for r in results),
        "lines": lines,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _lines(res: dict[str, Any]) -> str:
    lines = res.get("lines")
    return "-" if not lines else f"{lines['lines']}/{lines['bare']}"


def compare(base: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """The rule's figures: with it (``base``) against without it (``off``), per run."""
    wins = losses = 0
    for run, mine in base["runs"].items():
        theirs = off["runs"].get(run)
        if mine is None or theirs is None:
            continue
        wins += mine > theirs + 1e-9
        losses += mine < theirs - 1e-9
    diff = base["overall"] - off["overall"]
    return {"diff": diff, "wins": wins, "losses": losses, "p": sign_test(wins, losses)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="*", default=[16000])
    parser.add_argument("--halves", default="A,B")
    parser.add_argument("--rules", nargs="*", default=names(), help="rules to switch off, one at a time")
    parser.add_argument(
        "--together",
        action="store_true",
        help="switch the named rules off in one run (a+b+c), not one at a time",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--jsonl", help="append each result here as it finishes; results already there are not run again"
    )
    args = parser.parse_args()
    without(*args.rules)  # unknown names fail before any run
    if args.together:
        args.rules = ["+".join(args.rules)]
    swe = args.data / "minisweagent_dev.jsonl"
    if not swe.exists():
        raise SystemExit(f"no data in {args.data} (set CTXCORE_DATA_DIR)")
    split = json.loads(SPLIT.read_text())
    jobs = [
        (half, budget, off)
        for budget in args.budgets
        for half in args.halves.split(",")
        for off in [ALL, *args.rules]
    ]
    store = Path(args.jsonl) if args.jsonl else None
    done: dict[tuple[str, int, str], dict[str, Any]] = {}
    if store is not None and store.exists():
        for line in store.read_text().splitlines():
            res = json.loads(line)
            done[(res["half"], res["budget"], res["off"])] = res
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = {
            pool.submit(one, swe, split[job[0]], job[1], job[2]): job for job in jobs if job not in done
        }
        for future in as_completed(futures):
            job = futures[future]
            done[job] = {"half": job[0], **future.result()}
            if store is not None:
                with store.open("a") as fh:
                    fh.write(json.dumps(done[job]) + "\n")
    print(f"{time.perf_counter() - started:.0f} s in total", file=sys.stderr)
    print(
        "| rule off | half, budget | with | without | diff | stale with / without | runs W/L (sign p) | calls with / without "
        "| summary lines / bare-token with / without |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for budget in args.budgets:
        for half in args.halves.split(","):
            base = done[(half, budget, ALL)]
            for off in args.rules:
                res = done[(half, budget, off)]
                c = compare(base, res)
                print(
                    f"| {off} | {half} {budget // 1000}k | {_f(base['overall'])} | {_f(res['overall'])} | "
                    f"{c['diff']:+.3f} | {_f(base['stale'])} / {_f(res['stale'])} | "
                    f"{c['wins']}/{c['losses']} ({_p(c['p'])}) | "
                    f"{base['calls']} / {res['calls']} | {_lines(base)} / {_lines(res)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
