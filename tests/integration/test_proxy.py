"""The OpenAI-compatible proxy (``POST /v1/chat/completions``) through the real ``openai`` SDK,
against the real app on a loopback port and the test server as the upstream."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ctxcore.messages import AssistantMessage, ToolMessage, UserMessage
from ctxcore.state import ConversationKey
from ctxcore.testing import OpenAIServer
from tests.chaos.processes import free_port
from tests.live_server import SLOW_TOKEN, TOKEN, LiveApi, live_api, serve_api

pytestmark = pytest.mark.redis

MODEL = "agent-model"
WINDOW = 6000
SYSTEM = {"role": "system", "content": "You are a careful agent."}
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIServer]:
    with OpenAIServer(timeout_delay=3.0) as server:
        yield server


@pytest.fixture(scope="module")
def live(redis_url: str, upstream: OpenAIServer) -> Iterator[LiveApi]:
    api = serve_api(
        redis_url,
        worker=False,
        proxy={"upstream_base_url": upstream.base_url, "context_window_tokens": {MODEL: WINDOW}},
        tenants={
            "slow": {
                "requests_per_second": 1,
                "proxy": {"context_window_tokens": {MODEL: WINDOW}},  # no upstream
            }
        },
    )
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def fresh(upstream: OpenAIServer) -> OpenAIServer:
    upstream.reset()
    return upstream


def sdk(live: LiveApi, conv: str | None, *, token: str = TOKEN, **kwargs: Any) -> openai.OpenAI:
    headers = {"X-Ctxcore-Conversation": conv} if conv else {}
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=token, default_headers=headers, **kwargs)


def conv_id() -> str:
    return f"px-{uuid.uuid4().hex[:10]}"


def logged(live: LiveApi, conv: str) -> list[Any]:
    return live.runtime.log.read_after(ConversationKey("acme", conv), None)


def _proxy_windows(live: LiveApi) -> float:
    """Windows the proxy served, from the API's ``/metrics``."""
    import urllib.request

    text = urllib.request.urlopen(f"{live.url}/metrics", timeout=5).read().decode()
    series = 'ctxcore_fast_path_seconds_count{fallback="false",route="proxy"} '
    return sum(float(line.removeprefix(series)) for line in text.splitlines() if line.startswith(series))


def test_two_turns_replace_messages_log_once_and_replay(live: LiveApi, fresh: OpenAIServer) -> None:
    conv = conv_id()
    windows = _proxy_windows(live)
    client = sdk(live, conv)
    fresh.push_reply("Let me look.", [CALL])
    first = [SYSTEM, {"role": "user", "content": "List the files."}]
    reply = client.chat.completions.create(model=MODEL, messages=first, tools=TOOLS, tool_choice="auto")  # type: ignore[arg-type]
    message = reply.choices[0].message
    assert message.tool_calls is not None and message.tool_calls[0].id == "call_1"
    sent = fresh.requests[-1]
    # System first, every other field forwarded unchanged, the ctxcore token never forwarded.
    assert sent["messages"][0] == SYSTEM and sent["tools"] == TOOLS and sent["tool_choice"] == "auto"
    assert sent["model"] == MODEL
    assert "live-token" not in str(fresh.headers[-1])
    log = logged(live, conv)
    assert [type(m) for m in log] == [UserMessage, AssistantMessage]  # the system message is never logged

    second = [
        *first,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"},
    ]
    fresh.push_text("Two files.")
    assert (
        client.chat.completions.create(model=MODEL, messages=second).choices[0].message.content
        == "Two files."
    )  # type: ignore[arg-type]
    log = logged(live, conv)
    assert [type(m) for m in log] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    calls = fresh.request_count

    # The client never got the reply: the same request is answered from the log.
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=second)  # type: ignore[arg-type]
    assert raw.headers["x-ctxcore-replayed"] == "true"
    assert raw.parse().choices[0].message.content == "Two files."
    assert fresh.request_count == calls and len(logged(live, conv)) == 4
    # Streamed, the replay is the same reply.
    stream = client.chat.completions.create(model=MODEL, messages=second, stream=True)  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Two files."
    assert fresh.request_count == calls

    # Client-side trimming: the request may omit a prefix of the log.
    third = [
        SYSTEM,
        *second[3:],
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "Thanks"},
    ]
    fresh.push_text("You are welcome.")
    client.chat.completions.create(model=MODEL, messages=third)  # type: ignore[arg-type]
    log = logged(live, conv)
    assert len(log) == 6 and log[4].text == "Thanks" and log[5].text == "You are welcome."
    # Three windows served on the fast path (the replays served none).
    assert _proxy_windows(live) == windows + 3


def test_a_diverging_history_is_a_400_naming_the_index(live: LiveApi, fresh: OpenAIServer) -> None:
    conv = conv_id()
    client = sdk(live, conv)
    fresh.push_text("one")
    client.chat.completions.create(model=MODEL, messages=[SYSTEM, {"role": "user", "content": "first"}])
    edited = [
        SYSTEM,
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "not what you said"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=edited)  # type: ignore[arg-type]
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "history_diverged" and error["param"] == "messages[2]"
    assert "000000000002" in error["message"]
    assert len(logged(live, conv)) == 2  # nothing appended


def _status(call: Any) -> tuple[int, dict[str, Any]]:
    try:
        call()
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return exc.status_code, body
    raise AssertionError("expected an error status")


def test_bad_input_gets_openai_style_errors(live: LiveApi, fresh: OpenAIServer) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    conv = conv_id()
    client = sdk(live, conv)
    cases = {
        "no header": (
            lambda: sdk(live, None).chat.completions.create(model=MODEL, messages=messages),
            400,
            "missing_conversation",
        ),
        "bad header": (
            lambda: sdk(live, "no/slashes").chat.completions.create(model=MODEL, messages=messages),
            400,
            "invalid_conversation",
        ),
        "n=2": (
            lambda: client.chat.completions.create(model=MODEL, messages=messages, n=2),
            400,
            "invalid_value",
        ),
        "unknown model": (
            lambda: client.chat.completions.create(model="mystery-8k", messages=messages),
            400,
            "unknown_model_window",
        ),
        "max_tokens": (
            lambda: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=WINDOW),
            400,
            "invalid_value",
        ),
        "bad token": (
            lambda: sdk(live, conv, token="nope").chat.completions.create(model=MODEL, messages=messages),
            401,
            "invalid_api_key",
        ),
        "no upstream": (
            lambda: sdk(live, conv, token=SLOW_TOKEN).chat.completions.create(model=MODEL, messages=messages),
            404,
            "proxy_not_configured",
        ),
        "budget": (
            lambda: client.chat.completions.create(
                model=MODEL, messages=[{"role": "system", "content": "word " * 7000}, *messages]
            ),
            400,
            "context_length_exceeded",
        ),
    }
    for name, (call, status, code) in cases.items():
        got, body = _status(call)
        assert (got, body.get("code")) == (status, code), (name, body)
        assert set(body) == {"message", "type", "param", "code"}, name
    _, body = _status(lambda: client.chat.completions.create(model="mystery-8k", messages=messages))
    assert "proxy.context_window_tokens" in body["message"]
    _, body = _status(
        lambda: sdk(live, conv, token=SLOW_TOKEN).chat.completions.create(model=MODEL, messages=messages)
    )
    assert "tenants.slow.proxy.upstream_base_url" in body["message"]
    assert fresh.request_count == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="hi")


def test_upstream_errors_timeouts_and_refusals(live: LiveApi, fresh: OpenAIServer, redis_url: str) -> None:
    conv = conv_id()
    messages: Any = [SYSTEM, {"role": "user", "content": "hello"}]
    # A 500 is returned as is; the SDK's default retries then succeed; each message once.
    fresh.push_fault("server_error")
    fresh.push_text("hi there")
    reply = sdk(live, conv, max_retries=2).chat.completions.create(model=MODEL, messages=messages)
    assert reply.choices[0].message.content == "hi there" and fresh.request_count == 2
    assert [m.text for m in logged(live, conv)] == ["hello", "hi there"]
    # An upstream error status passes through unchanged, messages kept, no reply appended.
    follow: Any = [
        *messages,
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "more"},
    ]
    fresh.push_fault("bad_request")
    status, body = _status(lambda: sdk(live, conv).chat.completions.create(model=MODEL, messages=follow))
    assert status == 400 and body["param"] == "temperature"
    assert [m.text for m in logged(live, conv)] == ["hello", "hi there", "more"]

    # A refused connection is a 502; a timeout a 504 (messages kept).
    port = free_port()
    with live_api(
        redis_url,
        worker=False,
        proxy={"upstream_base_url": f"http://127.0.0.1:{port}/v1", "context_window_tokens": {MODEL: WINDOW}},
    ) as dead:
        status, body = _status(
            lambda: sdk(dead, conv).chat.completions.create(model=MODEL, messages=messages)
        )
        assert (status, body["code"]) == (502, "upstream_unreachable")
    with live_api(
        redis_url,
        worker=False,
        proxy={
            "upstream_base_url": fresh.base_url,
            "context_window_tokens": {MODEL: WINDOW},
            "upstream_timeout": 0.5,
        },
    ) as impatient:
        fresh.push_fault("timeout", delay=1.5)
        status, body = _status(
            lambda: sdk(impatient, conv).chat.completions.create(model=MODEL, messages=messages)
        )
        assert (status, body["code"]) == (504, "upstream_timeout")
        assert [m.text for m in impatient.runtime.log.read_after(ConversationKey("acme", conv), None)] == [
            "hello"
        ]


def test_streaming_relays_and_logs_the_assembled_reply(live: LiveApi, fresh: OpenAIServer) -> None:
    conv = conv_id()
    client = sdk(live, conv)
    fresh.push_reply("Checking the directory listing first.", [CALL])
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[SYSTEM, {"role": "user", "content": "go"}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None  # the upstream's usage chunk is relayed
    log = logged(live, conv)
    assert isinstance(log[-1], AssistantMessage) and log[-1].text == "Checking the directory listing first."
    assert [c.model_dump() for c in log[-1].tool_calls] == [
        {"id": "call_1", "name": "bash", "arguments": '{"command": "ls"}', "type": "function"}
    ]
    # A stream cut mid-way ends the client's stream with an error; the partial reply is not logged.
    follow: Any = [
        SYSTEM,
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Checking the directory listing first.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    fresh.push_fault("stream_cut")
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model=MODEL, messages=follow, stream=True))
    assert [type(m) for m in logged(live, conv)] == [UserMessage, AssistantMessage, ToolMessage]
    # The client retries: the same request goes upstream again and its reply is logged.
    fresh.push_text("Found a.txt.")
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model=MODEL, messages=follow, stream=True)
        if c.choices
    )
    assert text == "Found a.txt." and logged(live, conv)[-1].text == "Found a.txt."


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_tool_call_reply_without_content_echoed_back_any_way_matches(
    live: LiveApi, fresh: OpenAIServer, stream: bool
) -> None:
    conv = conv_id()
    client = sdk(live, conv)
    fresh.push_reply(None, [CALL])
    history: Any = [SYSTEM, {"role": "user", "content": "go"}]
    response = client.chat.completions.create(model=MODEL, messages=history, stream=stream)  # type: ignore[call-overload]
    if stream:
        list(response)
    logged_reply = logged(live, conv)[-1]
    assert isinstance(logged_reply, AssistantMessage) and not logged_reply.content
    for echoed in (
        {"role": "assistant", "tool_calls": [CALL]},  # model_dump(exclude_none=True)
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ):
        fresh.push_text("ok")
        tail: Any = [echoed, {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}]
        client.chat.completions.create(model=MODEL, messages=[*history, *tail])
        assert len(logged(live, conv)) == 4  # user, call, result, reply: nothing diverged or doubled


def test_rejected_messages_rate_limits_and_interrupted_calls(
    live: LiveApi, fresh: OpenAIServer, redis_url: str
) -> None:
    conv = conv_id()
    client = sdk(live, conv)
    orphan: Any = [
        SYSTEM,
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "nope", "content": "x"},
    ]
    status, body = _status(lambda: client.chat.completions.create(model=MODEL, messages=orphan))
    assert (status, body["param"]) == (400, "messages[2]") and "orphan_tool_result" in body["message"]
    # An unanswered call followed by a user message is an interrupted step: accepted.
    fresh.push_text("fine")
    interrupted: Any = [
        SYSTEM,
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": "Running.", "tool_calls": [CALL]},
        {"role": "user", "content": "stop, do something else"},
    ]
    assert (
        client.chat.completions.create(model=MODEL, messages=interrupted).choices[0].message.content == "fine"
    )
    assert len(logged(live, conv)) == 4
    # The tenant's rate limit: 429 with Retry-After, OpenAI-shaped.
    proxy = {"upstream_base_url": fresh.base_url, "context_window_tokens": {MODEL: WINDOW}}
    with live_api(
        redis_url, worker=False, proxy=proxy, http={"burst": 1, "requests_per_second": 0.1}
    ) as strict:
        limited = sdk(strict, conv)
        _status(lambda: limited.chat.completions.create(model=MODEL, messages=orphan))
        with pytest.raises(openai.RateLimitError) as info:
            limited.chat.completions.create(model=MODEL, messages=orphan)
        assert info.value.code == "rate_limited" and int(info.value.response.headers["retry-after"]) >= 1
