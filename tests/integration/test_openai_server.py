"""OpenAIChatModel and CompressionExecutor against a real local OpenAI-compatible server.

Every request goes through the official ``openai`` client over a TCP socket, so status
codes, headers, bodies and timeouts are exactly what a provider would send.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ctxcore.errors import ConfigError, CtxcoreError
from ctxcore.messages import SystemMessage, UserMessage
from ctxcore.summarize import CompressionExecutor, ModelCallError, OpenAIChatModel, Usage
from ctxcore.testing import FAULT_KINDS, OpenAIServer
from ctxcore.tokens import EstimateCounter

MESSAGES = [SystemMessage(content="You summarise."), UserMessage(content="Summarise: the cache is cold.")]
# Replies that should arrive get a timeout with room for a loaded machine; only where the
# script holds a "timeout" fault (answered after TIMEOUT_FAULT_DELAY) does the client give up
# early: a timeout is a lower bound, so a busy machine cannot make that one flaky.
TIMEOUT = 10.0
FAULT_TIMEOUT = 2.0
TIMEOUT_FAULT_DELAY = 4 * FAULT_TIMEOUT


def timeout_for(fault: str) -> float:
    """The client timeout of a test whose script holds ``fault``."""
    return FAULT_TIMEOUT if fault == "timeout" else TIMEOUT


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(timeout_delay=TIMEOUT_FAULT_DELAY) as srv:
        yield srv


@pytest.fixture
def fresh(server: OpenAIServer) -> OpenAIServer:
    server.reset()
    return server


@pytest.fixture
def model(fresh: OpenAIServer, request: pytest.FixtureRequest) -> Iterator[OpenAIChatModel]:
    callspec = getattr(request.node, "callspec", None)
    fault = str(callspec.params.get("fault", "")) if callspec else ""
    with OpenAIChatModel(fresh.base_url, model="test-model", timeout=timeout_for(fault)) as client:
        yield client


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


# --- the model client -------------------------------------------------------------------------


def test_text_and_usage(fresh: OpenAIServer, model: OpenAIChatModel) -> None:
    fresh.push_text(
        "the cache is cold", usage={"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}
    )
    result = model.complete(MESSAGES, max_tokens=64)
    assert result.text == "the cache is cold"
    assert result.usage == Usage(21, 5, 26, calls=1, model="test-model")
    body = fresh.requests[0]
    assert body["model"] == "test-model" and body["max_tokens"] == 64 and body["temperature"] == 0.0
    assert body["messages"] == [
        {"role": "system", "content": "You summarise."},
        {"role": "user", "content": "Summarise: the cache is cold."},
    ]


def test_default_responder_and_estimated_usage(fresh: OpenAIServer, model: OpenAIChatModel) -> None:
    result = model.complete(MESSAGES, max_tokens=64)
    assert result.text.startswith("Summary of 5 words: Summarise: the cache is cold.")
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    # Local servers need no key; the client still sends a placeholder, never the environment's.
    assert fresh.headers[0]["authorization"] == "Bearer unused"


def test_custom_responder_sees_the_request() -> None:
    with OpenAIServer(responder=lambda req: f"n={len(req['messages'])}") as srv:
        with OpenAIChatModel(srv.base_url, max_tokens=10) as client:
            assert client.complete(MESSAGES, max_tokens=500).text == "n=2"
        assert srv.requests[0]["max_tokens"] == 10  # the client cap wins


@pytest.mark.parametrize(
    ("fault", "kind", "status"),
    [
        ("rate_limit", "rate_limit", 429),
        ("server_error", "server_unstable", 500),
        ("unavailable", "server_unstable", 503),
        ("too_large", "context_overflow", 413),
        ("overflow", "context_overflow", 400),
        ("auth", "authentication", 401),
        ("bad_request", "api_request_error", 400),
        ("timeout", "timeout", None),
        ("disconnect", "server_unstable", None),
        ("invalid_json", "unknown", None),
        ("empty", "unknown", None),
    ],
)
def test_fault_kinds(
    fresh: OpenAIServer, model: OpenAIChatModel, fault: str, kind: str, status: int | None
) -> None:
    fresh.push_fault(fault)
    with pytest.raises(ModelCallError) as info:
        model.complete(MESSAGES, max_tokens=64)
    assert info.value.kind == kind
    assert info.value.status_code == status
    assert info.value.attempts == 0  # a bare client never retries


def test_rate_limit_retry_after_is_parsed(fresh: OpenAIServer, model: OpenAIChatModel) -> None:
    fresh.push_fault("rate_limit", retry_after=7)
    with pytest.raises(ModelCallError) as info:
        model.complete(MESSAGES, max_tokens=64)
    assert info.value.retry_after == 7.0


def test_wrong_block_ids_is_a_normal_completion(fresh: OpenAIServer, model: OpenAIChatModel) -> None:
    # The transport is fine; spotting unknown ids is the caller's job.
    fresh.push_fault("wrong_block_ids", block_ids=("zzz",))
    text = model.complete(MESSAGES, max_tokens=64).text
    assert [b["block_id"] for b in json.loads(text)["blocks"]] == ["zzz"]


def test_the_api_key_is_sent_and_never_leaks_into_errors(fresh: OpenAIServer) -> None:
    key = "sk-test-abcdefghijklmnopqrstuvwxyz"
    fresh.push_fault("auth", message=f"Incorrect API key provided: {key}")
    with (
        OpenAIChatModel(fresh.base_url, api_key=key, timeout=TIMEOUT) as client,
        pytest.raises(ModelCallError) as info,
    ):
        client.complete(MESSAGES, max_tokens=8)
    assert fresh.headers[0]["authorization"] == f"Bearer {key}"
    assert key not in str(info.value)


def test_delay_applies_to_every_reply() -> None:
    with (
        OpenAIServer(delay=0.5) as srv,
        OpenAIChatModel(srv.base_url, timeout=0.2) as client,
        pytest.raises(ModelCallError) as info,
    ):
        client.complete(MESSAGES, max_tokens=8)
    assert info.value.kind == "timeout"


def test_unknown_fault_and_unknown_route(fresh: OpenAIServer) -> None:
    with pytest.raises(ConfigError, match="unknown fault 'gremlins'; expected one of"):
        fresh.push_fault("gremlins")
    with pytest.raises(CtxcoreError, match=r"not running; call start\(\)"):
        _ = OpenAIServer().port
    with urllib.request.urlopen(f"{fresh.base_url}/models", timeout=2) as resp:
        assert json.load(resp)["data"][0]["id"] == fresh.model
    request = urllib.request.Request(f"{fresh.base_url}/embeddings", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=2)
    assert info.value.code == 404


def test_requests_are_recorded_under_concurrency(fresh: OpenAIServer) -> None:
    def worker(n: int) -> None:
        with OpenAIChatModel(fresh.base_url, timeout=5) as client:
            client.complete([UserMessage(content=f"request {n}")], max_tokens=8)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = sorted(r["messages"][0]["content"] for r in fresh.requests)
    assert seen == sorted(f"request {n}" for n in range(8))
    assert fresh.pending == 0


# --- the executor over the wire ------------------------------------------------------------------


def run(server: OpenAIServer, fault: str = "", **kwargs: object) -> tuple[CompressionExecutor, Sleeps]:
    sleeps = Sleeps()
    client = OpenAIChatModel(server.base_url, model="test-model", timeout=timeout_for(fault))
    return CompressionExecutor(client, EstimateCounter(), sleep=sleeps, **kwargs), sleeps  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("rate_limit", "rate_limit"),
        ("server_error", "server_unstable"),
        ("unavailable", "server_unstable"),
        ("timeout", "timeout"),
        ("invalid_json", "unknown"),
        ("disconnect", "server_unstable"),
    ],
)
def test_transient_faults_three_calls_then_give_up(fresh: OpenAIServer, fault: str, kind: str) -> None:
    for _ in range(3):
        fresh.push_fault(fault, retry_after=0)
    fresh.push_text("never reached")
    ex, sleeps = run(fresh, fault)
    with pytest.raises(ModelCallError) as info:
        ex.execute(MESSAGES, max_tokens=32)
    assert info.value.kind == kind and info.value.attempts == 3
    assert fresh.request_count == 3 and ex.calls == 3
    assert sleeps == [0.05, 0.1]


@pytest.mark.parametrize("fault", ["rate_limit", "server_error", "timeout", "empty"])
def test_transient_fault_then_success(fresh: OpenAIServer, fault: str) -> None:
    fresh.push_fault(fault, retry_after=0)
    fresh.push_text("recovered", usage={"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10})
    ex, sleeps = run(fresh, fault)
    result = ex.execute(MESSAGES, max_tokens=32)
    assert result.text == "recovered"
    assert result.usage.calls == 2 and result.usage.input_tokens == 9
    assert fresh.request_count == 2 and sleeps == [0.05]


def test_retry_after_from_the_server_is_honoured(fresh: OpenAIServer) -> None:
    fresh.push_fault("rate_limit", retry_after=4)
    fresh.push_text("ok")
    ex, sleeps = run(fresh)
    ex.execute(MESSAGES, max_tokens=32)
    assert sleeps == [4.0]


@pytest.mark.parametrize("fault", ["overflow", "too_large"])
def test_overflow_shrinks_in_order_up_to_four_calls(fresh: OpenAIServer, fault: str) -> None:
    for _ in range(4):
        fresh.push_fault(fault)
    ex, sleeps = run(fresh)
    ratios: list[float] = []

    def shrink(ratio: float) -> tuple[list[UserMessage], None]:
        ratios.append(ratio)
        return [UserMessage(content=f"shrunk to {ratio}")], None

    with pytest.raises(ModelCallError) as info:
        ex.execute(MESSAGES, max_tokens=32, shrink=shrink)
    assert info.value.kind == "context_overflow" and info.value.attempts == 4
    assert ratios == [0.85, 0.65, 0.5]
    assert [r["messages"][0]["content"] for r in fresh.requests[1:]] == [
        "shrunk to 0.85",
        "shrunk to 0.65",
        "shrunk to 0.5",
    ]
    assert sleeps == []


def test_overflow_then_success_after_one_shrink(fresh: OpenAIServer) -> None:
    fresh.push_fault("overflow")
    fresh.push_text("fits now")
    ex, _ = run(fresh)
    result = ex.execute(MESSAGES, max_tokens=32, shrink=lambda r: ([UserMessage(content="short")], None))
    assert result.text == "fits now" and fresh.request_count == 2


@pytest.mark.parametrize(
    ("fault", "kind"), [("auth", "authentication"), ("bad_request", "api_request_error")]
)
def test_permanent_faults_exactly_one_call(fresh: OpenAIServer, fault: str, kind: str) -> None:
    fresh.push_fault(fault)
    fresh.push_text("never reached")
    ex, sleeps = run(fresh)
    with pytest.raises(ModelCallError) as info:
        ex.execute(MESSAGES, max_tokens=32, shrink=lambda r: (MESSAGES, None))
    assert info.value.kind == kind and info.value.attempts == 1
    assert fresh.request_count == 1 and sleeps == []


def test_workers_mode_leaves_retries_to_the_queue(fresh: OpenAIServer) -> None:
    fresh.push_fault("unavailable")
    fresh.push_text("never reached")
    ex, sleeps = run(fresh, retry_transient=False)
    with pytest.raises(ModelCallError) as info:
        ex.execute(MESSAGES, max_tokens=32)
    assert info.value.kind == "server_unstable" and fresh.request_count == 1 and sleeps == []


def test_every_fault_kind_is_covered() -> None:
    covered = {
        "rate_limit",
        "server_error",
        "unavailable",
        "too_large",
        "overflow",
        "auth",
        "bad_request",
        "timeout",
        "invalid_json",
        "empty",
        "wrong_block_ids",
        "disconnect",
        "stream_cut",  # test_stream_cut_ends_the_stream_with_an_error
    }
    assert covered == FAULT_KINDS


# --- the command line ----------------------------------------------------------------------------


def test_cli_serves_until_stopped() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxcore.testing.openai_server", "--port", "0", "--delay", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        base_url = line.split(" at ", 1)[1].split(" ", 1)[0]
        with OpenAIChatModel(base_url, timeout=5) as client:
            assert client.complete(MESSAGES, max_tokens=8).text.startswith("Summary of")
    finally:
        proc.terminate()
        proc.wait(timeout=5)


# --- streaming and scripted tool calls, through the real openai SDK -----------------------

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "bash", "arguments": '{"command": "ls -la /tmp"}'},
}


def _sdk(server: OpenAIServer) -> Any:
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT)


def test_scripted_tool_call_reply_non_streamed(fresh: OpenAIServer) -> None:
    fresh.push_reply("Let me look.", [CALL])
    reply = _sdk(fresh).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    message = reply.choices[0].message
    assert message.content == "Let me look." and reply.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None and message.tool_calls[0].model_dump() == CALL


def test_streamed_reply_assembles_content_tool_calls_and_usage(fresh: OpenAIServer) -> None:
    fresh.push_reply("A long enough answer to need several pieces of content.", [CALL])
    stream = _sdk(fresh).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(
        t.function.arguments or "" for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []
    )
    assert content == "A long enough answer to need several pieces of content."
    assert arguments == CALL["function"]["arguments"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    # Without include_usage there is no usage chunk; text replies stream as well.
    fresh.push_text("plain")
    plain = list(
        _sdk(fresh).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert (
        all(c.usage is None for c in plain)
        and "".join(c.choices[0].delta.content or "" for c in plain) == "plain"
    )


def test_stream_cut_ends_the_stream_with_an_error(fresh: OpenAIServer) -> None:
    import openai

    fresh.push_fault("stream_cut")
    stream = _sdk(fresh).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError):
        list(stream)
