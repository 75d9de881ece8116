"""``CtxcoreMiddleware`` in a real LangChain v1 agent (``create_agent``) replaying a bundled
mini-swe-agent run, against the real app and a real Celery worker."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, RemoveMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import PrivateAttr

from ctxcore.client import CtxcoreClient
from ctxcore.engine import ContextEngine
from ctxcore.errors import ConfigError, UnsupportedItemError
from ctxcore.integrations.langchain import CtxcoreMiddleware, from_langchain
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import from_openai
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from tests.datasets import swe_runs
from tests.live_server import TOKEN, LiveApi, serve_api

pytestmark = pytest.mark.redis


class Replay(GenericFakeChatModel):
    """Replays recorded replies; records every input it is called with."""

    _inputs: list[list[BaseMessage]] = PrivateAttr(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Replay:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self._inputs.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def _run(run_id: str) -> dict[str, Any]:
    return next(r for r in swe_runs() if r["id"] == run_id)


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[LiveApi]:
    api = serve_api(redis_url, worker=True)
    try:
        yield api
    finally:
        api.close()


def test_create_agent_replaying_a_swe_run_sees_ctxcore_windows_and_keeps_its_state(live: LiveApi) -> None:
    run = _run("pytest-dev__pytest-7982")
    raw = from_openai(run["messages"])
    system, task = raw[0].text, raw[1].text
    steps = [m for m in raw[2:] if m.role == "assistant"]
    outputs = iter(m.text for m in raw[2:] if m.role == "tool")
    conv = f"lc-{uuid.uuid4().hex[:8]}"
    client = CtxcoreClient(live.url, TOKEN)
    calls = {"n": 0}

    @tool
    def bash(command: str) -> str:
        """Run a shell command."""
        calls["n"] += 1
        if calls["n"] == len(steps) // 2:
            # Halfway, let the worker catch up: from here on, windows hold summary blocks.
            deadline = time.monotonic() + 60
            while client.state(conv).version < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
        return next(outputs)

    replies = [
        AIMessage(
            content=m.text,
            tool_calls=[{"name": c.name, "args": json.loads(c.arguments), "id": c.id} for c in m.tool_calls],
        )
        for m in steps
    ]
    model = Replay(messages=iter([*replies, AIMessage(content="Submitted.")]))
    counter = TiktokenCounter()
    total = counter.count_messages(raw)
    budget = total // 4
    agent = create_agent(
        model,
        tools=[bash],
        system_prompt=system,
        middleware=[CtxcoreMiddleware(client=client, budget_tokens=budget)],
    )
    result = agent.invoke(
        {"messages": [HumanMessage(task)]},
        config={"configurable": {"thread_id": conv}, "recursion_limit": 1000},
    )
    # The final reply was logged when the agent finished (after_agent), not at a next call
    logged_run = list(client.messages(conv))
    client.close()
    assert [m.text for m in logged_run] == [m.text for m in result["messages"]]
    assert logged_run[-1].role == "assistant" and logged_run[-1].text == "Submitted."
    # The graph state holds the run unchanged: every message, none compacted
    state = result["messages"]
    assert len(state) == len(raw) - 1 + 1  # the run without its system message, plus the final reply
    assert [m.text for m in state[:-1]] == [m.text for m in raw[1:]]
    # Every model input was ctxcore's window: within budget, valid, anchored
    tools_tokens = counter.count_tools([convert_to_openai_tool(bash)])
    inputs = model._inputs
    assert len(inputs) == len(steps) + 1
    blocks = 0
    for i, seen in enumerate(inputs):
        logged, systems = from_langchain(seen)
        assert [s.text for s in systems] == [system], i
        assert check_window(logged) == [], i
        assert counter.count_messages([*systems, *logged]) + tools_tokens <= budget, i
        assert any(m.role == "user" and m.text == task for m in logged), i
        blocks += any(ROUND_LEVEL_MEMORY_BLOCK in m.text for m in logged)
    assert blocks >= len(inputs) // 3, blocks
    assert len(inputs[-1]) < len(state) // 2


def test_the_middleware_over_an_embedded_context_and_bad_input() -> None:
    ctx = ContextEngine({"context_window_tokens": 4000}).create_context("embedded")
    model = Replay(messages=iter([AIMessage(content="hello back")]))
    agent = create_agent(model, tools=[], system_prompt="Be brief.", middleware=[CtxcoreMiddleware(ctx)])
    result = agent.invoke({"messages": [HumanMessage("hello", id="h1")]})
    # The final reply is logged once the agent finishes (after_agent), with its LangChain id
    reply = result["messages"][-1]
    assert [(m.role, m.message_id, m.text) for m in ctx.get_raw_messages()] == [
        ("user", "h1", "hello"),
        ("assistant", reply.id, "hello back"),
    ]
    assert [type(m).__name__ for m in model._inputs[0]] == ["SystemMessage", "HumanMessage"]
    with pytest.raises(UnsupportedItemError, match="RemoveMessage"):
        from_langchain([HumanMessage("x"), RemoveMessage(id="h1")])
    with pytest.raises(UnsupportedItemError, match="ChatMessage"):
        from_langchain([ChatMessage(content="x", role="critic")])
    remote = CtxcoreMiddleware(client=CtxcoreClient("http://127.0.0.1:9", TOKEN), budget_tokens=1000)
    agent = create_agent(Replay(messages=iter(["x"])), tools=[], middleware=[remote])
    with pytest.raises(ConfigError, match="thread_id"):
        agent.invoke({"messages": [HumanMessage("hello")]})
    with pytest.raises(ConfigError):
        CtxcoreMiddleware(client=CtxcoreClient("http://127.0.0.1:9", TOKEN))


def test_the_final_reply_is_logged_when_the_agent_finishes_async_and_on_a_second_turn() -> None:
    import asyncio

    engine = ContextEngine({"context_window_tokens": 4000})
    ctx = engine.create_async_context("async-run")
    model = Replay(messages=iter([AIMessage(content="first answer"), AIMessage(content="second answer")]))
    agent = create_agent(model, tools=[], middleware=[CtxcoreMiddleware(ctx)])

    async def run() -> list[Any]:
        state = await agent.ainvoke({"messages": [HumanMessage("one", id="u1")]})
        after_first = [m.text for m in await ctx.get_raw_messages()]
        state = await agent.ainvoke({"messages": [*state["messages"], HumanMessage("two", id="u2")]})
        return [after_first, [m.text for m in await ctx.get_raw_messages()], state["messages"]]

    after_first, after_second, state = asyncio.run(run())
    assert after_first == ["one", "first answer"]
    # Each message once, though the second turn's state holds the first turn again
    assert after_second == ["one", "first answer", "two", "second answer"] == [m.text for m in state]


def test_the_final_reply_is_logged_over_the_async_client(live: LiveApi) -> None:
    import asyncio

    from ctxcore.client import AsyncCtxcoreClient

    conv = f"lc-async-{uuid.uuid4().hex[:8]}"
    model = Replay(messages=iter([AIMessage(content="done, asynchronously")]))

    async def run() -> tuple[list[str], list[str]]:
        async with AsyncCtxcoreClient(live.url, TOKEN) as client:
            middleware = CtxcoreMiddleware(client=client, budget_tokens=4000)
            agent = create_agent(model, tools=[], middleware=[middleware])
            state = await agent.ainvoke(
                {"messages": [HumanMessage("finish this", id="a1")]},
                config={"configurable": {"thread_id": conv}},
            )
            logged = [m.text async for m in client.messages(conv)]
        return logged, [m.text for m in state["messages"]]

    logged, state = asyncio.run(run())
    assert logged == state == ["finish this", "done, asynchronously"]
