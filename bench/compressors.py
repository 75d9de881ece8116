"""Benchmark: the LLM compressors on a ~100k-token conversation per data file.

For each file of ``../shared/data`` a conversation of about ``--tokens`` tokens is made by
concatenating its runs in file order (only the first system message is kept; tool-call ids
are prefixed with the run's index). On it, with ``ExtractiveModel`` as the model:

* the ``RoundLevelCompressor`` pipeline stages, each run once in stage order on the view the
  previous one left, with a target that leaves each stage work to do (30%, 15%, 8%, 5% and 3%
  of the conversation's tokens; ``keep_recent_messages=4``);
* the ``RoundLevelCompressor`` processor as a whole (target 30%, on the window path);
* ``CurrentRoundCompressor`` and ``DialogueCompressor`` on the window path (the context
  window is the conversation's size, so their 0.8 trigger fires).

Per row: tokens before and after, model calls, and milliseconds split into the model call
(time inside ``ExtractiveModel.complete``), counting the compression prompt's tokens
(``_fit_call_budget``, a fresh prompt string: measured on the first run, when it is not
cached), and the rest: our own work (planning, targets, views, rendering, applying).
"first" is the first run after every conversation message was counted once (new summaries
and prompts are tokenised then), "warm" the median of the repeated runs, when every count
is a cache hit. The goal for our own warm work is < 5 ms per stage; hard truncate, the model
call and the prompt count are reported apart. Prints tables; asserts nothing.

    .venv/bin/python bench/compressors.py            # quick profile (default): 3 warm runs
    .venv/bin/python bench/compressors.py --long     # 10 warm runs, 100k and 200k tokens
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ctxcore.pipeline.model_call as model_call_module
import ctxcore.pipeline.running as running_module
import ctxcore.pipeline.stages as stages_module
import ctxcore.pipeline.targets as targets_module
import ctxcore.processors.snapshot_compressor as snapshot_module
from ctxcore.engine import ContextEngine
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.pipeline import STAGE_ORDER, PipelineConfig, StageKind, View
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, OutputContract
from ctxcore.tokens import TiktokenCounter, TokenCounter
from ctxcore.window import ContextWindow

DEFAULT_DATA = Path(
    os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
FILES = ("minisweagent_dev.jsonl", "tau_bench.jsonl", "locomo.jsonl")
# Stage kind -> its target as a share of the conversation's tokens: each stage is left work.
CASCADE: tuple[tuple[StageKind, float], ...] = (
    ("l0_to_l1", 0.30),
    ("recursive_merge", 0.15),
    ("aggressive_keep_recent", 0.08),
    ("aggressive_full_context", 0.05),
    ("hard_truncate", 0.03),
)
KEEP_RECENT = 4
GOAL_MS = 5.0


# --- the conversation -------------------------------------------------------------------


def concatenated(path: Path, tokens: int, counter: TokenCounter) -> tuple[list[AnyMessage], list[AnyMessage]]:
    """(first system message, the rest with log ids) of runs of ``path`` up to ``tokens``."""
    system: list[AnyMessage] = []
    body: list[AnyMessage] = []
    total = 0
    with path.open(encoding="utf-8") as fh:
        for k, line in enumerate(fh):
            if not line.strip():
                continue
            record = json.loads(line)
            raw = []
            for m in record["messages"]:
                m = dict(m)
                if m.get("tool_calls"):
                    m["tool_calls"] = [{**c, "id": f"r{k}-{c['id']}"} for c in m["tool_calls"]]
                if m.get("tool_call_id"):
                    m["tool_call_id"] = f"r{k}-{m['tool_call_id']}"
                raw.append(m)
            for message in from_openai(raw):
                if isinstance(message, SystemMessage):
                    if not system:
                        system.append(message)
                        total += counter.count_messages([message])
                    continue
                body.append(message.model_copy(update={"context_message_id": f"{len(body) + 1:012d}"}))
                total += counter.count_messages([message])
            if total >= tokens:
                break
    return system, body


# --- instruments ------------------------------------------------------------------------


@dataclass
class Probe:
    """Seconds spent in the model, in counting and in redacting the prompt; model calls."""

    model: float = 0.0
    prompt: float = 0.0
    redact: float = 0.0
    calls: int = 0
    # Inclusive seconds in parts of our own work (they nest: View.tokens runs inside the rest).
    parts: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.model = self.prompt = self.redact = 0.0
        self.calls = 0
        self.parts = {}


PROBE = Probe()


class TimedModel:
    """A ``ModelClient`` timing the wrapped one's calls into ``PROBE``."""

    def __init__(self, inner: ExtractiveModel) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        """The wrapped model's name."""
        return self.inner.name

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        """The wrapped call, timed."""
        started = time.perf_counter()
        try:
            return self.inner.complete(messages, max_tokens=max_tokens, contract=contract)
        finally:
            PROBE.model += time.perf_counter() - started
            PROBE.calls += 1


def _timed(module: Any, name: str, slot: str) -> None:
    """Replace ``module.name`` by a wrapper adding its time to ``PROBE.<slot>`` (or to a part)."""
    original = getattr(module, name, None)
    if original is None:
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent = time.perf_counter() - started
            if slot in ("prompt", "redact"):
                setattr(PROBE, slot, getattr(PROBE, slot) + spent)
            else:
                PROBE.parts[slot] = PROBE.parts.get(slot, 0.0) + spent

    setattr(module, name, wrapper)


# Counting the task prompt (and head/tail-cutting it if over the call budget): the one place
# a round-level stage tokenises a large fresh string of its own. Redacting secrets from that
# prompt scans all of it too. Both are looked up as module globals at call time.
_timed(model_call_module, "_fit_call_budget", "prompt")
_timed(model_call_module, "redact", "redact")
_timed(snapshot_module, "redact_messages", "redact")
# Where our own time goes, for the breakdown table (module globals, so calls inside go through).
PARTS = ("plan", "build targets", "View.tokens", "task prompt", "parse reply", "apply", "result")
_timed(stages_module, "plan_next_stage", "plan")
_timed(targets_module, "_build_targets", "build targets")
_timed(View, "tokens", "View.tokens")
_timed(model_call_module, "_task_prompt", "task prompt")
_timed(model_call_module, "parse_blocks", "parse reply")
_timed(running_module, "_apply", "apply")
_timed(running_module, "_result", "result")


@dataclass
class Row:
    """One compressor (or stage) on one conversation, over the repeated runs."""

    name: str
    before: int = 0
    after: int = 0
    calls: int = 0
    detail: str = ""
    model_ms: list[float] = field(default_factory=list)
    prompt_ms: list[float] = field(default_factory=list)
    redact_ms: list[float] = field(default_factory=list)
    ours_ms: list[float] = field(default_factory=list)
    parts_ms: dict[str, list[float]] = field(default_factory=dict)
    goal: bool = True


@contextmanager
def measured(row: Row) -> Iterator[None]:
    """Time the block into ``row``: model, prompt count, redaction and our own rest apart."""
    PROBE.reset()
    started = time.perf_counter()
    yield
    total = time.perf_counter() - started
    row.calls = PROBE.calls
    row.model_ms.append(PROBE.model * 1000)
    row.prompt_ms.append(PROBE.prompt * 1000)
    row.redact_ms.append(PROBE.redact * 1000)
    row.ours_ms.append((total - PROBE.model - PROBE.prompt - PROBE.redact) * 1000)
    for part in PARTS:
        row.parts_ms.setdefault(part, []).append(PROBE.parts.get(part, 0.0) * 1000)


# --- the compressors --------------------------------------------------------------------


def round_level_stages(
    system: list[AnyMessage], body: list[AnyMessage], counter: TokenCounter, model: TimedModel, runs: int
) -> list[Row]:
    """Each pipeline stage once, in order, on the view the previous stage left."""
    total = counter.count_messages([*system, *body])
    rows = [Row(kind, goal=kind != "hard_truncate") for kind, _ in CASCADE]
    for _ in range(runs):
        view = View(version=0, system=tuple(system), tail=tuple(body))
        for row, (kind, share) in zip(rows, CASCADE, strict=True):
            config = PipelineConfig(
                target_tokens=max(int(total * share), 1), keep_recent_messages=KEEP_RECENT
            )
            with measured(row):
                row.before = row.after = view.tokens(counter)
                others = [k for k in STAGE_ORDER if k != kind]
                stage = stages_module.plan_next_stage(view, config, counter, exhausted=others)
                if stage is None:
                    row.detail = "nothing to do"
                    continue
                result = stages_module.run_stage(stage, view, model, counter, config=config)
                if result.changed:
                    view = view.with_blocks(result.blocks, result.covered_until, version=view.version + 1)
            row.after = result.tokens_after
            row.detail = result.detail or f"target {config.target_tokens:,}"
    return rows


def window_path(
    name: str,
    config: dict[str, Any],
    system: list[AnyMessage],
    body: list[AnyMessage],
    counter: TokenCounter,
    runs: int,
) -> Row:
    """A compressor's trigger and window hook on a fresh context per run (same counter)."""
    total = counter.count_messages([*system, *body])
    engine = ContextEngine({"context_window_tokens": total})
    row = Row(name)
    for n in range(runs):
        ctx = engine.create_context(
            f"bench-{n}", processors=[(name, config)], history_messages=body, token_counter=counter
        )
        processor = ctx.processors[0][1]
        window = ContextWindow(system_messages=system, context_messages=ctx.get_messages(), tools=[])
        row.before = row.after = counter.count_messages(window.get_messages())
        with measured(row):
            triggered = processor.trigger_get_context_window(ctx, window)
            event, new = processor.on_get_context_window(ctx, window) if triggered else (None, window)
        if not triggered:
            row.detail = "not triggered (no span worth summarising)"
        elif event is None:
            row.detail = "no benefit"
        row.after = counter.count_messages(new.get_messages())
        engine.clear_context(f"bench-{n}")
    return row


# --- output -----------------------------------------------------------------------------


def _fmt(values: list[float]) -> str:
    return f"{values[0]:8.1f}" if values else "       -"


def print_table(title: str, rows: list[Row]) -> None:
    print(f"\n{title}")
    header = (
        f"| {'compressor / stage':<26} | {'tokens before':>13} | {'after':>7} | calls | model ms | "
        f"prompt ms | redact ms | ours ms first | ours ms warm | goal <{GOAL_MS:g} ms | note"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:]) + "|")
    for row in rows:
        warm = row.ours_ms[1:] or row.ours_ms
        ours = statistics.median(warm)
        model = statistics.median(row.model_ms[1:] or row.model_ms)
        verdict = ("ok" if ours < GOAL_MS else "OVER") if row.goal else "(apart)"
        print(
            f"| {row.name:<26} | {row.before:>13,} | {row.after:>7,} | {row.calls:>5} | {model:>8.1f} | "
            f"{row.prompt_ms[0]:>9.1f} | {statistics.median(row.redact_ms):>9.1f} | {row.ours_ms[0]:>13.1f} | {ours:>12.1f} | {verdict:>11} | {row.detail}"
        )


def print_parts(rows: list[Row]) -> None:
    """Warm medians of the parts of our own work, per pipeline stage (inclusive, they nest)."""
    print("\n  our own warm ms by part (inclusive: View.tokens also runs inside the others)")
    print("  | " + " | ".join([f"{'stage':<24}", *(f"{p:>13}" for p in PARTS), f"{'ours':>6}"]) + " |")
    for row in rows:
        if not any(row.parts_ms.get("plan", [])):
            continue
        cells = [f"{statistics.median(row.parts_ms[p][1:] or row.parts_ms[p]):>13.2f}" for p in PARTS]
        ours = statistics.median(row.ours_ms[1:] or row.ours_ms)
        print("  | " + " | ".join([f"{row.name:<24}", *cells, f"{ours:>6.1f}"]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="10 warm runs; 100k and 200k-token conversations")
    parser.add_argument("--runs", type=int, help="warm runs per measurement (default 3, 10 with --long)")
    parser.add_argument("--tokens", type=int, nargs="*", help="conversation sizes (default 100000)")
    parser.add_argument("--files", nargs="*", default=list(FILES), help="data files to use")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding the .jsonl files")
    args = parser.parse_args()
    runs = args.runs or (10 if args.long else 3)
    sizes = args.tokens or ([100_000, 200_000] if args.long else [100_000])
    counter = TiktokenCounter()
    model = TimedModel(ExtractiveModel(counter))
    print(
        f"LLM compressors with ExtractiveModel, TiktokenCounter (cl100k_base); 1 first + {runs} warm runs; "
        f"python {platform.python_version()}, {os.cpu_count()} cores"
    )
    for size in sizes:
        for name in args.files:
            path = args.data / name
            if not path.exists():
                print(f"\n{name}: skipped, not found in {args.data}")
                continue
            system, body = concatenated(path, size, counter)
            total = counter.count_messages([*system, *body])  # also warms the cache: every message counted
            rows = round_level_stages(system, body, counter, model, runs + 1)
            rows.append(
                window_path(
                    "RoundLevelCompressor",
                    {
                        "target_total_tokens": int(total * 0.3),
                        "trigger_total_tokens": int(total * 0.5),
                        "keep_recent_messages": KEEP_RECENT,
                        "model_client": model,
                    },
                    system,
                    body,
                    counter,
                    runs + 1,
                )
            )
            rows[-1].goal = False  # a whole run of several stages: for the record
            # The current round of a concatenation is the last run's tail: a few % of the whole.
            current = {"model_client": model, "min_target_context_ratio": 0.02}
            rows.append(window_path("CurrentRoundCompressor", current, system, body, counter, runs + 1))
            rows.append(
                window_path("DialogueCompressor", {"model_client": model}, system, body, counter, runs + 1)
            )
            print_table(f"{name}: {len(body)} messages, {total:,} tokens", rows)
            print_parts(rows[: len(CASCADE)])
    print(
        "\nmodel ms = inside ExtractiveModel.complete (warm median); prompt ms = counting the task prompt "
        "(first run, not cached); ours = the rest of the stage (plan + run), first run and warm median."
    )


if __name__ == "__main__":
    main()
