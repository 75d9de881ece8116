"""Every model call in ctxcore fits the summariser's context (``model.context_window_tokens``):
the incremental ``Coordinator.compress`` and the embedded compressors (current round,
dialogue, round level) go through the pipeline's fitting (``ctxcore.pipeline.fitting``). A
scripted model records the input tokens and ``max_tokens`` of each call and refuses, as a
server would, any call over its context; a call that cannot fit fails visibly as
``CallTooLarge`` with the sizes, before anything is sent. Also: a summary asked for never
exceeds what the client's output cap returns whole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ctxcore import from_openai
from ctxcore.config import ModelSettings
from ctxcore.coordinator import Coordinator
from ctxcore.engine import ContextEngine, ContextEngineConfig
from ctxcore.errors import ErrorKind
from ctxcore.messages import AnyMessage, SystemMessage, ToolMessage, UserMessage, message_text
from ctxcore.pipeline import PipelineConfig, plan_next_stage, run_stage
from ctxcore.pipeline.fitted_client import FittedClient
from ctxcore.pipeline.fitting import (
    CallLimits,
    CallTooLarge,
    fit_messages,
    output_tokens_for,
    target_within_output,
)
from ctxcore.processors.llm_support import call_limits
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryStateStore
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, OutputContract
from ctxcore.tokens import TiktokenCounter
from tests.datasets import conversations
from tests.pipeline_helpers import raw_view

COUNTER = TiktokenCounter()
KEY = ConversationKey("acme", "fit-1")


class WindowedModel:
    """The offline model behind a context of ``window`` tokens: each call's input tokens and
    ``max_tokens`` are recorded; a call whose input and output room exceed the window is
    refused as a server refuses it (``context_overflow``)."""

    name = "windowed"

    def __init__(self, window: int, max_output: int | None = None) -> None:
        self.window = window
        self.max_output = max_output
        self.inner = ExtractiveModel(COUNTER)
        self.calls: list[tuple[int, int]] = []
        self.refused = 0

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        sent = max_tokens if self.max_output is None else min(max_tokens, self.max_output)
        size = COUNTER.count_messages(list(messages))
        if size + sent > self.window:
            self.refused += 1
            raise ModelCallError("context_overflow", f"{size} + {sent} tokens over the context {self.window}")
        self.calls.append((size, sent))
        return self.inner.complete(messages, max_tokens=sent, contract=contract)


def _swe() -> list[AnyMessage]:
    msgs = from_openai(next(conversations("minisweagent.jsonl"))["messages"])
    return [m for m in msgs if not isinstance(m, SystemMessage)]


def _coordinator(model: WindowedModel, limits: CallLimits) -> tuple[Coordinator, MemoryMessageLog]:
    log = MemoryMessageLog()
    coord = Coordinator(
        MemoryStateStore(),
        log,
        COUNTER,
        model_for=lambda key: model,
        trigger=lambda inp: True,
        keep_recent_messages=2,
        call_limits_for=lambda key: limits,
    )
    return coord, log


# --- the fitting itself -----------------------------------------------------------------


def test_fit_messages_cuts_the_longest_trimmable_message_only_as_far_as_needed() -> None:
    messages: list[AnyMessage] = [
        SystemMessage(content="rules " * 50),
        UserMessage(content="short question"),
        ToolMessage(content="line of output\n" * 400, tool_call_id="c1"),
        UserMessage(content="instruction " * 20),
    ]
    whole = COUNTER.count_messages(messages)
    budget = whole // 2
    fitted = fit_messages(messages, [1, 2], budget, COUNTER, marker="[cut]")
    assert fitted is not None
    assert COUNTER.count_messages(fitted) <= budget
    assert COUNTER.count_messages(fitted) > budget - 20, "cut further than needed"
    assert [m.role for m in fitted] == [m.role for m in messages]
    assert fitted[0] == messages[0] and fitted[1] == messages[1] and fitted[3] == messages[3]
    assert "[cut]" in message_text(fitted[2])
    assert fit_messages(messages, [1, 2], whole, COUNTER) == messages
    # Not even the trimmable messages cut to the marker fit: None.
    assert fit_messages(messages, [1, 2], COUNTER.count_messages(messages[:1]), COUNTER) is None


def test_the_offline_model_has_no_output_cap() -> None:
    assert CallLimits.of(ModelSettings(context_window_tokens=4096)) == CallLimits(4096, None)
    online = ModelSettings(base_url="http://127.0.0.1:9/v1", context_window_tokens=4096, max_tokens=512)
    assert CallLimits.of(online) == CallLimits(4096, 512)
    assert call_limits(online, None) == CallLimits(4096, 512)
    assert call_limits(online, 2048) == CallLimits(2048, 512)
    assert call_limits(ExtractiveModel(COUNTER), 2048) == CallLimits(2048, None)
    assert call_limits(None, None) == CallLimits()


def test_a_summary_is_never_asked_beyond_what_the_output_cap_returns() -> None:
    view = raw_view(list(next(conversations("minisweagent.jsonl"))["messages"]))
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 3, max_output_tokens=300)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    uncapped = WindowedModel(10**9)
    run_stage(stage, view, uncapped, COUNTER, config=cfg.model_copy(update={"max_output_tokens": None}))
    assert max(o for _, o in uncapped.calls) > 300, "the case needs a summary larger than the cap"
    capped = WindowedModel(10**9)
    result = run_stage(stage, view, capped, COUNTER, config=cfg)
    assert capped.calls and all(o <= 300 for _, o in capped.calls)
    assert output_tokens_for([target_within_output(300)]) <= 300
    assert result.changed


# --- Coordinator.compress -----------------------------------------------------------------


@pytest.mark.parametrize("window", [1500, 3000])
def test_incremental_compress_calls_fit_the_context(window: int) -> None:
    model = WindowedModel(window)
    coord, log = _coordinator(model, CallLimits(window, None))
    log.append(KEY, _swe())
    result = coord.compress(KEY)
    assert result.outcome == "compressed", (result.error, result.detail)
    assert model.calls and model.refused == 0
    assert all(size + out <= window for size, out in model.calls), model.calls
    # Split across calls rather than trimmed to one: a block per piece of the run.
    assert len(result.state.blocks) == len(model.calls) > 1


def test_incremental_compress_without_a_limit_is_one_call() -> None:
    model = WindowedModel(10**9)
    coord, log = _coordinator(model, CallLimits())
    log.append(KEY, _swe())
    result = coord.compress(KEY)
    assert result.outcome == "compressed" and len(model.calls) == 1


def test_incremental_compress_that_cannot_fit_fails_with_the_sizes() -> None:
    model = WindowedModel(120)
    coord, log = _coordinator(model, CallLimits(120, None))
    log.append(KEY, _swe())
    result = coord.compress(KEY)
    assert result.outcome == "failed" and result.error_kind == ErrorKind.CONTEXT_OVERFLOW
    error = result.exception
    assert isinstance(error, CallTooLarge) and error.window == 120 and error.needed + error.output > 120
    assert "120" in str(error) and str(error.needed) in str(error)
    assert not model.calls and model.refused == 0, "nothing may be sent that the server would refuse"
    assert result.state.version == 0


def test_the_fitted_client_leaves_system_prompts_whole() -> None:
    seen: list[list[AnyMessage]] = []

    class Spy:
        name = "spy"

        def complete(
            self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
        ) -> Completion:
            seen.append(list(messages))
            return ExtractiveModel(COUNTER).complete(messages, max_tokens=max_tokens)

    system = SystemMessage(content="the instruction " * 40)
    client = FittedClient(Spy(), CallLimits(600, None), COUNTER, "l0_to_l1")
    client.complete([system, UserMessage(content="step output " * 800)], max_tokens=200)
    assert seen[0][0] == system
    assert COUNTER.count_messages(seen[0]) + 200 <= 600


# --- the embedded compressors -------------------------------------------------------------


def _compress(name: str, cfg: dict[str, Any], rest: list[AnyMessage], context: int = 16_000) -> Any:
    engine = ContextEngine(ContextEngineConfig(context_window_tokens=context))
    ctx = engine.create_context(f"fit-{name}", processors=[(name, cfg)], history_messages=rest)
    before = ctx.get_messages()
    return ctx, before, ctx.compress_context()


def _chat() -> list[AnyMessage]:
    # A dialogue span lies between two real user messages: a run with several of them.
    runs = (
        [m for m in from_openai(c["messages"]) if not isinstance(m, SystemMessage)]
        for c in conversations("tau_bench.jsonl")
    )
    return max(runs, key=lambda r: COUNTER.count_messages(r))


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("CurrentRoundCompressor", {}),
        ("DialogueCompressor", {}),
        ("RoundLevelCompressor", {"trigger_total_tokens": 3000, "target_total_tokens": 3000}),
    ],
)
def test_embedded_compressor_calls_fit_the_context(name: str, extra: dict[str, Any]) -> None:
    rest = _chat() if name == "DialogueCompressor" else _swe()
    whole = WindowedModel(10**9)
    _compress(name, {"model_client": whole, **extra}, rest)
    largest = max(size + out for size, out in whole.calls)
    window = largest * 2 // 3
    assert window > 1200, "the case needs a call larger than the context it is fitted to"
    model = WindowedModel(window)
    cfg = {"model_client": model, "model_context_window_tokens": window, **extra}
    ctx, before, outcome = _compress(name, cfg, rest)
    assert outcome != "noop" and ctx.get_messages() != before, ctx.last_failures
    assert model.calls and model.refused == 0
    assert all(size + out <= window for size, out in model.calls), (window, model.calls)


@pytest.mark.parametrize("name", ["CurrentRoundCompressor", "DialogueCompressor", "RoundLevelCompressor"])
def test_embedded_compressor_call_that_cannot_fit_fails_visibly(name: str) -> None:
    rest = _chat() if name == "DialogueCompressor" else _swe()
    extra = (
        {"trigger_total_tokens": 3000, "target_total_tokens": 3000} if name == "RoundLevelCompressor" else {}
    )
    model = WindowedModel(100)
    ctx, before, outcome = _compress(
        name, {"model_client": model, "model_context_window_tokens": 100, **extra}, rest
    )
    assert outcome == "noop" and ctx.get_messages() == before
    assert ctx.last_failures, "the failure must be visible"
    error = ctx.last_failures[0].error
    assert "model.context_window_tokens (100)" in str(error), error
    assert not model.calls and model.refused == 0


def test_a_settings_model_client_brings_its_own_context() -> None:
    spec = {"name": "m", "context_window_tokens": 100}
    ctx, before, outcome = _compress("CurrentRoundCompressor", {"model_client": spec}, _swe())
    assert outcome == "noop" and ctx.get_messages() == before
    assert "model.context_window_tokens (100)" in str(ctx.last_failures[0].error)
