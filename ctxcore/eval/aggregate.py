"""Pooling a policy's conversation results into its ``overall`` row, and wins vs a baseline."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ctxcore.eval.next_step import reference_figures, spend_figures
from ctxcore.eval.probes import PROBES
from ctxcore.eval.readability import pooled
from ctxcore.eval.results import ConversationResult
from ctxcore.eval.scoring import QATally

__all__ = ["CONTROL_MARGIN", "aggregate", "control_figures", "win_loss"]

# A policy whose control (another conversation's answers) beats truncation's by more than
# this is flagged: its windows match answers by volume of words, not by content.
CONTROL_MARGIN = 0.05
# Probe scores closer than this are a tie (set probes are fractions).
_EPSILON = 1e-9


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def control_figures(policy: QATally, truncate: QATally) -> dict[str, Any]:
    """The control rates beside truncation's, by category, and whether they are flagged."""
    mine, base = policy.rates(), truncate.rates()
    base_cat = truncate.by_category()
    out: dict[str, Any] = {
        "questions": mine["questions"],
        "answer_recall": mine["answer_recall"],
        "substring_hit_rate": mine["substring_hit_rate"],
        "truncate_answer_recall": base["answer_recall"],
        "truncate_substring_hit_rate": base["substring_hit_rate"],
        # Which kinds of answer the window matches by chance (dates, for instance).
        "by_category": {
            name: {
                "answer_recall": figures["answer_recall"],
                "truncate_answer_recall": base_cat.get(name, {}).get("answer_recall"),
                "substring_hit_rate": figures["substring_hit_rate"],
                "truncate_substring_hit_rate": base_cat.get(name, {}).get("substring_hit_rate"),
            }
            for name, figures in policy.by_category().items()
        },
    }
    out["flagged"] = any(
        isinstance(a, float) and isinstance(b, float) and a - b > CONTROL_MARGIN
        for a, b in ((mine[m], base[m]) for m in ("answer_recall", "substring_hit_rate"))
    )
    return out


def _control(pairs: Sequence[tuple[QATally, QATally]]) -> dict[str, Any]:
    return control_figures(QATally.pooled(a for a, _ in pairs), QATally.pooled(b for _, b in pairs))


def win_loss(mine: ConversationResult, base: ConversationResult) -> str:
    """``win``, ``loss`` or ``tie``: more final-window probes above the baseline's, or below."""
    pairs = [
        (score, base.probes_final[name])
        for name, score in mine.probes_final.items()
        if name in base.probes_final
    ]
    beats = sum(score > other + _EPSILON for score, other in pairs)
    trails = sum(score < other - _EPSILON for score, other in pairs)
    return "win" if beats > trails else "loss" if trails > beats else "tie"


def _probes(results: Sequence[ConversationResult]) -> dict[str, dict[str, float | int | None]]:
    out: dict[str, dict[str, float | int | None]] = {}
    for name in PROBES:
        final = [r.probes_final[name] for r in results if name in r.probes_final]
        if not final:
            continue
        windows = [r.probes_windows[name] for r in results if name in r.probes_windows]
        out[name] = {
            "final": round(sum(final) / len(final), 4),
            "windows": round(sum(windows) / len(windows), 4) if windows else None,
            "runs": len(final),
        }
    return out


def _budget_use(results: Sequence[ConversationResult]) -> dict[str, float | int | None]:
    uses = [r.final_tokens / r.budget for r in results]
    over = [r.final_tokens / r.budget for r in results if r.raw_tokens > r.budget]
    return {
        "mean": round(sum(uses) / len(uses), 4) if uses else None,
        "median_over_budget": round(statistics.median(over), 4) if over else None,
        "conversations_over_budget": len(over),
    }


def aggregate(
    results: Sequence[ConversationResult], baseline: Mapping[str, ConversationResult] | None = None
) -> dict[str, Any]:
    """The ``overall`` object of one policy: pooled windows and questions, probes averaged
    over the runs that have them, and wins/losses/ties against ``baseline`` (by id)."""
    windows = sum(r.windows for r in results)
    final = sum(r.final_tokens for r in results)
    raw = sum(r.raw_tokens for r in results)
    reference = any(r.reference for r in results)
    kinds: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    for r in results:
        kinds.update(r.failure_kinds)
        stages.update(r.stages)
    failed = sum(r.failed for r in results)
    stage_failures = sum(r.stage_failures for r in results)
    input_tokens = sum(r.summariser_input_tokens for r in results)
    out: dict[str, Any] = {
        "conversations": len(results),
        "windows": windows,
        "failed": failed,
        "failure_kinds": dict(kinds),
        "stage_failures": stage_failures,
        "failures": failed + stage_failures,
        "violations": sum(r.violations for r in results),
        "anchor_rate": _ratio(sum(r.anchor_windows for r in results), windows),
        "budget_exceeded": kinds.get("budget_exceeded", 0),
        "over_budget_windows": None if reference else sum(r.over_budget_windows for r in results),
        "fallback_windows": sum(r.fallback_windows for r in results),
        "budget_use": _budget_use(results),
        "compression_ratio": round(raw / final, 3) if final else None,
        "peak_window_tokens": max((r.peak_tokens for r in results), default=0),
        "peak_budget_ratio": round(max((r.peak_tokens / r.budget for r in results), default=0.0), 4),
        "summariser_calls": sum(r.summariser_calls for r in results),
        "summariser_input_tokens": input_tokens,
        "summariser_output_tokens": sum(r.summariser_output_tokens for r in results),
        "summariser_input_ratio": _ratio(input_tokens, raw),
        "raw_tokens": raw,
        "stages": dict(stages),
        "elapsed_seconds": round(sum(r.elapsed_seconds for r in results), 2),
    }
    with_qa = [r.qa for r in results if r.qa is not None]
    if with_qa:
        out.update(QATally.pooled(with_qa).rates())
    controls = [(r.control, r.control_truncate) for r in results if r.control and r.control_truncate]
    if controls:
        out["control"] = _control(controls)
    asked = [r.qa_tool for r in results if r.qa_tool is not None]
    if asked:
        rates = QATally.pooled(asked).rates()
        out["asking"] = {
            "questions": rates["compacted_questions"],
            "substring_hit_rate": rates["compacted_substring_hit_rate"],
            "answer_recall": rates["compacted_answer_recall"],
        }
        asked_controls = [
            (r.control_tool, r.control_truncate) for r in results if r.control_tool and r.control_truncate
        ]
        if asked_controls:
            out["asking"]["control"] = _control(asked_controls)
    queries = sorted(ms for r in results for ms in r.recall_query_ms)
    if queries:
        out["recall"] = {
            "windows": sum(r.recall_windows for r in results),
            "passages": sum(r.recall_passages for r in results),
            "tokens": sum(r.recall_tokens for r in results),
            "query_p50_ms": round(statistics.median(queries), 3),
        }
    out["readability"] = pooled(r.readability for r in results)
    if any(r.checkpoints for r in results):
        out["references"] = reference_figures(results, baseline if not reference else None)
    if windows:
        out["spend"] = spend_figures(results, baseline if not reference else None)
    probes = _probes(results)
    if probes:
        out["probes"] = probes
        out["malformed_calls"] = sum(r.malformed_calls for r in results)
    if baseline is not None and not reference:
        tally_wl: Counter[str] = Counter(win_loss(r, baseline[r.id]) for r in results if r.id in baseline)
        out["vs_baseline"] = {k: tally_wl.get(k, 0) for k in ("win", "loss", "tie")}
    return out
