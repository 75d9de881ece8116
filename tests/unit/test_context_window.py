"""``model.context_window_tokens``: every summariser call of every stage fits the model's
context with room for its output (split across calls, or trimmed); a call that cannot fits
fails visibly with the sizes; a context below the smallest call is refused at start-up."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from ctxcore.config import ModelSettings, Settings
from ctxcore.errors import ConfigError, ErrorKind, ModelError
from ctxcore.messages import AnyMessage
from ctxcore.pipeline import PipelineConfig, Stage, compress_until_target, plan_next_stage, run_stage
from ctxcore.pipeline.fitting import (
    CallTooLarge,
    check_context_window,
    group_to_fit,
    minimum_context_window,
    minimum_output,
)
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, OutputContract, Usage
from ctxcore.tokens import TiktokenCounter
from tests.datasets import conversations
from tests.pipeline_helpers import raw_view

COUNTER = TiktokenCounter()


class RecordingModel:
    """The offline model, recording each call's input tokens and ``max_tokens``."""

    name = "recording"

    def __init__(self) -> None:
        self.inner = ExtractiveModel(COUNTER)
        self.calls: list[tuple[int, int, int]] = []

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        blocks = len(contract.blocks) if contract is not None else 0
        self.calls.append((COUNTER.count_messages(list(messages)), max_tokens, blocks))
        return self.inner.complete(messages, max_tokens=max_tokens, contract=contract)


def _long_run() -> list[dict[str, object]]:
    return list(next(conversations("minisweagent.jsonl"))["messages"])


def test_the_setting_is_validated() -> None:
    assert ModelSettings().context_window_tokens is None
    assert ModelSettings(context_window_tokens=32_768).context_window_tokens == 32_768
    with pytest.raises(ValidationError):
        ModelSettings(context_window_tokens=0)
    with pytest.raises(ValidationError):
        PipelineConfig(target_tokens=100, context_window_tokens=-1)


def test_group_to_fit_keeps_order_and_isolates_what_does_not_fit() -> None:
    def fits(group: Sequence[int]) -> bool:
        return sum(group) <= 10

    assert group_to_fit([1, 2, 3], fits) == [[1, 2, 3]]
    assert group_to_fit([6, 3, 4, 20, 1], fits) == [[6, 3], [4], [20], [1]]
    assert group_to_fit([], fits) == []


@pytest.mark.parametrize("window", [3000, 6000])
def test_every_stage_call_fits_the_window(window: int) -> None:
    view = raw_view(_long_run())
    total = view.tokens(COUNTER)
    cfg = PipelineConfig(target_tokens=total // 8, context_window_tokens=window, keep_recent_messages=2)
    model = RecordingModel()
    run = compress_until_target(view, cfg, model, COUNTER)
    assert model.calls, "the pipeline made no summariser call"
    for prompt, output, _ in model.calls:
        assert prompt + output <= window, (prompt, output, window)
    kinds = {r.stage.kind for r in run.results}
    assert "l0_to_l1" in kinds
    assert run.view.tokens(COUNTER) < total


def test_a_stage_too_large_for_one_call_is_split() -> None:
    view = raw_view(_long_run())
    total = view.tokens(COUNTER)
    cfg = PipelineConfig(target_tokens=total // 4, l1_source_tokens=1500, summarise_all_pending=True)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None and stage.kind == "l0_to_l1"
    whole = RecordingModel()
    run_stage(stage, view, whole, COUNTER, config=cfg)
    assert len(whole.calls) == 1 and whole.calls[0][2] > 1, "expected one call carrying several targets"
    window = whole.calls[0][0] // 2 + whole.calls[0][1]
    fitted = RecordingModel()
    result = run_stage(
        stage, view, fitted, COUNTER, config=cfg.model_copy(update={"context_window_tokens": window})
    )
    assert len(fitted.calls) > 1
    assert all(p + o <= window for p, o, _ in fitted.calls)
    assert result.model_calls == len(fitted.calls)
    # Split, every target still went to the model once.
    assert sum(b for _, _, b in fitted.calls) == whole.calls[0][2]
    assert result.changed


def test_a_call_that_cannot_fit_fails_with_the_sizes() -> None:
    view = raw_view(_long_run())
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 4, context_window_tokens=350)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert isinstance(stage, Stage)
    model = RecordingModel()
    with pytest.raises(CallTooLarge) as caught:
        run_stage(stage, view, model, COUNTER, config=cfg)
    error = caught.value
    assert isinstance(error, ModelError) and error.kind == ErrorKind.CONTEXT_OVERFLOW
    assert error.window == 350 and error.needed + error.output > 350
    assert "350" in str(error) and str(error.output) in str(error) and str(error.needed) in str(error)
    assert not model.calls, "nothing may be sent that the server would refuse"
    # In the loop each model stage is a visible failure with its kind; nothing was sent.
    run = compress_until_target(view, cfg, model, COUNTER)
    assert {kind for kind, e in run.errors if isinstance(e, CallTooLarge)} >= {"l0_to_l1"}
    assert not model.calls


def test_a_context_below_the_smallest_call_is_refused() -> None:
    least = minimum_context_window(COUNTER)
    assert least > 200
    check_context_window(None, COUNTER, "model.context_window_tokens")
    check_context_window(least, COUNTER, "model.context_window_tokens")
    with pytest.raises(
        ConfigError, match=rf"model.context_window_tokens: {least - 1} tokens .* {least} tokens"
    ):
        check_context_window(least - 1, COUNTER, "model.context_window_tokens")


def test_start_up_refuses_a_tenant_context_too_small() -> None:
    from workers.runtime import check_model_contexts

    ok = Settings.load({"model": {"context_window_tokens": 32_768}})
    check_model_contexts(ok, COUNTER)
    bad = Settings.load({"tenants": {"acme": {"model": {"context_window_tokens": 100}}}})
    with pytest.raises(ConfigError, match=r"tenants.acme.model.context_window_tokens: 100 tokens"):
        check_model_contexts(bad, COUNTER)


def test_start_up_refuses_an_output_cap_below_the_smallest_summary() -> None:
    from workers.runtime import check_model_contexts

    least = minimum_output(COUNTER)
    endpoint = {"base_url": "http://127.0.0.1:9/v1"}
    check_model_contexts(Settings.load({"model": {**endpoint, "max_tokens": least}}), COUNTER)
    # The offline model has no output cap: its max_tokens caps nothing.
    check_model_contexts(Settings.load({"model": {"max_tokens": least - 1}}), COUNTER)
    bad = Settings.load({"model": {**endpoint, "max_tokens": least - 1}})
    with pytest.raises(ConfigError, match=rf"model.max_tokens: {least - 1} tokens .* {least} tokens"):
        check_model_contexts(bad, COUNTER)


class EchoModel:
    """A small model's frequent answer: the task prompt repeated (cut at ``max_tokens``)."""

    name = "echo"

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        from ctxcore.messages import message_text

        text = message_text(messages[-1])
        return Completion(
            text=text[: max_tokens * 3], usage=Usage(COUNTER.count_messages(list(messages)), 1, 1)
        )


def test_a_reply_repeating_the_prompt_is_never_saved_as_a_summary() -> None:
    view = raw_view(_long_run())
    cfg = PipelineConfig(
        target_tokens=view.tokens(COUNTER) // 2, context_window_tokens=100_000, l1_source_tokens=10**9
    )
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    result = run_stage(stage, view, EchoModel(), COUNTER, config=cfg)
    assert not result.changed and result.model_calls >= 1
    assert "no summary was usable" in result.detail


def test_the_output_room_is_only_what_the_client_sends_for() -> None:
    view = raw_view(_long_run())
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 4, context_window_tokens=3000)
    stage = plan_next_stage(view, cfg, COUNTER)
    assert stage is not None
    uncapped, capped = RecordingModel(), RecordingModel()
    run_stage(stage, view, uncapped, COUNTER, config=cfg)
    run_stage(stage, view, capped, COUNTER, config=cfg.model_copy(update={"max_output_tokens": 256}))
    assert all(p + min(o, 256) <= 3000 for p, o, _ in capped.calls)
    # The room the cap leaves unused goes to the input: more of the source in each call.
    assert max(p for p, _, _ in capped.calls) > max(p for p, _, _ in uncapped.calls)
