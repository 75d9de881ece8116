"""100 model calls of the bundled mini-swe-agent runs through the proxy with the real
``openai`` SDK (streamed and not), then the same under upstream 500s, dropped connections,
replies slower than the SDK's timeout and responses lost on the way back, with the SDK's
default retries. Every upstream request must be within budget and a valid window holding
both anchors; the log must hold each message once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from ctxcore.messages import from_openai, to_openai
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import anchors
from ctxcore.window import check_window
from tests.datasets import swe_runs
from tests.live_server import TOKEN, LiveApi, serve_api

pytestmark = pytest.mark.redis

MODEL = "swe-agent-model"
WINDOW = 8_000
RESERVE = 2_000
BUDGET = WINDOW - RESERVE
CALLS = 100
# The SDK's timeout: for the call whose reply comes slower than it (the "slow" fault), and
# for every other call.
IMPATIENT = 3.0
PATIENT = 60.0
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run one shell command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@dataclass
class Step:
    """One recorded model turn and the messages the harness added after it."""

    reply: dict[str, Any]
    following: list[dict[str, Any]]


def recorded_runs() -> Iterator[tuple[list[dict[str, Any]], list[Step]]]:
    """Each bundled mini-swe-agent run: its first two messages and its steps."""
    for run in swe_runs():
        messages = run["messages"]
        steps: list[Step] = []
        for message in messages[2:]:
            if message["role"] == "assistant":
                # The recording's flat tool calls, as an OpenAI server sends them.
                reply = to_openai(from_openai([message]))[0]
                steps.append(Step({k: v for k, v in reply.items() if k in ("content", "tool_calls")}, []))
            elif steps:
                steps[-1].following.append(message)
        yield messages[:2], steps


class DroppingTransport(httpx.HTTPTransport):
    """Loses the next chat-completion response after the server sent it (``drop_next``)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop_next = False
        self.dropped = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.drop_next and request.url.path.endswith("/chat/completions"):
            self.drop_next = False
            self.dropped += 1
            response.read()
            response.close()
            raise httpx.ReadTimeout("the test dropped this response", request=request)
        return response


@dataclass
class Played:
    """What a replay did: per conversation the final history, per call the history sent and
    the upstream requests it caused."""

    conversations: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    calls: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(default_factory=list)
    faults: list[str | None] = field(default_factory=list)


def _reply_of(response: Any, stream: bool) -> dict[str, Any]:
    if not stream:
        message = response.choices[0].message.model_dump(exclude_none=True)
        return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in response:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["function"]["name"] = delta.function.name or call["function"]["name"]
                    call["function"]["arguments"] += delta.function.arguments or ""
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        reply["tool_calls"] = [calls[i] for i in sorted(calls)]
    return reply


def play(live: LiveApi, upstream: OpenAIServer, *, stream: bool, faults: bool = False) -> Played:
    """Run the recorded agents through the proxy until ``CALLS`` model calls."""
    transport = DroppingTransport()
    played = Played()
    calls = 0
    for head, steps in recorded_runs():
        conv = f"swe-{uuid.uuid4().hex[:8]}"
        client = openai.OpenAI(
            base_url=f"{live.url}/v1",
            api_key=TOKEN,
            default_headers={"X-Ctxcore-Conversation": conv},
            timeout=PATIENT,
            http_client=httpx.Client(transport=transport, timeout=PATIENT),
        )  # the SDK's default retries (2)
        history = list(head)
        answered = len(history)
        for step in steps:
            if calls == CALLS:
                break
            fault = (
                ("server_error", "disconnect", "slow", "drop")[(calls // 7) % 4]
                if faults and calls % 7 == 3
                else None
            )
            if fault in ("server_error", "disconnect"):
                upstream.push_fault(fault)
            if fault == "slow":  # answered after the SDK gave up; its retry gets the same reply
                upstream.push_reply(
                    step.reply.get("content"), step.reply.get("tool_calls"), delay=2 * IMPATIENT
                )
            transport.drop_next = fault == "drop"
            upstream.push_reply(step.reply.get("content"), step.reply.get("tool_calls"))
            before = upstream.request_count
            response = client.chat.completions.create(
                model=MODEL,
                messages=history,
                tools=TOOLS,
                max_tokens=RESERVE,
                stream=stream,  # type: ignore[arg-type, call-overload]
                # Only the slow reply's call gives up early; any other call waits out a busy
                # machine (a retry there reaches the upstream unscripted: it answered a
                # summary, once, in a full run on a loaded machine).
                timeout=IMPATIENT if fault == "slow" else PATIENT,
            )
            reply = _reply_of(response, stream)
            played.calls.append((list(history), upstream.requests[before:]))
            played.faults.append(fault)
            assert (reply.get("content") or None, reply.get("tool_calls")) == (
                step.reply.get("content") or None,
                step.reply.get("tool_calls"),
            )
            history.append(reply)
            answered = len(history)
            history += step.following
            calls += 1
        played.conversations.append((conv, history[:answered]))  # what the proxy saw
        client.close()
        if calls == CALLS:
            break
    assert calls == CALLS
    if faults:
        assert transport.dropped >= 3
    return played


def check(live: LiveApi, played: Played) -> None:
    counter = TiktokenCounter(MODEL)
    for history, requests in played.calls:
        assert requests, "every call reached the upstream at least once"
        sent_anchor_forms = None
        logged = from_openai(history[1:])
        for request in requests:
            sent = from_openai(request["messages"])
            assert request["tools"] == TOOLS and request["max_tokens"] == RESERVE
            assert counter.count_messages(sent) + counter.count_tools(request["tools"]) <= BUDGET
            assert check_window(sent) == []
            sent_anchor_forms = {json.dumps(m, sort_keys=True) for m in to_openai(sent)}
            for index in anchors(logged).indices():
                assert json.dumps(to_openai([logged[index]])[0], sort_keys=True) in sent_anchor_forms
    compacted = False
    for conv, history in played.conversations:
        log = live.runtime.log.read_after(ConversationKey("acme", conv), None)
        # Each message once, in order: the log is the client's history without its system message.
        assert to_openai(log) == to_openai(from_openai(history[1:]))
        assert len({m.message_id for m in log}) == len(log)
        compacted |= live.runtime.state_store.load(ConversationKey("acme", conv)) is not None
    total = max(counter.count_messages(from_openai(h)) for _, h in played.conversations)
    assert total > 2 * BUDGET  # the conversations really had to be compacted to fit
    assert compacted


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def live(redis_url: str, upstream: OpenAIServer) -> Iterator[LiveApi]:
    api = serve_api(
        redis_url,
        worker=True,
        proxy={"upstream_base_url": upstream.base_url, "context_window_tokens": {MODEL: WINDOW}},
        http={"requests_per_second": 1000, "burst": 1000},
    )
    try:
        yield api
    finally:
        api.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_100_turns_within_budget_valid_and_logged_once(
    live: LiveApi, upstream: OpenAIServer, stream: bool
) -> None:
    upstream.reset()
    played = play(live, upstream, stream=stream)
    assert sum(len(r) for _, r in played.calls) == CALLS  # no retries without faults
    check(live, played)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_100_turns_under_failures_log_each_message_once(
    live: LiveApi, upstream: OpenAIServer, stream: bool
) -> None:
    upstream.reset()
    played = play(live, upstream, stream=stream, faults=True)
    # A lost response is answered from the log (one upstream request); a 500, a dropped
    # connection and a reply slower than the SDK's timeout each cost a second one.
    expected = {None: 1, "drop": 1, "server_error": 2, "disconnect": 2, "slow": 2}
    assert [len(r) for _, r in played.calls] == [expected[f] for f in played.faults]
    assert {f for f in played.faults if f} == {"drop", "server_error", "disconnect", "slow"}
    check(live, played)
