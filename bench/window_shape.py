"""Benchmark: `full`'s window shape against `steps` for chunk sizes and summary shares (issue 32).

Each variant replays both development halves (``bench/dev_split.json``) at the given budgets
through ``ctxcore eval`` (``full`` with ``steps`` as the baseline) and prints one line per
half and budget: next-step references and stale ones (``full`` / ``steps``), wins/losses,
the median fill of the pressed checkpoints, the prompt-cache share, run cost over
``steps``'s, summariser calls and sent/raw, and the blocks' and raw history's shares of the
budget. A chunk c is ``service.target_ratio = 1 - c`` (trigger 1.0); the summary share is
the pipeline's ``summary_share`` (no setting exposes it: patched here for the sweep only).

    .venv/bin/python bench/window_shape.py                          # chunk 0.1/0.2/0.3, 8k/16k/32k
    .venv/bin/python bench/window_shape.py --variants share.25 --budgets 8000 16000
    .venv/bin/python bench/window_shape.py --variants chunk.2 --lag 5 --budgets 16000

Data: ``CTXCORE_DATA_DIR`` (default ``../shared/data``). It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.eval import EvalConfig, evaluate_file
from ctxcore.eval.policies import FullPolicy
from ctxcore.eval.policy_base import PolicyWindow
from ctxcore.pipeline import PipelineConfig

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = Path(os.environ.get("CTXCORE_DATA_DIR", HERE.parents[1] / "shared" / "data"))
VARIANTS: dict[str, dict[str, float]] = {
    "chunk.1": {"target": 0.9},
    "chunk.15": {"target": 0.85},
    "chunk.2": {},
    "chunk.25": {"target": 0.75},
    "chunk.3": {"target": 0.7},
    "share.25": {"share": 0.25},
    "share.5": {"share": 0.5},
    "share.15": {"share": 0.15},
    "nocap": {"cap": 1.0},
}


@contextmanager
def summary_share(share: float | None) -> Iterator[None]:
    """Every ``Coordinator`` plans with ``share`` as its pipeline's ``summary_share``."""
    if share is None:
        yield
        return
    original = Coordinator.pipeline_config

    def patched(self: Coordinator, key: Any, budget: int | None = None) -> PipelineConfig:
        return original(self, key, budget).model_copy(update={"summary_share": share})

    Coordinator.pipeline_config = patched  # type: ignore[method-assign]
    try:
        yield
    finally:
        Coordinator.pipeline_config = original  # type: ignore[method-assign]


@contextmanager
def pressed_fills(budget: int) -> Iterator[list[float]]:
    """Every ``full`` window served while its run so far (system and log) exceeds ``budget``,
    as a share of it: the fill of all pressed windows, not only the four checkpoints a run
    is scored at (about 40 per half: their median moves by 0.01-0.02 from run to run)."""
    fills: list[float] = []
    original = FullPolicy.window

    def patched(self: FullPolicy) -> PolicyWindow:
        served = original(self)
        counter = self.setup.counter
        if counter.count_messages([*self.setup.system, *self.log.read_after(self.key, None)]) > budget:
            fills.append(counter.count_messages(list(served.messages)) / budget)
        return served

    FullPolicy.window = patched  # type: ignore[method-assign]
    try:
        yield fills
    finally:
        FullPolicy.window = original  # type: ignore[method-assign]


def line(
    name: str, half: str, budget: int, lag: int, report: dict[str, Any], fills: list[float], seconds: float
) -> str:
    by = {r["policy"]: r["overall"] for r in report["reports"]}
    full, steps = by["full"], by["steps"]
    fr, sr = full["references"], steps["references"]
    wl, spend = fr["vs_baseline"], full["spend"]
    return (
        f"{name:9s} {half} {budget:6d} lag {lag} | refs {fr['overall']:.3f} / {sr['overall']:.3f} "
        f"stale {fr['stale']:.3f} / {sr['stale']:.3f} | W/L {wl['win']}/{wl['loss']} "
        f"| fill {fr['fill']['median_over_budget']:.2f} (all {statistics.median(fills or [0.0]):.3f}) cache {spend['cache_share']:.2f} "
        f"cost {spend['cost_vs_baseline']:.2f} calls {full['summariser_calls']} "
        f"sent/raw {full['summariser_input_ratio']:.2f} | blocks {spend['parts']['blocks']:.2f} "
        f"raw {spend['parts']['raw']:.2f} ({seconds:.0f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants", nargs="*", default=["chunk.1", "chunk.2", "chunk.3"], choices=list(VARIANTS)
    )
    parser.add_argument("--budgets", type=int, nargs="*", default=[8000, 16000, 32000])
    parser.add_argument("--lag", type=int, default=0)
    parser.add_argument("--halves", default="A,B")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    runs = args.data / "minisweagent_dev.jsonl"
    if not runs.exists():
        raise SystemExit(f"no data in {args.data} (set CTXCORE_DATA_DIR)")
    split = json.loads((HERE / "dev_split.json").read_text())
    for name in args.variants:
        knobs = VARIANTS[name]
        settings = Settings.load(
            {
                "service": {"target_ratio": knobs.get("target", 0.8)},
                "engine": {"max_result_ratio": knobs.get("cap", 0.25)},
            }
        )
        with summary_share(knobs.get("share")):
            for half in args.halves.split(","):
                for budget in args.budgets:
                    started = time.perf_counter()
                    config = EvalConfig(
                        policies=["full"], budget=budget, ids=split[half], settings=settings, lag=args.lag
                    )
                    with pressed_fills(budget) as fills:
                        report = evaluate_file(runs, config)
                    seconds = time.perf_counter() - started
                    print(line(name, half, budget, args.lag, report, fills, seconds), flush=True)


if __name__ == "__main__":
    main()
