"""Human-readable output of an evaluation report: text tables and an optional PNG plot.

matplotlib is an optional dependency (the ``plot`` extra), imported only when a plot is
asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ctxcore.errors import UsageError
from ctxcore.eval.probes import PROBES

__all__ = [
    "format_report",
    "format_row",
    "plot_report",
    "policy_reports",
    "reference_columns",
    "spend_columns",
    "summary_columns",
]

PROBE_COLUMNS = {
    "edited_files": "edited",
    "viewed_files": "viewed",
    "first_exception": "first_exc",
    "last_exception": "last_exc",
    "last_failing_test": "fail_test",
    "newest_head": "newest",
    "last_commands": "commands",
}


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def policy_reports(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The per-policy reports of a report (one policy or several)."""
    return list(report["reports"]) if "reports" in report else [report]


def _qa_columns(overall: Mapping[str, Any]) -> dict[str, str]:
    control = overall.get("control")
    return {
        "hit": _fmt(overall.get("substring_hit_rate")),
        "recall": _fmt(overall.get("answer_recall")),
        "compacted_q": _fmt(overall.get("compacted_questions")),
        "c_hit": _fmt(overall.get("compacted_substring_hit_rate")),
        "c_recall": _fmt(overall.get("compacted_answer_recall")),
        **(_control_columns(control, "ctrl") if control else {}),
    }


def _control_columns(control: Mapping[str, Any], prefix: str) -> dict[str, str]:
    return {
        f"{prefix}_hit": _fmt(control.get("substring_hit_rate")),
        f"{prefix}_recall": _fmt(control.get("answer_recall")),
        f"{prefix}_flag": "FLAGGED" if control.get("flagged") else "ok",
    }


def _probe_columns(probes: Mapping[str, Any], *, windows: bool) -> dict[str, str]:
    cols: dict[str, str] = {}
    for name in PROBES:
        figures = probes.get(name)
        if figures is None:
            cols[PROBE_COLUMNS[name]] = "-"
        elif windows:
            cols[PROBE_COLUMNS[name]] = f"{_fmt(figures.get('final'), 2)}/{_fmt(figures.get('windows'), 2)}"
        else:
            cols[PROBE_COLUMNS[name]] = _fmt(figures.get("final"), 2)
    return cols


def _readability_columns(figures: Mapping[str, Any]) -> dict[str, str]:
    # Summary lines of the final windows' blocks: how many, the share tagged with their
    # source, lines repeated within a block, lines cut inside a word.
    if not figures.get("summary_lines"):
        return {}
    return {
        "sum_lines": _fmt(figures.get("summary_lines")),
        "tagged": _fmt(figures.get("tagged_share"), 2),
        "dup_lines": _fmt(figures.get("duplicate_lines")),
        "cuts": _fmt(figures.get("midword_cuts")),
    }


def summary_columns(overall: Mapping[str, Any]) -> dict[str, str]:
    """The headline figures of an ``overall`` object as column -> text (probes as final/windows)."""
    use = overall.get("budget_use") or {}
    cols = {
        "windows": _fmt(overall.get("windows")),
        "failed": _fmt(overall.get("failed")),
        "violations": _fmt(overall.get("violations")),
        "anchor_rate": _fmt(overall.get("anchor_rate")),
        "over_budget": _fmt(overall.get("over_budget_windows")),
        "use_mean": _fmt(use.get("mean"), 2),
        "use_median": _fmt(use.get("median_over_budget"), 2),
        "compression": _fmt(overall.get("compression_ratio"), 2),
    }
    if "questions" in overall:
        cols.update(_qa_columns(overall))
    if overall.get("probes"):
        cols.update(_probe_columns(overall["probes"], windows=True))
    cols.update(_readability_columns(overall.get("readability") or {}))
    recall = overall.get("recall")
    if recall:
        cols.update(
            recall_w=_fmt(recall.get("windows")),
            passages=_fmt(recall.get("passages")),
            recall_tok=_fmt(recall.get("tokens")),
            q_p50_ms=_fmt(recall.get("query_p50_ms"), 2),
        )
    asking = overall.get("asking")
    if asking:
        # The fixed set on the final window plus one recall call with the question.
        cols.update(
            ask_hit=_fmt(asking.get("substring_hit_rate")), ask_recall=_fmt(asking.get("answer_recall"))
        )
        if asking.get("control"):
            cols.update(_control_columns(asking["control"], "ask_ctrl"))
    wl = overall.get("vs_baseline")
    return cols | {
        "W/L/T": f"{wl['win']}/{wl['loss']}/{wl['tie']}" if wl else "-",
        "calls": _fmt(overall.get("summariser_calls")),
        "sent/raw": _fmt(overall.get("summariser_input_ratio"), 2),
        "seconds": _fmt(overall.get("elapsed_seconds"), 1),
    }


def reference_columns(overall: Mapping[str, Any]) -> dict[str, str] | None:
    """The next-step reference figures of an ``overall`` object (None when it has none)."""
    refs = overall.get("references")
    if not refs:
        return None
    kinds = refs.get("by_kind") or {}
    fill = refs.get("fill") or {}
    cols = {
        "overall": _fmt(refs.get("overall")),
        "recent": _fmt(refs.get("recent")),
        "stale": _fmt(refs.get("stale")),
        **{kind: _fmt(kinds.get(kind)) for kind in kinds},
        "refs": _fmt(refs.get("references")),
        "checkpoints": f"{refs.get('checkpoints')} ({refs.get('checkpoints_without_reference')} none)",
        "fill": _fmt(fill.get("mean"), 2),
        "fill_over": _fmt(fill.get("median_over_budget"), 2),
    }
    for key, label in (("vs_baseline", "W/L (p)"), ("vs_matched_fill", "W/L fill (p)")):
        wl = refs.get(key)
        cols[label] = f"{wl['win']}/{wl['loss']} ({_fmt(wl['sign_test_p'], 2)})" if wl else "-"
    return cols


def spend_columns(overall: Mapping[str, Any]) -> dict[str, str] | None:
    """Budget parts (mean share of the budget), prompt-cache share and run cost."""
    spend = overall.get("spend")
    if not spend:
        return None
    return {
        **{part: _fmt(share, 2) for part, share in (spend.get("parts") or {}).items()},
        "cache": _fmt(spend.get("cache_share"), 2),
        "cost": _fmt(spend.get("run_cost")),
        "cost/base": _fmt(spend.get("cost_vs_baseline"), 2),
    }


def _conversation_columns(conv: Mapping[str, Any]) -> dict[str, str]:
    cols = {
        "conversation": str(conv["id"]),
        "budget": str(conv["budget"]),
        "windows": _fmt(conv.get("windows")),
        "failed": _fmt(conv.get("failed")),
        "violations": _fmt(conv.get("violations")),
        "anchor_rate": _fmt(conv.get("anchor_rate")),
        "over_budget": _fmt(conv.get("over_budget_windows")),
        "use": _fmt(conv.get("budget_use"), 2),
        "compression": _fmt(conv.get("compression_ratio"), 2),
    }
    if "qa" in conv:
        cols.update(_qa_columns(conv["qa"]))
    if conv.get("probes"):
        cols.update(_probe_columns(conv["probes"], windows=False))
    cols["calls"] = _fmt(conv.get("summariser_calls"))
    return cols


def format_row(rows: Sequence[Mapping[str, str]]) -> str:
    """A markdown table of rows, with the union of their columns in first-seen order."""
    if not rows:
        return ""
    columns = list(dict.fromkeys(c for r in rows for c in r))
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    lines = [
        "| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |",
        "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|",
        *("| " + " | ".join(row.get(c, "").ljust(widths[c]) for c in columns) + " |" for row in rows),
    ]
    return "\n".join(lines)


def _failure_rows(reports: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for rep in reports:
        for conv in rep.get("conversations", []):
            for kind, count in (conv.get("failure_row") or {}).items():
                first = next((f for f in conv.get("failures", []) if f": {kind}: " in f), "")
                rows.append(
                    {
                        "conversation": str(conv["id"]),
                        "policy": str(rep["policy"]),
                        "kind": kind,
                        "count": str(count),
                        "first": first[:160],
                    }
                )
    return rows


def format_report(report: Mapping[str, Any], *, per_conversation: bool = True) -> str:
    """The report as text: per policy one row per conversation (unless ``per_conversation``
    is off), then one row per policy side by side, then the failure rows."""
    reports = policy_reports(report)
    budget = report.get("budget") or f"x{report.get('budget_ratio')}"
    conversations = reports[0]["overall"]["conversations"] if reports else 0
    out: list[str] = []
    if per_conversation:
        for rep in reports:
            rows = [_conversation_columns(c) for c in rep.get("conversations", [])]
            out.append(f"policy {rep['policy']}, per conversation\n{format_row(rows)}\n")
    baseline = report.get("baseline")
    head = f"{report['file']}: {conversations} conversations, budget {budget}"
    if baseline:
        head += f", baseline {baseline} (W/L/T: conversations where more probes beat / trail it)"
    rows = [{"policy": str(rep["policy"]), **summary_columns(rep["overall"])} for rep in reports]
    out.append(f"{head}\n{format_row(rows)}\n")
    refs = [(rep["policy"], reference_columns(rep["overall"])) for rep in reports]
    for rep in reports:
        matched = (rep["overall"].get("references") or {}).get("matched_fill")
        if matched:
            refs.append((f"steps at {rep['policy']}'s fill", reference_columns({"references": matched})))
    ref_rows = [{"policy": str(name), **cols} for name, cols in refs if cols]
    spend_rows = [
        {"policy": str(rep["policy"]), **cols} for rep in reports if (cols := spend_columns(rep["overall"]))
    ]
    # Each section only when it has rows.
    sections = (
        (
            "next-step references held (share; W/L: runs whose share beats / trails the baseline's, "
            "sign test p)",
            ref_rows,
        ),
        (
            "where the budget goes (mean share over windows whose run exceeds the budget by a step), "
            "prompt-cache share, run cost (cached input x0.1, summariser output x4)",
            spend_rows,
        ),
        ("failure rows (windows that raised)", _failure_rows(reports)),
    )
    out += [f"{title}\n{format_row(rows)}\n" for title, rows in sections if rows]
    return "\n".join(out)


def plot_report(report: Mapping[str, Any], path: str | Path) -> None:
    """Window tokens / budget over each replay (first policy), and each policy's headline
    rates, as one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError("plotting needs matplotlib: pip install 'ctxcore[plot]'") from exc
    reports = policy_reports(report)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    first = reports[0]
    for conv in first.get("conversations", []):
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
    left.set_title(f"{first['policy']}: served windows")
    if len(first.get("conversations", [])) <= 12:
        left.legend(fontsize=6)
    width = 0.8 / max(len(reports), 1)
    labels: list[str] = []
    for n, rep in enumerate(reports):
        overall = rep["overall"]
        rates = {
            **{
                key: float(overall[key])
                for key in ("anchor_rate", "substring_hit_rate", "answer_recall", "compacted_answer_recall")
                if isinstance(overall.get(key), float | int)
            },
            **{PROBE_COLUMNS.get(k, k): float(f["final"]) for k, f in (overall.get("probes") or {}).items()},
        }
        labels = labels or list(rates)
        right.barh(
            [i + n * width for i in range(len(labels))],
            [rates.get(k, 0.0) for k in labels],
            height=width,
            label=rep["policy"],
        )
    right.set_yticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
    right.set_xlim(0, 1)
    right.set_title("rates (final window)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
