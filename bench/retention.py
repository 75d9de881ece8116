"""Benchmark: what each policy's windows let the agent do next, on both development halves.

For every development half (``bench/dev_split.json``: the 22 mini-swe-agent runs, sorted by
id and dealt alternately to A and B, fixed), every budget and every lag, one
``ctxcore eval`` run of the policies side by side with ``steps`` as the baseline and
``ExtractiveModel`` as the summariser, as

    ctxcore eval minisweagent_dev.jsonl --ids <half> --policy truncate,steps,mask,full \\
        --budget 8000|16000|32000 --lag 0|5

does. Per policy it prints the next-step references held (overall / recent / stale / by
kind, wins and losses per run against ``steps`` with a sign test, and ``full`` against
``steps`` given ``full``'s fill), the fill of the checkpoint windows that had to leave
something out, where the budget goes, the prompt-cache share and the run cost (cached input
at 0.1, summariser input 1, output 4) against ``steps``'s, the summariser's calls and
sent/raw, and the validity counts. The same on tau-bench (JSON-argument tools) at 0.5 of
each run's tokens, and optionally LoCoMo (QA). It asserts nothing.

    .venv/bin/python bench/retention.py                       # both halves, 8k/16k/32k, lag 0 and 5
    .venv/bin/python bench/retention.py --quick               # 3 runs per half, 16k, lag 0 and 5
    .venv/bin/python bench/retention.py --budgets 16000 --lags 0 --json out.json
    .venv/bin/python bench/retention.py --system-padding 4 --tau-runs 0   # a 5k-token system prompt
    .venv/bin/python bench/retention.py --harness-form openhands --tau-runs 0   # OpenHands' tools
    .venv/bin/python bench/retention.py --budgets --tau-held-out   # tau-bench, tuned and held out

Data: ``CTXCORE_DATA_DIR`` (default ``../shared/data``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Literal

from ctxcore.config import Settings
from ctxcore.eval import POLICIES, EvalConfig, evaluate_file
from ctxcore.eval.report import format_row

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness_forms import FORMS, as_content_parts, rewrite, with_follow_up, with_huge_outputs  # noqa: E402
from bench.summary_lines import line_stats  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = Path(os.environ.get("CTXCORE_DATA_DIR", HERE.parents[1] / "shared" / "data"))
SPLIT = HERE / "dev_split.json"
ORDER = ["truncate", "steps", "mask", "full"]


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def row(policy: str, overall: Mapping[str, Any]) -> dict[str, str]:
    """One policy's figures as table columns."""
    refs = overall.get("references") or {}
    kinds = refs.get("by_kind") or {}
    spend = overall.get("spend") or {}
    parts = spend.get("parts") or {}
    wl = refs.get("vs_baseline")
    out = {
        "policy": policy,
        "refs": _f(refs.get("overall")),
        "recent": _f(refs.get("recent")),
        "stale": _f(refs.get("stale")),
        "path": _f(kinds.get("path")),
        "ident": _f(kinds.get("identifier")),
        "number": _f(kinds.get("number")),
        "quoted": _f(kinds.get("quoted")),
        "W/L (p)": f"{wl['win']}/{wl['loss']} ({_f(wl['sign_test_p'], 2)})" if wl else "-",
        "fill": _f((refs.get("fill") or {}).get("median_over_budget"), 2),
        "sys+tools": _f(parts.get("system_tools"), 2),
        "anchors": _f(parts.get("anchors"), 2),
        "blocks": _f(parts.get("blocks"), 2),
        "raw": _f(parts.get("raw"), 2),
        "rewritten": _f(parts.get("rewritten"), 2),
        "unused": _f(parts.get("unused"), 2),
        "cache": _f(spend.get("cache_share"), 2),
        "cost/steps": _f(spend.get("cost_vs_baseline"), 2),
        "calls": _f(overall.get("summariser_calls")),
        "sent/raw": _f(overall.get("summariser_input_ratio"), 2),
        "viol": _f(overall.get("violations")),
        "anchor": _f(overall.get("anchor_rate"), 2),
        "over": _f(overall.get("over_budget_windows")),
    }
    return out


def table(report: Mapping[str, Any]) -> str:
    """The report's policies, and ``steps`` at ``full``'s fill, as one table."""
    rows: list[dict[str, str]] = []
    for rep in report.get("reports", [report]):
        overall = rep["overall"]
        rows.append(row(rep["policy"], overall))
        refs = overall.get("references") or {}
        if "matched_fill" in refs:
            matched = {"references": {**refs["matched_fill"], "vs_baseline": refs["vs_matched_fill"]}}
            rows.append(row(f"steps at {rep['policy']}'s fill (W/L: {rep['policy']} vs it)", matched))
    return format_row(rows)


def run(path: Path, label: str, config: EvalConfig) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        windows = Path(tmp) / "windows.jsonl"
        config.windows_out = windows
        report = evaluate_file(path, config)
        # What full's summaries hold in the final windows (bench/summary_lines.py).
        lines = line_stats(windows) if windows.exists() else None
    seconds = time.perf_counter() - started
    print(f"### {label} ({seconds:.0f} s)\n\n{table(report)}\n", flush=True)
    if lines is not None and lines["lines"]:
        print(
            f"full's summaries in the final windows: {lines['lines']} lines, "
            f"{lines['duplicates']} duplicate, {lines['bare']} bare-token\n",
            flush=True,
        )
    report["summary_lines"] = lines
    for rep in report.get("reports", [report]):
        rep.pop("conversations", None)
    report["label"] = label
    return report


def padded(swe: Path, tau: Path, copies: int, into: Path) -> Path:
    """``swe`` with ``copies`` of tau-bench's first system prompt after each system message."""
    manual = json.loads(tau.open().readline())["messages"][0]["content"]
    out = into / f"padded-{swe.name}"
    with swe.open() as src, out.open("w") as dst:
        for line in src:
            run = json.loads(line)
            first = run["messages"][0]
            if first["role"] == "system":
                first["content"] += "\n\n# House manual\n\n" + "\n\n".join([manual] * copies)
            dst.write(json.dumps(run) + "\n")
    return out


def rewritten(data: Path, name: str, change: Callable[[dict[str, Any]], dict[str, Any]], into: Path) -> Path:
    """``data`` with each run rewritten by ``change`` (``bench/harness_forms.py``), in ``into``."""
    out = into / f"{name}-{data.name}"
    with data.open() as src, out.open("w") as dst:
        for line in src:
            dst.write(json.dumps(change(json.loads(line))) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs per half at 16k, 20 tau-bench runs")
    parser.add_argument("--budgets", type=int, nargs="*", default=[8000, 16000, 32000])
    parser.add_argument("--lags", type=int, nargs="*", default=[0, 5])
    parser.add_argument("--halves", default="A,B")
    parser.add_argument("--policies", default=",".join(ORDER))
    parser.add_argument(
        "--tau-runs", type=int, default=60, help="tau-bench runs at 0.5 of their tokens (0: none)"
    )
    parser.add_argument(
        "--tau-held-out",
        action="store_true",
        help="also the tau-bench runs after the first --tau-runs (no rule was tuned on them)",
    )
    parser.add_argument(
        "--locomo-ratios", type=float, nargs="*", default=[], help="LoCoMo budget ratios (QA)"
    )
    parser.add_argument(
        "--recall", action="store_true", help="every full also runs as full+recall (auto-recall)"
    )
    parser.add_argument(
        "--system-padding",
        type=int,
        default=0,
        help="append K copies of tau-bench's first system prompt (~1.25k tokens each) to every "
        "mini-swe-agent system message: a large system prompt, as OpenHands' (0: none)",
    )
    parser.add_argument(
        "--harness-form",
        choices=FORMS,
        help="the development runs with their calls in another harness's forms: openhands "
        "(execute_bash with is_input, heredoc writes and numbered views as editor calls), "
        "codex (shell with an argument vector)",
    )
    parser.add_argument(
        "--content-parts",
        action="store_true",
        help="send every text content (both data sets, after the other rewrites) as a list of "
        "text parts, as OpenHands and LiteLLM's Anthropic route send it",
    )
    parser.add_argument(
        "--huge-outputs",
        type=int,
        default=0,
        metavar="CHARS",
        help="every 8th tool result of the development runs preceded by filler test-log lines "
        "(naming nothing the runs name) up to CHARS characters: an output no harness truncated (0: none)",
    )
    parser.add_argument(
        "--follow-up",
        action="store_true",
        help="the development runs with the user speaking again at 0.6 of each run, between two "
        "steps: a coding session of two requests",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--json", help="write every report (without per-conversation rows) here")
    args = parser.parse_args()
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        if p not in POLICIES:
            raise SystemExit(f"unknown policy {p!r}; choices: {', '.join(POLICIES)}")
    swe, tau, locomo = (args.data / n for n in ("minisweagent_dev.jsonl", "tau_bench.jsonl", "locomo.jsonl"))
    if not swe.exists():
        raise SystemExit(f"no data in {args.data} (set CTXCORE_DATA_DIR)")
    split = json.loads(SPLIT.read_text())
    scratch = tempfile.TemporaryDirectory()
    if args.harness_form:
        swe = rewritten(swe, args.harness_form, partial(rewrite, form=args.harness_form), Path(scratch.name))
    if args.system_padding:
        swe = padded(swe, tau, args.system_padding, Path(scratch.name))
    if args.huge_outputs:
        grow = partial(with_huge_outputs, chars=args.huge_outputs)
        swe = rewritten(swe, "huge", grow, Path(scratch.name))
    if args.follow_up:
        swe = rewritten(swe, "follow-up", with_follow_up, Path(scratch.name))
    if args.content_parts:
        swe, tau = (rewritten(p, "parts", as_content_parts, Path(scratch.name)) for p in (swe, tau))
    budgets = [16000] if args.quick else args.budgets
    # The service's settings as its start-up reads them (CTXCORE_* variables, a config file).
    settings = Settings.from_env()
    recall: Literal["auto", "off"] = "auto" if args.recall else "off"
    started = time.perf_counter()
    reports: list[dict[str, Any]] = []
    for half in args.halves.split(","):
        ids = split[half][:3] if args.quick else split[half]
        for budget in budgets:
            for lag in args.lags:
                config = EvalConfig(
                    policies=policies,
                    budget=budget,
                    ids=ids,
                    lag=lag,
                    recall=recall,
                    settings=settings,
                )
                label = f"half {half} ({len(ids)} runs), {budget} tokens, lag {lag}"
                if args.system_padding:
                    label += f", system prompt + {args.system_padding} manuals"
                if args.harness_form:
                    label += f", {args.harness_form} form"
                if args.huge_outputs:
                    label += f", every 8th output {args.huge_outputs} characters"
                if args.follow_up:
                    label += ", a follow-up request"
                if args.content_parts:
                    label += ", content as parts"
                reports.append(run(swe, label, config))
    tau_runs = min(20, args.tau_runs) if args.quick else args.tau_runs
    if tau_runs and tau.exists():
        for lag in args.lags:
            config = EvalConfig(
                policies=policies, budget_ratio=0.5, limit=tau_runs, lag=lag, recall=recall, settings=settings
            )
            label = f"tau-bench ({tau_runs} runs), 0.5 of each run, lag {lag}"
            reports.append(run(tau, label + (", content as parts" if args.content_parts else ""), config))
    if tau_runs and tau.exists() and args.tau_held_out:
        held_out = [json.loads(line)["id"] for line in tau.open()][tau_runs:]
        for lag in args.lags:
            config = EvalConfig(
                policies=policies, budget_ratio=0.5, ids=held_out, lag=lag, recall=recall, settings=settings
            )
            label = f"tau-bench held out (runs {tau_runs}-{tau_runs + len(held_out) - 1}), 0.5 of each run, lag {lag}"
            reports.append(run(tau, label + (", content as parts" if args.content_parts else ""), config))
    for ratio in args.locomo_ratios:
        config = EvalConfig(policies=policies, budget_ratio=ratio, recall=recall, settings=settings)
        reports.append(run(locomo, f"LoCoMo, {ratio} of each conversation", config))
    print(f"{time.perf_counter() - started:.0f} s in total", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
