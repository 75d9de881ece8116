"""The conversations the tests read: all in the repository (``tests/data``, ``ctxcore/samples``).

``require_data(name)`` checks only the file it is asked for; a file missing from the
repository fails the calling test (it is a broken checkout, never a reason to skip).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLES = Path(__file__).resolve().parents[1] / "ctxcore" / "samples" / "agent_runs.jsonl"
PATHS = {
    "agent_runs.jsonl": SAMPLES,  # 3 tau-bench + 3 mini-swe-agent runs, bundled with the package
    "tau_bench.jsonl": DATA_DIR / "tau_bench.jsonl",
    "minisweagent.jsonl": DATA_DIR / "minisweagent.jsonl",
    "dialogue_qa.jsonl": DATA_DIR / "dialogue_qa.jsonl",
}
FILES = tuple(PATHS)


def require_data(name: str) -> Path:
    """The path of one data file; fails the calling test when it is missing."""
    path = PATHS.get(name)
    if path is None:
        raise KeyError(f"unknown test data file {name!r}; known: {', '.join(FILES)}")
    if not path.exists():
        pytest.fail(f"test data {path} is missing from the repository", pytrace=False)
    return path


@cache
def _load(name: str) -> tuple[dict[str, Any], ...]:
    with require_data(name).open(encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def conversations(name: str | None = None, every: int = 1) -> Iterator[dict[str, Any]]:
    """Raw conversation records of one file (or of all), every ``every``-th one."""
    for file in [name] if name else list(FILES):
        yield from _load(file)[::every]


def swe_runs() -> Iterator[dict[str, Any]]:
    """Every mini-swe-agent run: the three bundled with the package, then the slice."""
    for record in _load("agent_runs.jsonl"):
        if str(record.get("source", "")).startswith("mini-swe-agent"):
            yield record
    yield from _load("minisweagent.jsonl")
