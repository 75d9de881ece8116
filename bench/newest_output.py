"""The window at an output larger than the window: what of it, and of the steps before it, is served.

The development runs with every 8th tool result grown to CHARS characters by filler test-log
lines (naming nothing the runs name) before it (``bench/harness_forms.py:
with_huge_outputs``: an output no harness truncated). Each run is cut right after each of its
first two grown outputs and replayed by ``ctxcore eval`` (``steps`` and ``full``, lag 0 and
5); the final window of each cut is the one the agent reads with that output newest. Printed per budget and policy (medians over the cuts):

* ``fill``: the window's tokens over the budget;
* ``newest kept``: characters of the grown output served, over its characters; its own
  output (what the run's harness had printed, after the filler) in full in the window;
* ``older held``: tool results before it that the window holds (previewed or not), and
  ``older whole``: the share of those served verbatim (not previewed, cleared or cut).

    CTXCORE_DATA_DIR=../shared/data .venv/bin/python bench/newest_output.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from ctxcore.config import Settings
from ctxcore.eval import EvalConfig, evaluate_file
from ctxcore.messages import content_text

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness_forms import FILLER_LINE, with_huge_outputs  # noqa: E402

SPLIT = REPO / "bench" / "dev_split.json"
EVERY = 8


def cuts(data: Path, ids: set[str], chars: int, per_run: int, out: Path) -> dict[str, dict[str, Any]]:
    """Write a run cut after each of its first ``per_run`` grown outputs per row; what each
    cut's newest output is."""
    meta: dict[str, dict[str, Any]] = {}
    with out.open("w") as dst:
        for line in data.open():
            run = json.loads(line)
            if run["id"] not in ids:
                continue
            grown = with_huge_outputs(run, chars, EVERY)["messages"]
            seen = 0
            for n, message in enumerate(grown):
                if message.get("role") != "tool" or not isinstance(message.get("content"), str):
                    continue
                seen += 1
                if seen % EVERY or seen > EVERY * per_run:
                    continue
                cut_id = f"{run['id']}@{n}"
                older = [m["content"] for m in grown[:n] if m.get("role") == "tool"]
                own = message["content"].split(FILLER_LINE)[-1]
                meta[cut_id] = {"chars": len(message["content"]), "own": own, "older": older}
                dst.write(json.dumps({"id": cut_id, "messages": grown[: n + 1]}) + "\n")
    return meta


def text(message: dict[str, Any]) -> str:
    return content_text(message.get("content"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=150_000)
    parser.add_argument("--cuts-per-run", type=int, default=2, help="cuts after the first K grown outputs")
    parser.add_argument("--budgets", type=int, nargs="*", default=[8000, 16000, 32000])
    parser.add_argument("--lags", type=int, nargs="*", default=[0, 5])
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("CTXCORE_DATA_DIR", "../shared/data"))
    )
    args = parser.parse_args()
    split = json.loads(SPLIT.read_text())
    ids = set(split["A"]) | set(split["B"])
    scratch = tempfile.TemporaryDirectory()
    path = Path(scratch.name) / "cuts.jsonl"
    meta = cuts(args.data / "minisweagent_dev.jsonl", ids, args.chars, args.cuts_per_run, path)
    print(f"{len(meta)} cuts of {len(ids)} runs, grown outputs of {args.chars} characters\n")
    print("| budget | lag | policy | fill | newest kept | own output whole | older held | older whole |")
    print("|---|---|---|---|---|---|---|---|")
    settings = Settings.from_env()
    for budget in args.budgets:
        for lag in args.lags:
            windows = Path(scratch.name) / f"w{budget}-{lag}.jsonl"
            config = EvalConfig(
                policies=["full"], budget=budget, lag=lag, settings=settings, windows_out=windows
            )
            evaluate_file(path, config)
            rows: dict[str, list[tuple[float, float, float, float, float]]] = {}
            for line in windows.open():
                row = json.loads(line)
                info = meta[row["id"]]
                served = row["messages"]
                newest = text(served[-1]) if served and served[-1].get("role") == "tool" else ""
                older = set(info["older"])
                held = [m for m in served[:-1] if m.get("role") == "tool"]
                whole = sum(text(m) in older for m in held) / len(held) if held else 1.0
                rows.setdefault(row["policy"], []).append(
                    (
                        row["tokens"] / budget,
                        len(newest) / info["chars"],
                        float(info["own"].strip()[-200:] in newest),
                        float(len(held)),
                        whole,
                    )
                )
            for policy, values in sorted(rows.items()):
                fill, kept, held, whole = (statistics.median(v[k] for v in values) for k in (0, 1, 3, 4))
                own = sum(v[2] for v in values) / len(values)
                print(
                    f"| {budget} | {lag} | {policy} | {fill:.2f} | {kept:.3f} | {own:.2f} | {held:.0f} | {whole:.2f} |"
                )


if __name__ == "__main__":
    main()
