"""CompressionExecutor: the retry policy of spec 5.2 with a scripted in-process client.

The same policy is exercised over a real socket in tests/integration/test_openai_server.py.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from ctxcore.errors import ModelError
from ctxcore.messages import AnyMessage, AssistantMessage, UserMessage
from ctxcore.summarize import (
    Completion,
    CompressionExecutor,
    ModelCallError,
    OutputContract,
    Usage,
)
from ctxcore.summarize.dump import CompressionDump, DebugLog, benefit, safe_name
from ctxcore.tokens import EstimateCounter

Outcome = str | BaseException


class ScriptedClient:
    """Answers from a script: a string is a completion, an exception is raised."""

    def __init__(self, *outcomes: Outcome, usage: Usage | None = None) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[list[AnyMessage], OutputContract | None]] = []
        self.usage = usage

    @property
    def name(self) -> str:
        return "scripted"

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.calls.append((list(messages), contract))
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        return Completion(outcome, self.usage or Usage(100, 10, 110, model="scripted"))


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


PROMPT = [UserMessage(content="summarise this please")]


def executor(client: ScriptedClient, **kwargs: object) -> tuple[CompressionExecutor, Sleeps]:
    sleeps = Sleeps()
    return CompressionExecutor(client, EstimateCounter(), sleep=sleeps, **kwargs), sleeps  # type: ignore[arg-type]


def test_success_first_time() -> None:
    client = ScriptedClient("summary")
    ex, sleeps = executor(client)
    result = ex.execute(PROMPT, max_tokens=100)
    assert result.text == "summary"
    assert result.usage == Usage(100, 10, 110, calls=1, model="scripted")
    assert ex.calls == 1 and sleeps == []
    assert ex.last_call is not None and ex.last_call.attempts == 1


@pytest.mark.parametrize("kind", ["rate_limit", "timeout", "server_unstable", "unknown"])
def test_transient_kinds_retry_twice_with_backoff_then_give_up(kind: str) -> None:
    client = ScriptedClient(*(ModelCallError(kind, "boom") for _ in range(5)))
    ex, sleeps = executor(client)
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=100)
    assert info.value.kind == kind and info.value.attempts == 3
    assert len(client.calls) == 3 and ex.calls == 3
    assert sleeps == [0.05, 0.1]
    # Failed calls count as calls without tokens.
    assert ex.usage.calls == 3 and ex.usage.total_tokens == 0


def test_transient_then_success_reports_all_attempts() -> None:
    client = ScriptedClient(ModelCallError("server_unstable", "502"), "done")
    ex, sleeps = executor(client)
    result = ex.execute(PROMPT, max_tokens=100)
    assert result.text == "done" and result.usage.calls == 2
    assert sleeps == [0.05]
    # The request is retried unchanged.
    assert client.calls[0][0] == client.calls[1][0]


def test_retry_after_is_honoured_when_larger_and_capped() -> None:
    client = ScriptedClient(
        ModelCallError("rate_limit", "slow", 429, retry_after=2.0),
        ModelCallError("rate_limit", "slow", 429, retry_after=0.01),
        ModelCallError("rate_limit", "slow", 429, retry_after=3600.0),
        "ok",
    )
    ex, sleeps = executor(client, transient_retries=3, max_retry_after=30.0)
    ex.execute(PROMPT, max_tokens=10)
    # 2.0 beats 0.05; 0.01 loses to 0.1; 3600 is capped; backoff doubles past its table.
    assert sleeps == [2.0, 0.1, 30.0]
    assert ex.backoff_delay(4) == pytest.approx(0.4)


@pytest.mark.parametrize("kind", ["authentication", "api_request_error"])
def test_permanent_kinds_give_up_at_once(kind: str) -> None:
    client = ScriptedClient(ModelCallError(kind, "no"), "never")
    ex, sleeps = executor(client)
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10)
    assert info.value.kind == kind and info.value.attempts == 1
    assert len(client.calls) == 1 and sleeps == []


def test_overflow_shrinks_with_each_ratio_in_order() -> None:
    client = ScriptedClient(*(ModelCallError("context_overflow", "too long") for _ in range(5)))
    ex, sleeps = executor(client)
    ratios: list[float] = []

    def shrink(ratio: float) -> tuple[list[AnyMessage], OutputContract | None]:
        ratios.append(ratio)
        return [UserMessage(content=f"shorter {ratio}")], None

    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10, shrink=shrink)
    assert ratios == [0.85, 0.65, 0.5]
    assert info.value.kind == "context_overflow" and info.value.attempts == 4
    assert [c[0][0].text for c in client.calls] == [
        "summarise this please",
        "shorter 0.85",
        "shorter 0.65",
        "shorter 0.5",
    ]
    assert sleeps == []


def test_overflow_then_success_uses_the_shrunk_request() -> None:
    contract = OutputContract(kind="state_snapshot", sections=["A"], target_tokens=10)
    smaller = OutputContract(kind="state_snapshot", sections=["A"], target_tokens=5)
    client = ScriptedClient(ModelCallError("context_overflow", "too long"), "fits")
    ex, _ = executor(client)
    result = ex.execute(PROMPT, max_tokens=10, contract=contract, shrink=lambda r: ([PROMPT[0]], smaller))
    assert result.text == "fits"
    assert client.calls[1][1] == smaller
    assert ex.last_call is not None and ex.last_call.budget_ratio == 0.85


def test_overflow_without_shrink_or_when_shrink_cannot_gives_up() -> None:
    client = ScriptedClient(ModelCallError("context_overflow", "too long"))
    ex, _ = executor(client)
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10)
    assert info.value.attempts == 1

    client = ScriptedClient(ModelCallError("context_overflow", "too long"), "never")
    ex, _ = executor(client)
    seen: list[float] = []
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10, shrink=lambda r: seen.append(r))  # type: ignore[func-returns-value]
    assert seen == [0.85] and len(client.calls) == 1


def test_overflow_and_transient_budgets_are_independent() -> None:
    client = ScriptedClient(
        ModelCallError("timeout", "t"),
        ModelCallError("context_overflow", "o"),
        ModelCallError("timeout", "t"),
        ModelCallError("context_overflow", "o"),
        "ok",
    )
    ex, sleeps = executor(client)
    assert ex.execute(PROMPT, max_tokens=10, shrink=lambda r: (PROMPT, None)).text == "ok"
    assert len(client.calls) == 5 and sleeps == [0.05, 0.1]


def test_retry_transient_off_gives_up_at_once_with_the_kind() -> None:
    client = ScriptedClient(ModelCallError("rate_limit", "slow", 429, 5.0), "never")
    ex, sleeps = executor(client, retry_transient=False)
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10)
    assert info.value.kind == "rate_limit" and info.value.retry_after == 5.0
    assert len(client.calls) == 1 and sleeps == []


def test_a_plain_model_error_keeps_its_retry_after() -> None:
    # Any ModelError carries retry_after, not only the summariser's own ModelCallError.
    client = ScriptedClient(ModelError("rate_limit", "slow", retry_after=2.0), "ok")
    ex, sleeps = executor(client)
    assert ex.execute(PROMPT, max_tokens=10).text == "ok"
    assert sleeps == [2.0]
    assert ModelError("rate_limit", "slow").retry_after is None


def test_foreign_exceptions_are_classified() -> None:
    client = ScriptedClient(TimeoutError("slow"), ConnectionResetError("reset"), "ok")
    ex, sleeps = executor(client)
    assert ex.execute(PROMPT, max_tokens=10).text == "ok"
    assert sleeps == [0.05, 0.1]

    client = ScriptedClient(RuntimeError("401 Unauthorized"), "never")
    ex, _ = executor(client)
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10)
    assert info.value.kind == "authentication"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_programming_errors_are_not_retried() -> None:
    client = ScriptedClient(TypeError("complete() got an unexpected keyword"), "never")
    ex, _ = executor(client)
    with pytest.raises(ModelCallError) as info:
        ex.execute(PROMPT, max_tokens=10)
    assert info.value.kind == "unknown" and len(client.calls) == 1


def test_missing_usage_is_counted_with_the_counter() -> None:
    client = ScriptedClient("a" * 40, usage=Usage(0, 0, 0, model="scripted"))
    ex, _ = executor(client)
    result = ex.execute(PROMPT, max_tokens=100)
    assert result.usage.output_tokens == 10 and result.usage.input_tokens > 0


def test_usage_accumulates_over_executions() -> None:
    client = ScriptedClient("a", ModelCallError("timeout", "t"), "b")
    ex, _ = executor(client)
    ex.execute(PROMPT, max_tokens=10)
    second = ex.execute(PROMPT, max_tokens=10)
    assert second.usage.calls == 2 and second.usage.input_tokens == 100
    assert ex.calls == 3 and ex.usage.input_tokens == 200


def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        CompressionExecutor(ScriptedClient(), EstimateCounter(), overflow_ratios=(1.5,))
    with pytest.raises(ValueError):
        CompressionExecutor(ScriptedClient(), EstimateCounter(), transient_retries=-1)
    with pytest.raises(ValueError):
        CompressionExecutor(ScriptedClient(), EstimateCounter()).execute(PROMPT, max_tokens=0)


# --- diagnostics --------------------------------------------------------------------------------


def test_debug_records_each_retry_decision(tmp_path: Path) -> None:
    debug = DebugLog(tmp_path / "{session_id}", processor="RoundLevel", session_id="s1")
    client = ScriptedClient(
        ModelCallError("rate_limit", "key sk-abcdefghijklmnopqrstuvwx leaked"),
        ModelCallError("context_overflow", "too long"),
        ModelCallError("authentication", "bad key"),
    )
    ex, _ = executor(client, debug=debug)
    with pytest.raises(ModelCallError):
        ex.execute(PROMPT, max_tokens=10, shrink=lambda r: (PROMPT, None))
    path = tmp_path / "s1" / "RoundLevel.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["error_type"], r["retried"], r["reason"]) for r in records] == [
        ("transient:rate_limit", True, "transient_backoff"),
        ("context_overflow", True, "budget_ratio_shrink"),
        ("authentication", False, "not_retryable"),
    ]
    assert records[0]["delay_seconds"] == 0.05 and records[1]["budget_ratio"] == 0.85
    assert {"timestamp", "event", "processor", "session_id", "context_id"} <= records[0].keys()
    assert "sk-abcdefghijklmnopqrstuvwx" not in path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_dump_writes_a_redacted_private_file(tmp_path: Path) -> None:
    dump = CompressionDump(tmp_path / "dumps", session_id="../../etc/passwd", clock=lambda: 1700000000.0)
    client = ScriptedClient("summary with password=hunter2")
    ex, _ = executor(client, dump=dump)
    ex.execute([UserMessage(content="prompt with sk-abcdefghijklmnopqrstuv")], max_tokens=10)
    path = ex.write_dump(
        "RoundLevelCompressor",
        extracted_summary="summary",
        context_after=[AssistantMessage(content="after")],
        tokens_before=1000,
        tokens_after=250,
        span={"messages_to_compress_count": 4},
    )
    assert path is not None and path.parent == (tmp_path / "dumps").resolve()
    assert path.name.startswith("1700000000000_RoundLevelCompressor_")
    assert "/" not in path.name and ".." not in path.name and len(path.name) <= 80
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert "hunter2" not in text and "sk-abcdefghijklmnopqrstuv" not in text
    record = json.loads(text)
    assert record["compression_request"]["prompt"].startswith("prompt with")
    assert record["benefit"] == {
        "tokens_before": 1000,
        "tokens_after": 250,
        "reduction": 750,
        "reduction_ratio": 0.75,
    }
    assert record["context_after"]["total_tokens_after"] == 250
    # A second dump in the same millisecond gets its own file.
    assert ex.write_dump("RoundLevelCompressor") not in (None, path)


def test_dump_failures_are_swallowed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Another test's Celery worker may have raised the root level; ask for warnings explicitly.
    caplog.set_level(logging.WARNING, logger="ctxcore.summarize.dump")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    dump = CompressionDump(blocker / "dumps")
    assert dump.write("P", {"x": 1}) is None
    assert DebugLog(blocker / "debug").event("threshold_check") is False
    assert "failed" in caplog.text
    # Without a dump configured nothing is written and nothing fails.
    ex, _ = executor(ScriptedClient("ok"))
    ex.execute(PROMPT, max_tokens=10)
    assert ex.write_dump("P") is None


def test_dump_helpers() -> None:
    assert safe_name("a b/../c:d") == "a-b-c-d"
    assert safe_name("..hidden") == "hidden"
    assert len(safe_name("x" * 200)) == 80
    assert benefit(0, 10) == {"tokens_before": 0, "tokens_after": 10, "reduction": 0, "reduction_ratio": 0.0}
