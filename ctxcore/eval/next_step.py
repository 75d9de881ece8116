"""A policy's next-step figures pooled over its runs: references held, budget spent, cache reused.

* ``references``: the share of the checkpoints' references its windows hold, overall,
  recent, stale and by kind (every reference of every checkpoint counts once; a checkpoint
  with none adds nothing and is counted as such); per run the same share, won or lost
  against the baseline's, with a two-sided sign test; the fill of the checkpoints' windows.
* ``spend``: the mean share of the budget each part of the windows takes
  (``accounting.PARTS``) over the windows that had to leave something out, the share of input tokens a prefix cache serves, and the run's cost
  in input-token units: window input with cached tokens at ``CACHED_PRICE``, the
  summariser's input at 1 and its output at ``OUTPUT_PRICE``; beside the baseline's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ctxcore.eval.accounting import PARTS
from ctxcore.eval.references import KINDS, sign_test
from ctxcore.eval.results import CheckpointScore, ConversationResult

__all__ = ["CACHED_PRICE", "OUTPUT_PRICE", "reference_figures", "run_cost", "run_score", "spend_figures"]

CACHED_PRICE = 0.1
OUTPUT_PRICE = 4.0
_EPSILON = 1e-9


def _share(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def _pooled(scores: Sequence[CheckpointScore]) -> dict[str, Any]:
    tallies: dict[str, list[int]] = {"overall": [0, 0], "recent": [0, 0], "stale": [0, 0]}
    tallies.update({kind: [0, 0] for kind in KINDS})
    for score in scores:
        at = score.checkpoint.index
        for ref, hit in zip(score.checkpoint.references, score.hits, strict=True):
            groups = ["overall", ref.kind]
            if ref.recent(at):
                groups.append("recent")
            if ref.stale(at):
                groups.append("stale")
            for group in groups:
                tallies[group][0] += int(hit)
                tallies[group][1] += 1
    out: dict[str, Any] = {
        name: _share(h, n) for name, (h, n) in tallies.items() if name in ("overall", "recent", "stale")
    }
    out["by_kind"] = {kind: _share(*tallies[kind]) for kind in KINDS}
    out["references"] = tallies["overall"][1]
    out["stale_references"] = tallies["stale"][1]
    return out


def run_score(result: ConversationResult) -> float | None:
    """The share of a run's references its checkpoint windows hold (None: it has none)."""
    hits = sum(sum(c.hits) for c in result.checkpoints)
    total = sum(len(c.hits) for c in result.checkpoints)
    return hits / total if total else None


def _fill(scores: Sequence[CheckpointScore]) -> dict[str, Any]:
    fills = [s.tokens / s.budget for s in scores if s.tokens is not None]
    # Windows that had to leave something out: the run so far is over the budget by at
    # least its newest step.
    pressed = [s.tokens / s.budget for s in scores if s.tokens is not None and s.pressed]
    return {
        "mean": round(statistics.fmean(fills), 4) if fills else None,
        "median_over_budget": round(statistics.median(pressed), 4) if pressed else None,
        "checkpoints_over_budget": len(pressed),
    }


def reference_figures(
    results: Sequence[ConversationResult], baseline: Mapping[str, ConversationResult] | None
) -> dict[str, Any]:
    """The ``references`` object of one policy (see the module docstring)."""
    scores = [s for r in results for s in r.checkpoints]
    out = _pooled(scores)
    out["checkpoints"] = len(scores)
    out["checkpoints_without_reference"] = sum(1 for s in scores if not s.checkpoint.references)
    out["fill"] = _fill(scores)
    if baseline is not None:
        wins = losses = ties = 0
        for r in results:
            other = baseline.get(r.id)
            mine, theirs = run_score(r), run_score(other) if other is not None else None
            if mine is None or theirs is None:
                continue
            if mine > theirs + _EPSILON:
                wins += 1
            elif mine < theirs - _EPSILON:
                losses += 1
            else:
                ties += 1
        out["vs_baseline"] = {
            "win": wins,
            "loss": losses,
            "tie": ties,
            "sign_test_p": sign_test(wins, losses),
        }
    return out


def run_cost(result: ConversationResult) -> float:
    """The run's cost in input-token units (see the module docstring)."""
    uncached = result.input_tokens - result.cached_tokens
    return (
        uncached
        + CACHED_PRICE * result.cached_tokens
        + result.summariser_input_tokens
        + OUTPUT_PRICE * result.summariser_output_tokens
    )


def spend_figures(
    results: Sequence[ConversationResult], baseline: Mapping[str, ConversationResult] | None
) -> dict[str, Any]:
    """The ``spend`` object of one policy (see the module docstring)."""
    room = sum(r.pressed_windows * r.budget for r in results)
    parts = {part: _share(sum(r.parts[part] for r in results), room) for part in PARTS}
    input_tokens = sum(r.input_tokens for r in results)
    out: dict[str, Any] = {
        "parts": parts,
        "cache_share": _share(sum(r.cached_tokens for r in results), input_tokens),
        "window_input_tokens": input_tokens,
        "run_cost": round(sum(run_cost(r) for r in results)),
    }
    if baseline is not None:
        paired = [(r, baseline[r.id]) for r in results if r.id in baseline]
        theirs = sum(run_cost(b) for _, b in paired)
        out["cost_vs_baseline"] = round(sum(run_cost(r) for r, _ in paired) / theirs, 4) if theirs else None
    return out
