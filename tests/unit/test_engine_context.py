"""ModelContext semantics: log vs view, ids, windowing, stats, persistence, pooling."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ctxcore.engine import AsyncModelContext, ContextEngine, ContextEngineConfig, ModelContext
from ctxcore.errors import ConfigError, CtxcoreError, InvalidKeyError, InvalidMessageError
from ctxcore.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.processors.reload_tool import RELOAD_TOOL_NAME
from ctxcore.tokens import EstimateCounter, TiktokenCounter
from ctxcore.window import check_window


def engine(**config: object) -> ContextEngine:
    return ContextEngine({"strict_processors": True, **config})


def dialogue(n: int) -> list[UserMessage | AssistantMessage]:
    out: list[UserMessage | AssistantMessage] = []
    for i in range(n):
        out += [UserMessage(content=f"question {i}"), AssistantMessage(content=f"answer {i}")]
    return out


def tool_turn(tag: str) -> list[UserMessage | AssistantMessage | ToolMessage]:
    call = ToolCall(id=f"c-{tag}", name="grep", arguments='{"q": "x"}')
    return [
        UserMessage(content=f"find {tag}"),
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(content=f"result {tag}", tool_call_id=call.id),
        AssistantMessage(content=f"found {tag}"),
    ]


def test_every_added_message_gets_its_log_id_in_append_order() -> None:
    ctx = engine().create_context("c")
    ids = ctx.add_messages(dialogue(2))
    ids += ctx.add_messages(UserMessage(content="more"))
    assert ids == [f"{n:012d}" for n in range(1, 6)]
    assert [m.context_message_id for m in ctx.get_raw_messages()] == ids
    assert ids == sorted(ids)


def test_a_foreign_context_message_id_is_replaced_by_this_contexts_log_id() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages(UserMessage(content="hi", context_message_id="999999999999"))
    assert ctx.get_raw_messages()[0].context_message_id == "000000000001"


def test_system_messages_and_non_messages_are_rejected() -> None:
    ctx = engine().create_context("c")
    with pytest.raises(InvalidMessageError, match="system messages"):
        ctx.add_messages([UserMessage(content="a"), SystemMessage(content="be nice")])
    with pytest.raises(InvalidMessageError, match="message 0"):
        ctx.add_messages([{"role": "user", "content": "dict"}])  # type: ignore[list-item]
    assert ctx.get_raw_messages() == []


def test_set_and_pop_change_the_view_only() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages(dialogue(3))
    raw = ctx.get_raw_messages()
    ctx.set_messages(raw[2:])
    assert ctx.get_messages() == raw[2:]
    popped = ctx.pop_messages(2)
    assert popped == raw[4:]
    assert ctx.get_messages() == raw[2:4]
    assert ctx.get_raw_messages() == raw


def test_set_messages_gives_a_message_foreign_to_the_log_a_derived_id_that_sorts_in_place() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages(dialogue(2))
    raw = ctx.get_raw_messages()
    summary = UserMessage(content="<memory_block_dialogue>earlier</memory_block_dialogue>")
    ctx.set_messages([raw[0], summary, raw[3]])
    view = ctx.get_messages()
    derived = view[1].context_message_id
    assert derived is not None and derived.startswith(f"{raw[0].context_message_id}+")
    assert str(raw[0].context_message_id) < derived < str(raw[3].context_message_id)
    assert ctx.raw_message(derived) is None
    ctx.set_messages(view)  # a derived id survives a second round trip
    assert ctx.get_messages()[1].context_message_id == derived


def test_max_context_message_num_limits_the_view_but_keeps_the_task_anchor() -> None:
    ctx = engine(max_context_message_num=3).create_context("c")
    ctx.add_messages(dialogue(10))
    view = ctx.get_messages()
    assert view[0].content == "question 0"
    assert [m.content for m in view[1:]] == ["answer 8", "question 9", "answer 9"]
    assert len(ctx.get_raw_messages()) == 20


def test_window_size_counts_system_messages_and_never_drops_an_anchor() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages(dialogue(5))
    window = ctx.get_context_window(system_messages=[SystemMessage(content="sys")], window_size=3)
    texts = [m.content for m in window.get_messages()]
    assert texts == ["sys", "question 0", "question 4", "answer 4"]


def test_dialogue_round_applies_before_window_size() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages(dialogue(5))
    window = ctx.get_context_window(dialogue_round=2, window_size=10)
    assert [m.content for m in window.context_messages] == [
        "question 0",
        "question 3",
        "answer 3",
        "question 4",
        "answer 4",
    ]
    assert ctx.get_context_window(dialogue_round=1).context_messages[-2].content == "question 4"


def test_config_defaults_window_and_explicit_arguments_override_them() -> None:
    ctx = engine(default_window_round_num=1).create_context("c")
    ctx.add_messages(dialogue(4))
    assert len(ctx.get_context_window().context_messages) == 3  # task anchor + last round
    assert len(ctx.get_context_window(dialogue_round=4).context_messages) == 8


@pytest.mark.parametrize("kwargs", [{"window_size": 0}, {"dialogue_round": -1}])
def test_non_positive_window_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    ctx = engine().create_context("c")
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        ctx.get_context_window(**kwargs)


def test_window_cut_inside_a_tool_step_never_leaves_an_orphan_result() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages([*tool_turn("a"), *tool_turn("b")])
    window = ctx.get_context_window(window_size=2)
    assert check_window(window.get_messages()) == []
    assert window.context_messages[0].content == "find a"


def test_statistic_counts_roles_tokens_and_dialogues() -> None:
    ctx = engine().create_context("c")
    ctx.add_messages([*tool_turn("a"), *dialogue(1)])
    stats = ctx.statistic()
    assert (stats.user_messages, stats.assistant_messages, stats.tool_messages) == (2, 3, 1)
    assert stats.total_dialogues == 2
    assert stats.total_tokens == ctx.token_counter.count_messages(ctx.get_messages())
    window = ctx.get_context_window(
        system_messages=[SystemMessage(content="sys")],
        tools=[{"type": "function", "function": {"name": "grep", "parameters": {}}}],
    )
    assert window.statistic.system_messages == 1 and window.statistic.tools == 1
    assert window.statistic.tool_tokens > 0


def test_tiktoken_counting_is_the_default_and_estimates_only_on_request() -> None:
    assert isinstance(engine().create_context("c").token_counter, TiktokenCounter)
    assert isinstance(
        engine(enable_tiktoken_counter=False).create_context("c").token_counter, EstimateCounter
    )
    own = EstimateCounter()
    assert engine().create_context("c", token_counter=own).token_counter is own


def test_context_max_follows_the_spec_resolution_order() -> None:
    assert engine(context_window_tokens=123, model_name="gpt-4o").create_context("c").context_max == 123
    assert engine(model_name="gpt-4o").create_context("c").context_max == 128_000
    assert (
        engine(model_name="mine", model_context_window_tokens={"mine": 456}).create_context("c").context_max
        == 456
    )
    assert engine().create_context("c").context_max == 200_000


def test_contexts_are_pooled_per_session_and_context_id() -> None:
    eng = engine()
    a = eng.create_context("c", "s1")
    assert eng.create_context("c", "s1") is a
    b = eng.create_context("c", "s2")
    assert b is not a and eng.create_context("c") is not a
    a.add_messages(UserMessage(content="only in a"))
    assert b.get_raw_messages() == []
    assert eng.get_context("c", "s1") is a
    eng.clear_context("c", "s1")
    assert eng.get_context("c", "s1") is None
    assert a.key.tenant_id == "s1" and eng.create_context("x").key.tenant_id == "default"


def test_unsafe_ids_are_rejected() -> None:
    with pytest.raises(InvalidKeyError):
        engine().create_context("../etc")
    with pytest.raises(InvalidKeyError):
        engine().create_context("c", session_id="a:b")


def test_history_messages_are_logged_without_running_processors() -> None:
    eng = engine()
    ctx = eng.create_context(
        "c", history_messages=dialogue(2), processors=[("WindowLimit", {"max_attached_turns": 1})]
    )
    assert [m.context_message_id for m in ctx.get_messages()] == [f"{n:012d}" for n in range(1, 5)]
    assert ctx.compression_states == []


def test_save_and_load_state_round_trip_the_log_view_and_ttl_clock() -> None:
    eng = engine()
    ctx = eng.create_context("c", processors=[("MicroCompactProcessor", None)])
    ctx.add_messages(dialogue(2))
    ctx.set_messages(
        [*ctx.get_messages()[:2], UserMessage(content="<memory_block_round>x</memory_block_round>")]
    )
    ctx.get_context_window()
    state = json.loads(json.dumps(ctx.save_state()))
    other = engine().create_context("c", processors=[("MicroCompactProcessor", None)])
    other.load_state(state)
    assert other.get_raw_messages() == ctx.get_raw_messages()
    assert other.get_messages() == ctx.get_messages()
    assert other.last_window_access == ctx.last_window_access
    other.add_messages(UserMessage(content="next"))
    assert other.get_raw_messages()[-1].context_message_id == "000000000005"
    with pytest.raises(CtxcoreError, match="processor chain"):
        engine().create_context("c").load_state(state)


def test_reload_tool_is_added_to_the_window_when_enabled() -> None:
    ctx = engine(enable_reload=True).create_context("c")
    ctx.add_messages(dialogue(1))
    names = [t["function"]["name"] for t in ctx.get_context_window().tools]
    assert names == [RELOAD_TOOL_NAME]
    assert engine().create_context("c").get_context_window().tools == []


def test_async_context_runs_the_same_methods_as_coroutines() -> None:
    async def scenario(actx: AsyncModelContext) -> None:
        await actx.add_messages(dialogue(2))
        assert len(await actx.get_messages()) == 4
        window = await actx.get_context_window(window_size=2)
        assert len(window.context_messages) == 3
        popped = await actx.pop_messages()
        assert popped[0].content == "answer 1"
        assert len(await actx.get_raw_messages()) == 4
        assert await actx.compress_context() == "noop"
        assert (await actx.statistic()).total_messages == 3

    asyncio.run(scenario(engine().create_async_context("c")))


def test_config_accepts_a_model_or_a_dict_and_rejects_unknown_keys() -> None:
    assert ContextEngine(ContextEngineConfig(model_name="gpt-4o")).config.model_name == "gpt-4o"
    with pytest.raises(ConfigError, match="'tokens_thresold'"):
        ContextEngine({"tokens_thresold": 1})
    with pytest.raises(ConfigError, match="'max_context_message_num'"):
        ContextEngine({"max_context_message_num": 0})
    with pytest.raises(ConfigError, match="chunk_overlap_tokens"):
        ContextEngine({"compression_recall_config": {"chunk_size_tokens": 10, "chunk_overlap_tokens": 10}})
    with pytest.raises(ConfigError, match="enable_openrouter_model_context_window_tokens"):
        ContextEngine({"enable_openrouter_model_context_window_tokens": True})


def test_model_context_is_the_public_type() -> None:
    assert isinstance(engine().create_context("c"), ModelContext)
