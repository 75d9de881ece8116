"""CI-sized ``ctxcore eval`` on the test data: the ``full`` policy on 3 conversations per file.

Figures are the benchmarks' business (bench/retention.py, on LoCoMo); here only the
guarantees and one comparison that must hold: ``full`` keeps more of a dated chat's
compacted answers than keep-newest truncation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.datasets import require_data
from workers.cli import main

pytestmark = pytest.mark.slow


def run_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    out = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    assert main(["eval", *args, "--json", str(out)]) == 0
    capsys.readouterr()
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.parametrize(
    ("name", "budget"),
    [
        ("tau_bench.jsonl", ["--budget", "3000"]),
        ("minisweagent.jsonl", ["--budget", "16000"]),
        ("dialogue_qa.jsonl", ["--budget-ratio", "0.25"]),
    ],
)
def test_full_policy_on_three_conversations(
    name: str, budget: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_eval(tmp_path, capsys, str(require_data(name)), "--policy", "full", "--limit", "3", *budget)
    assert report["baseline"] == "steps"
    for rep in report["reports"]:
        overall = rep["overall"]
        assert overall["conversations"] == 3
        assert overall["violations"] == 0
        assert overall["anchor_rate"] == 1.0
        # A failure (a window that raised, a stage that failed) is never a quietly worse window.
        assert overall["failures"] == 0 and overall["failed"] == 0, overall["failure_kinds"]
        assert overall["budget_exceeded"] == 0 and overall["over_budget_windows"] == 0
        assert overall["windows"] >= 3 * 5
    full = report["reports"][0]["overall"]
    if name != "tau_bench.jsonl":  # these budgets force compaction: the summariser ran
        assert full["summariser_calls"] > 0
    if name == "minisweagent.jsonl":
        assert full["probes"]["newest_head"]["runs"] == 3


def test_full_beats_truncation_on_compacted_answers_of_a_dated_chat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(require_data("dialogue_qa.jsonl"))
    recall = {}
    for policy in ("truncate", "full"):
        report = run_eval(
            tmp_path,
            capsys,
            path,
            "--policy",
            policy,
            "--baseline",
            "none",
            "--ids",
            "chat-1",
            "--budget-ratio",
            "0.25",
        )
        assert [c["id"] for c in report["conversations"]] == ["chat-1"]
        recall[policy] = report["overall"]["compacted_answer_recall"]
    assert recall["full"] > recall["truncate"]
