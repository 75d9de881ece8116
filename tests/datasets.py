"""Access to the shared real-world conversations in ../shared/data (read-only fixtures)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

DATA_DIR = Path(os.environ.get("CTXCORE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
FILES = ("tau_bench.jsonl", "minisweagent_dev.jsonl", "locomo.jsonl")


def require_data() -> Path:
    """The data folder, or skip the calling test with the reason."""
    if not all((DATA_DIR / f).exists() for f in FILES):
        pytest.skip(f"shared conversation data not found at {DATA_DIR} (set CTXCORE_DATA_DIR)")
    return DATA_DIR


@cache
def _load(name: str) -> tuple[dict[str, Any], ...]:
    with open(DATA_DIR / name, encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def conversations(name: str | None = None, every: int = 1) -> Iterator[dict[str, Any]]:
    """Raw conversation records of one file (or all), every ``every``-th one."""
    require_data()
    for file in [name] if name else list(FILES):
        yield from _load(file)[::every]
