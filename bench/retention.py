"""Benchmark: what each context policy keeps, side by side, across budgets (``ctxcore eval``).

For LoCoMo (budgets as a ratio of each conversation's tokens) and the mini-swe-agent runs
(absolute budgets), every policy of ``ctxcore.eval`` (truncate, rules, current_round,
dialogue, round_level, full) is replayed turn by turn with ``ExtractiveModel`` as the
summariser, exactly as ``ctxcore eval FILE --policy P ...`` does. Per file and budget, one
table row per policy: violations, anchor rate, peak window / budget, compression, LoCoMo QA
(substring hit rate first, answer recall, the same for compacted questions, the control
against the next conversation's answers and its flag) or tool-run needles (task anchor,
edited paths, last error, final result), summariser calls and seconds. ``--plot`` draws
retention vs budget per policy (needs matplotlib). Asserts nothing.

    .venv/bin/python bench/retention.py                 # quick: 3 LoCoMo x {0.25, 0.5}, 5 SWE x {8k, 16k}
    .venv/bin/python bench/retention.py --long          # all conversations, five budgets each
    .venv/bin/python bench/retention.py --locomo-ratios 0.25 --swe-budgets 16000 --all
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ctxcore.eval import POLICIES, EvalConfig, evaluate_file
from ctxcore.eval.report import format_row, summary_columns

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
ORDER = ["truncate", "rules", "current_round", "dialogue", "round_level", "full"]


def run(
    path: Path, policies: list[str], budgets: list[float], limit: int | None, ratio: bool
) -> list[dict[str, Any]]:
    reports = []
    for budget in budgets:
        rows = []
        for policy in policies:
            config = EvalConfig(
                policy=policy,
                budget=None if ratio else int(budget),
                budget_ratio=budget if ratio else None,
                limit=limit,
            )
            report = evaluate_file(path, config)
            report.pop("conversations", None)
            reports.append(report)
            rows.append({"policy": policy, **summary_columns(report["overall"])})
            print(
                f"  {path.name} {budget} {policy}: {report['elapsed_seconds']} s", file=sys.stderr, flush=True
            )
        label = f"x{budget} of each conversation" if ratio else f"{int(budget)} tokens"
        print(f"\n{path.name}, budget {label}, {reports[-1]['overall']['conversations']} conversations\n")
        print(format_row(rows))
    return reports


def plot(reports: list[dict[str, Any]], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy in ORDER:
        qa = sorted(
            (r["budget_ratio"], r["overall"].get("compacted_answer_recall"))
            for r in reports
            if r["policy"] == policy and r["budget_ratio"] is not None
        )
        qa = [(x, y) for x, y in qa if y is not None]
        if qa:
            left.plot([x for x, _ in qa], [y for _, y in qa], marker="o", label=policy)
        swe = []
        for r in reports:
            needles = r["overall"].get("needle_retention")
            if r["policy"] == policy and r["budget"] is not None and needles:
                values = [
                    needles[k]
                    for k in ("task_anchor", "edited_paths", "last_error", "final_result")
                    if needles.get(k) is not None
                ]
                swe.append((r["budget"], sum(values) / len(values)))
        if swe:
            swe.sort()
            right.plot([x for x, _ in swe], [y for _, y in swe], marker="o", label=policy)
    left.set_xlabel("budget (share of each LoCoMo conversation's tokens)")
    left.set_ylabel("answer recall, compacted questions")
    left.set_ylim(0, 1)
    left.set_title("LoCoMo: retention vs budget")
    left.legend(fontsize=8)
    right.set_xlabel("budget (tokens)")
    right.set_ylabel("mean needle retention")
    right.set_ylim(0, 1.05)
    right.set_title("mini-swe-agent runs: retention vs budget")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="all conversations, five budgets per file")
    parser.add_argument("--all", action="store_true", help="all conversations (with the given budgets)")
    parser.add_argument("--locomo-ratios", type=float, nargs="*", help="LoCoMo budget ratios")
    parser.add_argument("--swe-budgets", type=int, nargs="*", help="SWE budgets in tokens")
    parser.add_argument("--policies", default=",".join(ORDER))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", help="write every overall object here")
    parser.add_argument("--plot", help="write retention vs budget here (PNG, needs matplotlib)")
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICIES:
            raise SystemExit(f"unknown policy {p!r}")
    ratios = (
        args.locomo_ratios
        if args.locomo_ratios is not None
        else ([0.1, 0.15, 0.25, 0.35, 0.5] if args.long else [0.25, 0.5])
    )
    budgets = (
        args.swe_budgets
        if args.swe_budgets is not None
        else ([8000, 12000, 16000, 24000, 32000] if args.long else [8000, 16000])
    )
    every = args.long or args.all
    started = time.perf_counter()
    reports: list[dict[str, Any]] = []
    locomo, swe = args.data / "locomo.jsonl", args.data / "minisweagent_dev.jsonl"
    if not locomo.exists() or not swe.exists():
        raise SystemExit(f"no data in {args.data} (set CTXCORE_DATA_DIR)")
    if ratios:
        reports += run(locomo, policies, ratios, None if every else 3, ratio=True)
    if budgets:
        reports += run(swe, policies, [float(b) for b in budgets], None if every else 5, ratio=False)
    print(f"\n{time.perf_counter() - started:.0f} s in total")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    if args.plot:
        print(plot(reports, args.plot))


if __name__ == "__main__":
    main()
