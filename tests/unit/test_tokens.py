"""Token counting equals tiktoken's encode and works with downloads made impossible."""

from __future__ import annotations

import base64
import logging
import struct
import zlib

import pytest
import tiktoken.load

from ctxcore import token_encodings
from ctxcore.messages import AssistantMessage, ToolCall, UserMessage
from ctxcore.tokens import (
    EstimateCounter,
    TiktokenCounter,
    WarnOnce,
    encoding_for_model,
    image_tokens_for_size,
    load_encoding,
)

SAMPLES = {
    "english": "The quick brown fox jumps over the lazy dog, twice, on 12 May 2024.",
    "code": "def f(x: int) -> int:\n    return [i * 2 for i in range(x) if i % 3]\n",
    "json": '{"reservation_id": "ZFA04Y", "flights": [{"origin": "SFO", "price": 123.45}], "ok": true}',
    "chinese": "你收到一条消息：请帮我预订明天从北京到上海的航班。",
    "special": "before <|endoftext|> after <|fim_prefix|>",
}


@pytest.mark.parametrize("model", [None, "gpt-4", "gpt-4o", "gpt-5"])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_count_text_equals_encode(model: str | None, name: str) -> None:
    counter = TiktokenCounter(model)
    enc = load_encoding(counter.encoding_name)
    text = SAMPLES[name]
    assert counter.count_text(text) == len(enc.encode(text, disallowed_special=()))
    assert counter.count_text(text) > 0


def test_encoding_choice() -> None:
    assert encoding_for_model(None) == "cl100k_base"
    assert encoding_for_model("gpt-4") == "cl100k_base"
    assert encoding_for_model("gpt-4o-mini") == "o200k_base"
    assert encoding_for_model("openai/gpt-5") == "o200k_base"
    assert encoding_for_model("some-local-model") == "cl100k_base"


def test_an_unknown_model_warns_once_naming_the_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(token_encodings, "UNKNOWN_MODELS", WarnOnce(1024))
    with caplog.at_level(logging.WARNING, logger="ctxcore.tokens"):
        for _ in range(3):
            assert encoding_for_model("acme/llama-local") == "cl100k_base"
            assert encoding_for_model("text-davinci-003") == "cl100k_base"  # p50k_base: not shipped
            assert encoding_for_model("gpt-4o") == "o200k_base"
            assert encoding_for_model("gpt-4") == "cl100k_base"
            TiktokenCounter("acme/llama-local")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "model name 'acme/llama-local' is not a known model: counting tokens with cl100k_base",
        "model name 'text-davinci-003' uses p50k_base, which ctxcore does not ship: counting tokens with cl100k_base",
    ]


def test_the_warned_names_are_bounded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    warned = WarnOnce(5)
    monkeypatch.setattr(token_encodings, "UNKNOWN_MODELS", warned)
    with caplog.at_level(logging.WARNING, logger="ctxcore.tokens"):
        for n in range(50):
            encoding_for_model(f"local-model-{n}" + "x" * 1000)
    assert len(warned._names) == 5 and all(len(name) <= 200 for name in warned._names)
    assert len(caplog.records) == 6 and "further ones are not logged" in caplog.records[-1].getMessage()


def test_works_when_downloads_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("tried to download a BPE file")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", no_network)
    load_encoding.cache_clear()
    try:
        assert TiktokenCounter("gpt-4o").count_text("hello world") == 2
        assert TiktokenCounter().count_text("hello world") == 2
    finally:
        load_encoding.cache_clear()


def test_message_framing_and_priming() -> None:
    counter = TiktokenCounter()
    msg = UserMessage(content="hello world")
    framed = counter.count_text("<|start|>user\nhello world<|end|>")
    assert counter.count_messages([msg]) == framed + 3
    assert counter.count_messages([msg, msg]) == 2 * framed + 3
    assert counter.count_messages([]) == 0


def test_tool_calls_are_counted() -> None:
    counter = TiktokenCounter()
    plain = AssistantMessage(content="x")
    calling = AssistantMessage(
        content="x", tool_calls=[ToolCall(id="c1", name="search", arguments='{"q": "flights"}')]
    )
    assert counter.count_messages([calling]) > counter.count_messages([plain]) + 5


def test_tools_counted() -> None:
    counter = TiktokenCounter()
    tool = {
        "type": "function",
        "function": {"name": "get_user", "description": "Look up a user", "parameters": {}},
    }
    assert counter.count_tools([tool]) > counter.count_tools([]) == 0
    assert counter.count_tools([tool, tool]) > counter.count_tools([tool])


def test_cache_returns_same_count_for_equal_content() -> None:
    counter = TiktokenCounter()
    a = UserMessage(content="x" * 1000)
    b = UserMessage(content="x" * 1000, metadata={"other": True})
    assert counter.count_messages([a]) == counter.count_messages([b])


def _png(width: int, height: int) -> str:
    header = (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + b"IHDR"
        + struct.pack(">II", width, height)
        + b"\x08\x02\x00\x00\x00"
    )
    header += struct.pack(">I", zlib.crc32(header[12:29]))
    return base64.b64encode(header).decode()


def test_images_priced_by_dimensions() -> None:
    counter = TiktokenCounter()

    def image_msg(url: str, detail: str = "auto") -> UserMessage:
        return UserMessage(content=[{"type": "image_url", "image_url": {"url": url, "detail": detail}}])

    small = counter.count_messages([image_msg(f"data:image/png;base64,{_png(512, 512)}")])
    large = counter.count_messages([image_msg(f"data:image/png;base64,{_png(2048, 2048)}")])
    low = counter.count_messages([image_msg(f"data:image/png;base64,{_png(2048, 2048)}", "low")])
    unknown = counter.count_messages([image_msg("https://example.invalid/x.png")])
    base = counter.count_messages([UserMessage(content=[])])
    assert small - base == image_tokens_for_size(512, 512) == 361  # 19x19 patches beat one tile (255)
    assert large - base == image_tokens_for_size(2048, 2048) == 1568  # patch cap beats 4 tiles (765)
    assert low - base == 85
    assert unknown - base == 1445


def test_data_urls_do_not_count_as_text() -> None:
    counter = TiktokenCounter()
    blob = "A" * 100_000
    msg = UserMessage(content=f"look data:image/png;base64,{blob}")
    assert counter.count_messages([msg]) < 30


def test_estimate_counter_is_len_over_four() -> None:
    counter = EstimateCounter()
    assert counter.count_text("abcdefgh") == 2
    assert counter.count_text("") == 0
