"""Human-readable output of an evaluation report: a text table and an optional PNG plot.

matplotlib is a bench-only dependency, imported only when a plot is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxcore.errors import CtxcoreError

__all__ = ["format_report", "format_row", "plot_report", "summary_columns"]


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def summary_columns(overall: Mapping[str, Any]) -> dict[str, str]:
    """The headline figures of an ``overall`` object as column -> text."""
    cols = {
        "windows": _fmt(overall.get("windows")),
        "violations": _fmt(overall.get("violations")),
        "anchor_rate": _fmt(overall.get("anchor_rate")),
        "over_budget": _fmt(overall.get("over_budget_windows")),
        "peak/budget": _fmt(overall.get("peak_budget_ratio")),
        "compression": _fmt(overall.get("compression_ratio"), 2),
    }
    if "questions" in overall:
        control = overall.get("control") or {}
        cols.update(
            {
                "hit": _fmt(overall.get("substring_hit_rate")),
                "recall": _fmt(overall.get("answer_recall")),
                "compacted_q": _fmt(overall.get("compacted_questions")),
                "c_hit": _fmt(overall.get("compacted_substring_hit_rate")),
                "c_recall": _fmt(overall.get("compacted_answer_recall")),
                "ctrl_hit": _fmt(control.get("substring_hit_rate")),
                "ctrl_recall": _fmt(control.get("answer_recall")),
                "ctrl_flag": "FLAGGED" if control.get("flagged") else "ok",
            }
        )
    needles = overall.get("needle_retention")
    if needles:
        cols.update(
            {
                "task": _fmt(needles.get("task_anchor")),
                "paths": _fmt(needles.get("edited_paths")),
                "error": _fmt(needles.get("last_error")),
                "final": _fmt(needles.get("final_result")),
            }
        )
    cols["calls"] = _fmt(overall.get("summariser_calls"))
    cols["sent_tokens"] = _fmt(overall.get("summariser_input_tokens"))
    cols["seconds"] = _fmt(overall.get("elapsed_seconds"), 1)
    return cols


def format_row(rows: Sequence[Mapping[str, str]]) -> str:
    """A markdown table of rows sharing the same columns (the first row's)."""
    if not rows:
        return ""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |"]
    lines.append("|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|")
    for row in rows:
        lines.append("| " + " | ".join(row.get(c, "").ljust(widths[c]) for c in columns) + " |")
    return "\n".join(lines)


def format_report(report: Mapping[str, Any], *, per_conversation: bool = True) -> str:
    """The report as text: one row per conversation, then the overall row."""
    rows: list[dict[str, str]] = []
    if per_conversation:
        for conv in report.get("conversations", []):
            flat = dict(conv)
            if "qa" in conv:
                flat.update(conv["qa"])
                flat["control"] = conv.get("control")
            if "needles" in conv:
                flat["needle_retention"] = {
                    "task_anchor": conv["needles"]["task_anchor"],
                    "edited_paths": conv["needles"]["edited_paths"],
                    "last_error": conv["needles"]["last_error"],
                    "final_result": conv["needles"]["final_result"],
                }
            flat["windows"] = conv["windows"]
            flat["over_budget_windows"] = conv["over_budget_windows"]
            rows.append(
                {"conversation": str(conv["id"]), "budget": str(conv["budget"]), **summary_columns(flat)}
            )
    budget = report.get("budget") or f"x{report.get('budget_ratio')}"
    rows.append({"conversation": "OVERALL", "budget": str(budget), **summary_columns(report["overall"])})
    head = (
        f"policy {report['policy']} on {report['file']} ({report['overall']['conversations']} conversations)"
    )
    return head + "\n" + format_row(rows) + "\n"


def plot_report(report: Mapping[str, Any], path: str | Path) -> None:
    """Window tokens / budget over each replay, and the headline rates, as one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # a bench-only dependency
        raise CtxcoreError("plotting needs matplotlib: pip install matplotlib") from exc
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for conv in report.get("conversations", []):
        series = conv.get("window_tokens") or []
        if not series:
            continue
        total = max(conv["messages"], 1)
        left.plot(
            [p[0] / total for p in series], [p[1] / conv["budget"] for p in series], lw=0.8, label=conv["id"]
        )
    left.axhline(1.0, color="k", ls="--", lw=1)
    left.set_xlabel("share of the conversation replayed")
    left.set_ylabel("window tokens / budget")
    left.set_title(f"{report['policy']}: served windows")
    if len(report.get("conversations", [])) <= 12:
        left.legend(fontsize=6)
    overall = report["overall"]
    rates: dict[str, float] = {}
    for key in ("anchor_rate", "substring_hit_rate", "answer_recall", "compacted_answer_recall"):
        if isinstance(overall.get(key), float | int):
            rates[key] = float(overall[key])
    for key, value in (overall.get("needle_retention") or {}).items():
        if isinstance(value, float | int) and key not in ("runs",):
            rates[f"needle:{key}"] = float(value)
    right.barh(list(rates), list(rates.values()), color="tab:blue")
    right.set_xlim(0, 1)
    right.set_title("rates (final window)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
