"""A call's timeout grows with the output it asks for (``model.timeout_per_output_token``):
a slow model gets the time a long summary needs, a short call still gives up early."""

from __future__ import annotations

import pytest

from ctxcore.config import ModelSettings
from ctxcore.errors import ConfigError
from ctxcore.messages import UserMessage
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.openai_chat import OpenAIChatModel
from ctxcore.testing.openai_server import OpenAIServer
from ctxcore.tokens import TiktokenCounter
from workers.runtime import build_model


def test_call_timeout_is_base_plus_per_output_token() -> None:
    model = OpenAIChatModel("http://127.0.0.1:9/v1", timeout=2.0, timeout_per_output_token=0.05)
    assert model.call_timeout(0) == 2.0
    assert model.call_timeout(400) == pytest.approx(22.0)
    with pytest.raises(ConfigError, match="timeout_per_output_token"):
        OpenAIChatModel("http://127.0.0.1:9/v1", timeout_per_output_token=-1)


def test_settings_reach_the_client() -> None:
    cfg = ModelSettings(base_url="http://127.0.0.1:9/v1", timeout=3, timeout_per_output_token=0.1)
    model = build_model(cfg, TiktokenCounter())
    assert isinstance(model, OpenAIChatModel)
    assert model.call_timeout(100) == pytest.approx(13.0)


def test_a_slow_reply_times_out_only_for_a_short_call() -> None:
    ask = [UserMessage(content="summarise")]
    with (
        OpenAIServer() as server,
        OpenAIChatModel(server.base_url, timeout=0.2, timeout_per_output_token=0.03) as model,
    ):
        server.push_text("late", delay=1.5)
        # 10 output tokens: 0.5 s, the reply takes 1.5 s.
        with pytest.raises(ModelCallError) as caught:
            model.complete(ask, max_tokens=10)
        assert caught.value.kind == "timeout" and caught.value.transient
        server.push_text("in time", delay=1.5)
        # 200 output tokens: 6.2 s.
        assert model.complete(ask, max_tokens=200).text == "in time"
