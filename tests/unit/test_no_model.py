"""A stage that needs a model client, run without one, is the caller's ``ConfigError``;
the loop, given none, runs only the stages that need none."""

from __future__ import annotations

import pytest

from ctxcore.errors import ConfigError, ModelError
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.pipeline import PipelineConfig, Stage, compress_until_target, run_stage
from ctxcore.tokens import TiktokenCounter
from tests.datasets import conversations
from tests.pipeline_helpers import raw_view

COUNTER = TiktokenCounter()


def _summarizer(previous: object, pending: list[AnyMessage], target_tokens: int) -> list[AnyMessage]:
    return [UserMessage(content=f"did {len(pending)} things")]


def test_a_model_stage_without_a_model_client_is_a_config_error() -> None:
    view = raw_view(next(conversations("minisweagent.jsonl"))["messages"])
    cfg = PipelineConfig(target_tokens=view.tokens(COUNTER) // 2)
    stage = Stage(kind="l0_to_l1", based_on_version=0, target_tokens=cfg.target_tokens)
    with pytest.raises(ConfigError, match="stage l0_to_l1 needs a model client") as raised:
        run_stage(stage, view, None, COUNTER, config=cfg)
    assert not isinstance(raised.value, ModelError)  # not a failed call: nothing to retry
    assert "ExtractiveModel" in str(raised.value)  # says what to pass


def test_the_loop_without_a_model_runs_the_summarizer_and_the_truncate_only() -> None:
    view = raw_view(next(conversations("minisweagent.jsonl"))["messages"])
    cfg = PipelineConfig(target_tokens=max(view.tokens(COUNTER) // 20, 200))
    run = compress_until_target(view, cfg, None, COUNTER, _summarizer)
    assert run.errors == []  # no stage was tried that could not run
    assert {r.stage.kind for r in run.results} <= {"l0_to_l1", "hard_truncate"}
    assert "l0_to_l1" in {r.stage.kind for r in run.results}
