"""Benchmark: the default rule chain on the shared conversations, beside the masking bound.

For each file of ``../shared/data``: tokens before and after ``apply_rules`` with the
default chain (``MessageSummaryOffloader -> ToolResultBudgetProcessor ->
MicroCompactProcessor -> CompactCompletedToolTurns -> WindowLimit``), milliseconds per
conversation, protocol/anchor violations, and the *masking bound*: the tokens left if
every tool output except the newest three became a one-line placeholder. The chain is
configured for a small window (``--context-window``, default 16000 tokens) so it acts on
conversations of this size. Prints a table; asserts nothing.

    .venv/bin/python bench/rule_processors.py [--context-window 16000] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from ctxcore.markers import CLEARED_TOOL_RESULT
from ctxcore.messages import AnyMessage, SystemMessage, ToolMessage, from_openai, replace_content
from ctxcore.processors import apply_rules, build_rule_chain, default_rule_chain
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
FILES = ("tau_bench.jsonl", "minisweagent_dev.jsonl", "locomo.jsonl")
KEEP_NEWEST_TOOL_OUTPUTS = 3


def masking_bound(messages: list[AnyMessage]) -> list[AnyMessage]:
    """Every tool output but the newest three replaced by a one-line placeholder."""
    tool_positions = [i for i, m in enumerate(messages) if isinstance(m, ToolMessage)]
    masked = set(tool_positions[: max(len(tool_positions) - KEEP_NEWEST_TOOL_OUTPUTS, 0)])
    return [replace_content(m, CLEARED_TOOL_RESULT) if i in masked else m for i, m in enumerate(messages)]


def split(record: dict[str, Any]) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """System messages apart; the rest with log ids as a context would give them."""
    messages = from_openai(record["messages"])
    system: list[AnyMessage] = [m for m in messages if isinstance(m, SystemMessage)]
    rest = [m for m in messages if not isinstance(m, SystemMessage)]
    return system, [m.model_copy(update={"context_message_id": f"{i + 1:012d}"}) for i, m in enumerate(rest)]


def anchors_kept(before: list[AnyMessage], after: list[AnyMessage]) -> bool:
    """Both anchors of ``before`` present, verbatim, in ``after``."""
    return all(before[i] in after for i in anchors(before).indices())


def run_file(path: Path, context_window: int, counter: TiktokenCounter) -> dict[str, Any]:
    """Figures for one data file."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    chain = build_rule_chain(default_rule_chain(context_window))
    before = after = bound = violations = 0
    timings = []
    for n, record in enumerate(records):
        system, rest = split(record)
        key = ConversationKey("bench", f"{path.stem}-{n}")
        started = time.perf_counter()
        out = apply_rules(rest, chain, counter, MemoryOffloadStore(), key, budget_tokens=context_window)
        timings.append((time.perf_counter() - started) * 1000)
        before += counter.count_messages([*system, *rest])
        after += counter.count_messages([*system, *out])
        bound += counter.count_messages([*system, *masking_bound(rest)])
        violations += len(check_window([*system, *out])) + (0 if anchors_kept(rest, out) else 1)
    return {
        "file": path.name,
        "conversations": len(records),
        "before": before,
        "after": after,
        "bound": bound,
        "ms": statistics.mean(timings),
        "ms_max": max(timings),
        "violations": violations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context-window", type=int, default=16000, help="tokens the chain is scaled to")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding the .jsonl files")
    args = parser.parse_args()
    counter = TiktokenCounter()
    rows = [
        run_file(args.data / name, args.context_window, counter)
        for name in FILES
        if (args.data / name).exists()
    ]
    if not rows:
        raise SystemExit(f"no data files found in {args.data}")
    print(f"default rule chain, context window {args.context_window} tokens (TiktokenCounter, cl100k_base)\n")
    header = (
        f"| {'file':<24} | convs | {'tokens before':>13} | {'after':>9} | {'bound':>9} | after/bound | "
        f"kept | ms/conv (max) | violations |"
    )
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for row in rows:
        ratio = row["after"] / row["bound"]
        kept = row["after"] / row["before"]
        print(
            f"| {row['file']:<24} | {row['conversations']:>5} | {row['before']:>13,} | {row['after']:>9,} | "
            f"{row['bound']:>9,} | {ratio:>11.2f} | {kept:>4.0%} | {row['ms']:>6.1f} ({row['ms_max']:>5.1f}) | "
            f"{row['violations']:>10} |"
        )
    print(
        "\nbound = tokens left if every tool output but the newest 3 became a one-line placeholder; "
        "goal: after/bound <= 1.10, 0 violations"
    )


if __name__ == "__main__":
    main()
