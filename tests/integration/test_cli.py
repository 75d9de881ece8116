"""The ctxcore command line: count, compact, inspect/rollback as a user runs them (the demo:
test_demo.py; conventions and bad input: test_cli_conventions.py)."""

from __future__ import annotations

import io
import json
import sys
import uuid
from pathlib import Path

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.messages import from_openai
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.window import check_window
from tests.datasets import conversations
from workers.cli import main


def run_cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    out = io.StringIO()
    old = sys.stdout
    sys.stdout = out
    try:
        code = main(list(argv)) if env is None else _with_env(env, argv)
    finally:
        sys.stdout = old
    return code, out.getvalue()


def _with_env(env: dict[str, str], argv: tuple[str, ...]) -> int:
    mp = pytest.MonkeyPatch()
    try:
        for k, v in env.items():
            mp.setenv(k, v)
        return main(list(argv))
    finally:
        mp.undo()


def test_count_bundled_sample() -> None:
    code, out = run_cli("count")
    assert code == 0
    assert "sympy__sympy-20590" in out and "total" in out


def test_count_bad_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["count", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_compact_offline_batch(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    with src.open("w") as fh:
        for conv in list(conversations("minisweagent.jsonl"))[:2]:
            fh.write(json.dumps({"id": conv["id"], "messages": conv["messages"]}) + "\n")
    dst = tmp_path / "out.jsonl"
    code, out = run_cli("compact", str(src), "--out", str(dst), "--budget", "8000")
    assert code == 0 and "wrote 2 windows" in out
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["tokens_after"] <= 8000 < row["tokens_before"]
        assert check_window(from_openai(row["messages"])) == []


@pytest.mark.redis
def test_inspect_and_rollback(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    prefix = f"cli{uuid.uuid4().hex[:6]}"
    env = {"CTXCORE_REDIS_URL": f"{base}/9", "CTXCORE_REDIS__KEY_PREFIX": prefix}
    from workers.runtime import Runtime

    rt = Runtime(Settings.load({"redis": {"url": f"{base}/9", "key_prefix": prefix}}))
    key = ConversationKey("acme", "c1")
    assert rt.state_store.save(key, CompressionState(pinned=["000000000001"]), expected_version=0)
    assert rt.state_store.save(key, CompressionState(), expected_version=1)
    code, out = run_cli("inspect", "acme", "c1", "--history", "--json", env=env)
    assert code == 0
    doc = json.loads(out)
    assert doc["state"]["version"] == 2 and [s["version"] for s in doc["history"]] == [2, 1]
    code, out = run_cli("rollback", "acme", "c1", "1", env=env)
    assert code == 0 and "restored as version 3" in out
    state = rt.state_store.load(key)
    assert state is not None and state.version == 3 and state.pinned == ["000000000001"]
    # The rollback is journaled (the same path as POST .../rollback).
    assert rt.journal.entries(key)[0].detail == "version 1 restored as version 3"
    code, out = run_cli("rollback", "acme", "c1", "9", env=env)
    assert code == 2 and out == ""
    assert rt.state_store.load(key).version == 3  # type: ignore[union-attr]  # nothing changed
    code, _ = run_cli("rollback", "acme", "nobody", "1", env=env)
    assert code == 2
    # The overview for people: status first, versions, the journal's rollback entry.
    code, out = run_cli("inspect", "acme", "c1", env=env)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "acme/c1  compaction: idle" and len(lines) <= 40, out
    assert "state version 3 (kept 1..3)" in out and "journal (newest 1 of 1):" in out
    assert "rolled_back" in out and "v3     version 1 resto" in out
    client = redis.Redis.from_url(f"{base}/9")
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
