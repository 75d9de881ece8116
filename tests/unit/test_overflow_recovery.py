"""Overflow recovery: a provider's context-overflow error compresses once and retries; other
errors, and output already streamed, never do."""

from __future__ import annotations

from typing import Any

import pytest

from ctxcore.engine import ContextEngine
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.processors import (
    ProcessorRegistry,
)
from tests.unit.engine_processors import Recorder, make, registry_with_test_processors


@pytest.fixture
def registry() -> ProcessorRegistry:
    return registry_with_test_processors()


class ProviderError(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__("request failed")
        self.body = body


def test_overflow_recovery_compresses_once_for_a_wrapped_provider_error(registry: ProcessorRegistry) -> None:
    eng = ContextEngine(registry=registry)
    ctx = eng.create_context("c", processors=[("Recorder", None)])
    ctx.add_messages([UserMessage(content="a"), UserMessage(content="b")])
    try:
        try:
            raise ProviderError({"error": {"message": "This model's maximum context length is 8192 tokens"}})
        except ProviderError as inner:
            raise RuntimeError("agent step failed") from inner
    except RuntimeError as wrapped:
        assert eng.recover_from_model_exception(wrapped, "c") is True
    assert Recorder.order == ["x"]
    assert ctx.compression_states[-1].trigger == "model_context_overflow"


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("You exceeded your current quota, please check your plan and billing details"),
        RuntimeError("maximum output tokens exceeded"),
        RuntimeError("output token limit reached"),
        TimeoutError("network timeout"),
    ],
)
def test_overflow_recovery_ignores_other_errors(registry: ProcessorRegistry, error: Exception) -> None:
    ctx = make(registry, [("Recorder", None)])
    ctx.add_messages([UserMessage(content="a"), UserMessage(content="b")])
    assert ctx.recover_from_model_exception(error) is False
    assert Recorder.order == []


def test_overflow_recovery_never_retries_after_streamed_output(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("Recorder", None)])
    ctx.add_messages([UserMessage(content="a"), UserMessage(content="b")])
    assert ctx.recover_from_model_exception(RuntimeError("prompt is too long"), stream_started=True) is False
    assert ctx.recover_from_model_exception(RuntimeError("prompt is too long")) is True


def test_forced_compression_ignores_thresholds_of_rule_processors() -> None:
    big = "line of output\n" * 200
    call = ToolCall(id="1", name="bash", arguments="{}")
    ctx = ContextEngine({"strict_processors": True}).create_context(
        "c", processors=[("MessageOffloader", {"tokens_threshold": 10**9, "keep_last_round": False})]
    )
    ctx.add_messages(
        [
            UserMessage(content="run it"),
            AssistantMessage(content="", tool_calls=[call]),
            ToolMessage(content=big, tool_call_id="1"),
            AssistantMessage(content="done"),
        ]
    )
    assert ctx.get_messages()[2].content == big
    assert ctx.compress_context() == "compressed"
    assert "[[OFFLOAD: handle=" in str(ctx.get_messages()[2].content)
