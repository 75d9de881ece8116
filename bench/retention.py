"""Benchmark: what every context policy keeps, side by side in one run per file and budget.

Each (file, budget) is one ``ctxcore eval`` run of all nine policies (truncate, steps, mask,
lossless, rules, current_round, dialogue, round_level, full) with ``steps`` as the baseline
and ``ExtractiveModel`` as the summariser, exactly as

    ctxcore eval FILE --policy truncate,steps,mask,lossless,rules,current_round,dialogue,round_level,full \\
        (--budget N | --budget-ratio R)

does. The mini-swe-agent runs are measured at 8k, 16k and 32k tokens (probes of the raw run,
final / mean over windows), LoCoMo at 0.25 of each conversation's tokens (QA on the fixed
compacted set). It prints one table per run and asserts nothing.

    .venv/bin/python bench/retention.py                       # every conversation (about 10 min)
    .venv/bin/python bench/retention.py --quick               # 5 SWE runs, 3 LoCoMo conversations
    .venv/bin/python bench/retention.py --swe-budgets 16000 --locomo-ratios --json out.json

Data: ``CTXCORE_DATA_DIR`` (default ``../shared/data``).
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
from ctxcore.eval.report import format_report

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
ORDER = ["truncate", "steps", "mask", "lossless", "rules", "current_round", "dialogue", "round_level", "full"]


def run(
    path: Path, policies: list[str], budget: float, limit: int | None, ratio: bool, windows_out: Path | None
) -> dict[str, Any]:
    config = EvalConfig(
        policies=policies,
        budget=None if ratio else int(budget),
        budget_ratio=budget if ratio else None,
        limit=limit,
        windows_out=windows_out,
    )
    started = time.perf_counter()
    report = evaluate_file(
        path,
        config,
        progress=lambda r: print(
            f"  {r.id} {r.policy}: {r.elapsed_seconds:.1f} s", file=sys.stderr, flush=True
        ),
    )
    print(format_report(report, per_conversation=False))
    print(f"({time.perf_counter() - started:.0f} s)\n", flush=True)
    for rep in report.get("reports", [report]):
        rep.pop("conversations", None)
    return report


def plot(reports: list[dict[str, Any]], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install 'ctxcore[plot]')"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in ORDER:
        points = []
        for report in reports:
            if report.get("budget") is None:
                continue
            for rep in report.get("reports", [report]):
                probes = rep["overall"].get("probes")
                if rep["policy"] == policy and probes:
                    values = [p["final"] for p in probes.values()]
                    points.append((report["budget"], sum(values) / len(values)))
        if points:
            points.sort()
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=policy)
    ax.set_xlabel("budget (tokens)")
    ax.set_ylabel("mean probe retention, final windows")
    ax.set_ylim(0, 1.05)
    ax.set_title("mini-swe-agent runs: retention vs budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 SWE runs and 3 LoCoMo conversations")
    parser.add_argument("--locomo-ratios", type=float, nargs="*", default=[0.25], help="LoCoMo budget ratios")
    parser.add_argument(
        "--swe-budgets", type=int, nargs="*", default=[8000, 16000, 32000], help="SWE budgets"
    )
    parser.add_argument("--policies", default=",".join(ORDER))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", help="write every report (without per-conversation rows) here")
    parser.add_argument("--windows-out", type=Path, help="a folder for each run's final windows (JSONL)")
    parser.add_argument("--plot", help="write SWE retention vs budget here (PNG, needs matplotlib)")
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICIES:
            raise SystemExit(f"unknown policy {p!r}; choices: {', '.join(POLICIES)}")
    locomo, swe = args.data / "locomo.jsonl", args.data / "minisweagent_dev.jsonl"
    if not swe.exists() or (args.locomo_ratios and not locomo.exists()):
        raise SystemExit(f"no data in {args.data} (set CTXCORE_DATA_DIR)")
    started = time.perf_counter()
    reports: list[dict[str, Any]] = []

    def out_file(label: str) -> Path | None:
        if args.windows_out is None:
            return None
        args.windows_out.mkdir(parents=True, exist_ok=True)
        return args.windows_out / f"{label}.jsonl"

    for budget in args.swe_budgets:
        print(f"## {swe.name}, budget {budget} tokens\n", flush=True)
        reports.append(
            run(swe, policies, budget, 5 if args.quick else None, False, out_file(f"swe-{budget}"))
        )
    for ratio in args.locomo_ratios:
        print(f"## {locomo.name}, budget {ratio} of each conversation\n", flush=True)
        reports.append(
            run(locomo, policies, ratio, 3 if args.quick else None, True, out_file(f"locomo-{ratio}"))
        )
    print(f"{time.perf_counter() - started:.0f} s in total")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    if args.plot:
        print(plot(reports, args.plot))


if __name__ == "__main__":
    main()
