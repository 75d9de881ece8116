"""``CtxcoreSession`` and its model-input filter in real ``Runner.run`` runs: a fake
``agents.models.interface.Model`` replays a bundled mini-swe-agent run (61 tool calls) at
a quarter of its tokens, against the real app and a real Celery worker."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.items import ModelResponse
from agents.models.chatcmpl_converter import Converter
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from ctxcore.client import AsyncCtxcoreClient
from ctxcore.engine import ContextEngine
from ctxcore.errors import TruncateRefused, UnsupportedItemError
from ctxcore.integrations.openai_agents import CtxcoreSession, ctxcore_run_config
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK
from ctxcore.messages import AssistantMessage, SystemMessage, from_openai
from ctxcore.state import CompressionState, ConversationKey
from ctxcore.tokens import TiktokenCounter
from ctxcore.window import check_window
from tests.datasets import swe_runs
from tests.live_server import TOKEN, LiveApi, serve_api

pytestmark = pytest.mark.redis


class ReplayModel(Model):
    """Answers each call with the next recorded assistant turn; records what it was sent."""

    def __init__(self, turns: list[AssistantMessage]) -> None:
        self.turns = iter(turns)
        self.calls: list[tuple[str | None, list[Any], list[Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: Any,
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        n = len(self.calls)
        self.calls.append((system_instructions, list(input), list(tools)))
        turn = next(self.turns, None)
        text = turn.text if turn is not None else "Submitted."
        output: list[Any] = [
            ResponseOutputMessage(
                id=f"msg_{n}",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
        ]
        for call in turn.tool_calls if turn is not None else []:
            output.append(
                ResponseFunctionToolCall(
                    id=f"fc_{n}",
                    type="function_call",
                    call_id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                )
            )
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the replay is not streamed")


def _replay(run_id: str) -> tuple[str, str, list[AssistantMessage], Iterator[str], int]:
    run = next(r for r in swe_runs() if r["id"] == run_id)
    raw = from_openai(run["messages"])
    turns = [m for m in raw if isinstance(m, AssistantMessage)]
    outputs = iter([m.text for m in raw if m.role == "tool"])
    return raw[0].text, raw[1].text, turns, outputs, TiktokenCounter().count_messages(raw)


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[LiveApi]:
    api = serve_api(redis_url, worker=True)
    try:
        yield api
    finally:
        api.close()


def _input_tokens(
    counter: TiktokenCounter, instructions: str | None, items: list[Any], tools: list[Any]
) -> int:
    messages = from_openai(Converter.items_to_messages(items))
    system = [SystemMessage(content=instructions)] if instructions else []
    return counter.count_messages([*system, *messages]) + counter.count_tools(
        [dict(Converter.tool_to_openai(t)) for t in tools]
    )


async def _settled_cursor(client: AsyncCtxcoreClient, conv: str, quiet: float = 2.0) -> str | None:
    """The state's cursor once its version held still for ``quiet`` seconds (at most 60 s)."""
    deadline = time.monotonic() + 60
    version, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        state = await client.state(conv)
        if state.version != version:
            version, since = state.version, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return state.covered_until
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the state of {conv} kept changing for 60 s")


def test_runner_replaying_a_swe_run_within_budget_each_item_logged_once(live: LiveApi) -> None:
    instructions, task, turns, outputs, total = _replay("sympy__sympy-17655")
    assert sum(len(t.tool_calls) for t in turns) >= 60
    budget = total // 4
    conv = f"ag-{uuid.uuid4().hex[:8]}"

    @function_tool
    def bash(command: str) -> str:
        """Run a shell command."""
        return next(outputs)

    async def run() -> None:
        client = AsyncCtxcoreClient(live.url, TOKEN)
        session = CtxcoreSession(conv, client=client, budget_tokens=budget)
        model = ReplayModel(turns)
        agent = Agent(name="swe", instructions=instructions, tools=[bash], model=model)
        result = await Runner.run(
            agent, task, session=session, run_config=ctxcore_run_config(session), max_turns=len(turns) + 5
        )
        assert result.final_output == "Submitted."
        # Every model input is within the budget, first call to last, and a valid window
        counter = TiktokenCounter()
        assert len(model.calls) == len(turns) + 1 == session.windows
        sizes = [_input_tokens(counter, *call) for call in model.calls]
        assert max(sizes) <= budget, sizes
        for _, items, _ in model.calls:
            assert check_window(from_openai(Converter.items_to_messages(items))) == []
        assert any(ROUND_LEVEL_MEMORY_BLOCK in json.dumps(items) for _, items, _ in model.calls[-10:])
        # Each item is logged once: one log message per user input, model turn and tool output
        log = [m async for m in client.messages(conv)]
        assert len(log) == 1 + len(turns) + sum(len(t.tool_calls) for t in turns) + 1
        assert len({m.message_id for m in log}) == len(log)
        # The session gives back exactly the run's items
        assert await session.get_items() == json.loads(json.dumps(result.to_input_list()))
        assert await session.get_items(limit=2) == (await session.get_items())[-2:]
        # pop_item: the uncovered tail goes message by message, a model turn cannot be split.
        # The worker may still be compacting: wait until the state stops moving, then expect
        # what it covers (the newest step is never summarised, the step before may be).
        covered = await _settled_cursor(client, conv)
        final = await session.pop_item()
        assert final is not None and final["content"][0]["text"] == "Submitted."
        if covered is not None and covered >= (log[-2].context_message_id or ""):
            with pytest.raises(TruncateRefused) as behind:
                await session.pop_item()
            assert behind.value.reason == "covered"
            assert len([m async for m in client.messages(conv)]) == len(log) - 1
        else:
            output = await session.pop_item()
            assert output is not None and output["type"] == "function_call_output"
            with pytest.raises(TruncateRefused) as split:
                await session.pop_item()
            assert split.value.reason == "part_of_message"
            assert len([m async for m in client.messages(conv)]) == len(log) - 2
        await client.aclose()

    asyncio.run(run())


def test_pop_item_on_a_covered_message_and_on_an_empty_session(live: LiveApi) -> None:
    conv = f"ag-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        async with AsyncCtxcoreClient(live.url, TOKEN) as client:
            session = CtxcoreSession(conv, client=client, budget_tokens=4000)
            assert await session.pop_item() is None  # empty: nothing to pop
            await session.add_items([{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}])
            key = ConversationKey("acme", conv)
            covered = CompressionState(covered_until="000000000002", pinned=["000000000001", "000000000002"])
            assert live.runtime.state_store.save(key, covered, 0)
            with pytest.raises(TruncateRefused) as info:
                await session.pop_item()
            assert info.value.reason == "covered"
            assert len(await session.get_items()) == 2
            with pytest.raises(UnsupportedItemError, match="reasoning"):
                await session.add_items([{"type": "reasoning", "id": "rs_1", "summary": []}])
            await session.clear_session()
            assert await session.get_items() == []

    asyncio.run(run())


def test_embedded_session_over_an_async_model_context() -> None:
    _, task, turns, outputs, _ = _replay("sympy__sympy-17655")
    ctx = ContextEngine({"context_window_tokens": 6000}).create_async_context("embedded-run")
    session = CtxcoreSession("embedded-run", context=ctx)

    @function_tool
    def bash(command: str) -> str:
        """Run a shell command."""
        return next(outputs)[:2000]

    async def run() -> None:
        model = ReplayModel(turns[:3])
        agent = Agent(name="swe", instructions="Fix it.", tools=[bash], model=model)
        await Runner.run(agent, task[:500], session=session, run_config=ctxcore_run_config(session))
        raw = await ctx.get_raw_messages()
        assert [m.role for m in raw] == ["user", *["assistant", "tool"] * 3, "assistant"]
        assert await session.pop_item() is not None and len(await ctx.get_raw_messages()) == len(raw) - 1

    asyncio.run(run())
