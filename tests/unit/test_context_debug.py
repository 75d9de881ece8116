"""``enable_context_debug`` / ``context_debug_dir``: the compressors write their dumps (spec
5.3) and JSONL debug records (spec 5.4) there, as the reference's rail has them do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxcore import from_openai
from ctxcore.engine import ContextEngine, ContextEngineConfig
from ctxcore.engine.config import DEFAULT_DEBUG_DIR
from ctxcore.messages import AnyMessage, SystemMessage
from ctxcore.summarize.extractive import ExtractiveModel
from tests.datasets import conversations
from tests.pipeline_helpers import FailingModel


def _swe_run() -> list[AnyMessage]:
    messages = from_openai(next(conversations("minisweagent.jsonl"))["messages"])
    return [m for m in messages if not isinstance(m, SystemMessage)]


def _compress(directory: Path, model: Any, *, enabled: bool = True) -> str:
    config = ContextEngineConfig(
        context_window_tokens=8000,
        enable_context_debug=enabled,
        context_debug_dir=str(directory / "{session_id}"),
    )
    ctx = ContextEngine(config).create_context(
        "c1",
        session_id="s1",
        processors=[("CurrentRoundCompressor", {"model_client": model})],
        history_messages=_swe_run(),
    )
    return str(ctx.compress_context())


def test_a_compression_writes_its_dump_under_the_debug_dir(tmp_path: Path) -> None:
    assert _compress(tmp_path, ExtractiveModel()) == "compressed"
    dumps = list((tmp_path / "s1").glob("*.json"))
    assert len(dumps) == 1 and "CurrentRoundCompressor" in dumps[0].name
    record = json.loads(dumps[0].read_text(encoding="utf-8"))
    assert record["processor_type"] == "CurrentRoundCompressor"
    assert (record["session_id"], record["context_id"]) == ("s1", "c1")
    assert 0 < record["benefit"]["tokens_after"] < record["benefit"]["tokens_before"]
    assert record["compression_response"]["extracted_summary"]


def test_a_failed_call_writes_a_debug_record(tmp_path: Path) -> None:
    assert _compress(tmp_path, FailingModel("authentication")) == "noop"
    records = _records(tmp_path / "s1" / "CurrentRoundCompressor.jsonl")
    assert [r["event"] for r in records] == ["span_built", "compression_retry"]
    span, retry = records
    assert span["messages_to_compress"] > 0
    assert span["preserved_prefix"] >= 0
    assert all(t.keys() == {"idx", "role", "tokens", "preview"} for t in span["protected_tail"])
    assert retry["processor"] == "CurrentRoundCompressor"
    assert (retry["error_type"], retry["retried"], retry["reason"]) == (
        "authentication",
        False,
        "not_retryable",
    )
    assert (retry["session_id"], retry["context_id"]) == ("s1", "c1")


def test_each_trigger_decision_is_a_threshold_check_record(tmp_path: Path) -> None:
    config = ContextEngineConfig(
        context_window_tokens=8000, enable_context_debug=True, context_debug_dir=str(tmp_path)
    )
    ctx = ContextEngine(config).create_context(
        "c1", processors=[("CurrentRoundCompressor", {"model_client": ExtractiveModel()})]
    )
    ctx.add_messages(_swe_run()[:2])
    ctx.get_context_window()  # far below the trigger
    ctx.add_messages(_swe_run()[2:])
    ctx.get_context_window()  # over it: compressed
    checks = [
        r for r in _records(tmp_path / "CurrentRoundCompressor.jsonl") if r["event"] == "threshold_check"
    ]
    assert [(c["hit"], c["reason"]) for c in checks][:2] == [
        (False, "below_threshold"),
        (True, "reached_threshold"),
    ]
    assert checks[1]["total_tokens"] >= checks[1]["threshold"] == int(8000 * 0.8)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_off_writes_nothing_and_on_without_a_dir_uses_the_reference_default(tmp_path: Path) -> None:
    assert _compress(tmp_path, ExtractiveModel(), enabled=False) == "compressed"
    assert not tmp_path.joinpath("s1").exists()
    ctx = ContextEngine({"enable_context_debug": True}).create_context("c")
    assert ctx.debug_dir == DEFAULT_DEBUG_DIR == "context/context_debug"
    assert ContextEngine().create_context("c").debug_dir is None


def test_a_compressors_own_dump_settings_win(tmp_path: Path) -> None:
    ctx = ContextEngine(
        ContextEngineConfig(
            context_window_tokens=8000, enable_context_debug=True, context_debug_dir=str(tmp_path / "engine")
        )
    ).create_context(
        "c1",
        processors=[
            (
                "CurrentRoundCompressor",
                {
                    "model_client": ExtractiveModel(),
                    "enable_compression_dump": True,
                    "compression_dump_dir": str(tmp_path / "own"),
                },
            )
        ],
        history_messages=_swe_run(),
    )
    assert ctx.compress_context() == "compressed"
    assert len(list((tmp_path / "own").glob("*.json"))) == 1 and not (tmp_path / "engine").exists()
