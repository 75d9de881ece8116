"""MessageSummaryOffloader, rule-based (spec 4.10 / 8.3) and its content rules."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, message_text
from ctxcore.processors import MessageSummaryOffloaderConfig
from ctxcore.processors.content_rules import ContentType, RuleBudget, compress, detect
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.processors.summary_offloader import MIN_BODY_CHARS
from ctxcore.state.filesystem import FilesystemOffloadStore
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.tokens import CounterBase


class MetaCounter(CounterBase):
    """Counts ``metadata["test_token_count"]`` when present, else characters / 4."""

    def count_text(self, text: str) -> int:
        return len(text) // 4

    def count_message(self, message: AnyMessage) -> int:
        return int(message.metadata.get("test_token_count", len(message_text(message)) // 4))

    def count_messages(self, messages: Sequence[AnyMessage]) -> int:
        return sum(self.count_message(m) for m in messages)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        return 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailingStore(MemoryOffloadStore):
    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        raise OSError("read-only")


def offloader_context(
    store: Any = None, clock: Clock | None = None, context_window: int = 100, **config: Any
) -> ModelContext:
    eng = ContextEngine(
        {"strict_processors": True, "context_window_tokens": context_window},
        offload_store=store or MemoryOffloadStore(),
        clock=clock or Clock(),
    )
    return eng.create_context(
        "c", "s", processors=[("MessageSummaryOffloader", config)], token_counter=MetaCounter()
    )


def tool(
    content: str, tokens: int | None = None, name: str = "bash", call_id: str = "1", args: str = "{}"
) -> list[AnyMessage]:
    metadata = {"test_token_count": tokens} if tokens is not None else {}
    return [
        AssistantMessage(content="", tool_calls=[ToolCall(id=call_id, name=name, arguments=args)]),
        ToolMessage(content=content, tool_call_id=call_id, metadata=metadata),
    ]


def marker(message: AnyMessage) -> re.Match[str] | None:
    return OFFLOAD_MARKER_RE.search(message_text(message))


LOG = "\n".join(
    [
        "$ pytest -q",
        *[f"tests/test_mod.py::test_ok_{i} PASSED" for i in range(80)],
        "tests/test_mod.py::test_broken FAILED",
        "E       AssertionError: expected 3 got 4",
        *[f"progress line {i}" for i in range(40)],
        "=========== 1 failed, 80 passed in 2.31s ===========",
    ]
)


def test_config_has_exactly_its_fields_with_reference_defaults() -> None:
    config = MessageSummaryOffloaderConfig()
    assert config.model_dump() == {
        "add_message_threshold_ratio": 0.1,
        "ttl_seconds": 300,
        "ttl_context_occupancy_ratio": 0.5,
        "ttl_message_threshold_ratio": 0.05,
        "protected_tool_names": ("read_file",),
    }


def test_add_trigger_is_strictly_above_the_token_threshold() -> None:
    at = offloader_context()
    at.add_messages([UserMessage(content="go"), *tool("a" * 200, tokens=10)])
    assert at.get_messages()[2].content == "a" * 200 and at.compression_states == []
    above = offloader_context()
    above.add_messages([UserMessage(content="go"), *tool("a" * 200, tokens=11)])
    assert marker(above.get_messages()[2])


def test_a_result_sent_as_text_parts_is_handled_as_its_text() -> None:
    # OpenHands and LiteLLM's Anthropic route send every content as a list of parts.
    as_text = offloader_context()
    as_text.add_messages([UserMessage(content="go"), *tool(LOG, tokens=40)])
    as_parts = offloader_context()
    step = tool(LOG, tokens=40)
    parts = step[1].model_copy(update={"content": [{"type": "text", "text": LOG}]})
    as_parts.add_messages([UserMessage(content="go"), step[0], parts])
    text, from_parts = as_text.get_messages()[2], as_parts.get_messages()[2]
    assert marker(from_parts) and "test_broken FAILED" in message_text(from_parts)
    assert OFFLOAD_MARKER_RE.sub("", message_text(from_parts)) == OFFLOAD_MARKER_RE.sub(
        "", message_text(text)
    )


def test_a_small_result_under_the_character_budget_is_offloaded_plainly_with_its_text() -> None:
    ctx = offloader_context()
    text = "r" * 61  # 15 tokens > 10, but rules are skipped: 61 chars > 40 only by a little
    ctx.add_messages([UserMessage(content="go"), *tool(text)])
    result = ctx.get_messages()[2]
    assert str(result.content).startswith("r" * 61 + "\n[[OFFLOAD: handle=")
    assert ctx.reload(marker(result).group(1))[0].content == text  # type: ignore[union-attr]


def test_rule_compression_offloads_the_original_and_ends_with_the_marker() -> None:
    ctx = offloader_context(context_window=1000)
    ctx.add_messages([UserMessage(content="why does test_broken fail"), *tool(LOG)])
    result = ctx.get_messages()[2]
    text = str(result.content)
    assert "test_broken FAILED" in text and "AssertionError: expected 3 got 4" in text
    assert "1 failed, 80 passed" in text
    assert OFFLOAD_MARKER_RE.search(text.splitlines()[-1])
    assert result.metadata["rule_compression_pass"] == "add"
    assert result.metadata["rule_compression_type"] == "log"
    assert len(text) <= 4000 + 80
    assert ctx.reload(marker(result).group(1))[0].content == LOG  # type: ignore[union-attr]


def test_a_placeholder_over_budget_is_cut_head_and_tail_keeping_the_marker(tmp_path: Path) -> None:
    ctx = offloader_context(store=FilesystemOffloadStore(tmp_path))
    ctx.add_messages([UserMessage(content="go"), *tool(LOG)])
    text = str(ctx.get_messages()[2].content)
    body, last = text.rsplit("\n", 1)
    assert len(body) <= MIN_BODY_CHARS
    assert "test_broken FAILED" in body
    assert last.startswith("[[OFFLOAD: handle=") and ", type=filesystem, path=" in last
    assert str(tmp_path) in last
    assert len(list(tmp_path.rglob("*.json"))) == 1


def test_a_large_diff_keeps_file_names_and_changed_lines() -> None:
    context_lines = "\n".join(f" unchanged line {i}" for i in range(60))
    diff = (
        "diff --git a/pkg/mod.py b/pkg/mod.py\nindex 111..222 100644\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        f"@@ -1,70 +1,70 @@\n{context_lines}\n-    return a - b\n+    return a + b\n{context_lines}\n"
    )
    ctx = offloader_context(context_window=2000)
    ctx.add_messages([UserMessage(content="fix it"), *tool(diff)])
    text = str(ctx.get_messages()[2].content)
    for kept in ("diff --git a/pkg/mod.py", "+++ b/pkg/mod.py", "-    return a - b", "+    return a + b"):
        assert kept in text
    assert "unchanged line" not in text
    assert "[Original content offloaded.]" in text


def test_a_failed_write_keeps_the_original_without_a_marker() -> None:
    ctx = offloader_context(store=FailingStore())
    ctx.add_messages([UserMessage(content="go"), *tool(LOG)])
    assert ctx.get_messages()[2].content == LOG


def test_only_tool_results_and_unprotected_tools_are_processed() -> None:
    ctx = offloader_context()
    ctx.add_messages([UserMessage(content="go " + LOG), AssistantMessage(content=LOG)])
    assert [m.content for m in ctx.get_messages()] == ["go " + LOG, LOG]
    protected = offloader_context()
    protected.add_messages([UserMessage(content="read"), *tool(LOG, name="read_file")])
    assert protected.get_messages()[2].content == LOG
    assert [s.status for s in protected.compression_states] == ["started", "noop"]


def test_add_ratio_is_configurable() -> None:
    ctx = offloader_context(add_message_threshold_ratio=0.5)
    ctx.add_messages([UserMessage(content="go"), *tool("a" * 400, tokens=50)])
    assert ctx.get_messages()[2].content == "a" * 400
    ctx.add_messages(tool("b" * 400, tokens=51, call_id="2"))
    assert marker(ctx.get_messages()[4])


# --- TTL ------------------------------------------------------------------------------


def ttl_context(clock: Clock, **config: Any) -> ModelContext:
    # Large add threshold: only the TTL pass can act. Window 1000 tokens -> TTL message
    # threshold 50 tokens / 200 characters, occupancy threshold 500 tokens.
    return offloader_context(
        clock=clock, context_window=1000, add_message_threshold_ratio=10, ttl_seconds=120, **config
    )


def fill(ctx: ModelContext, log_tokens: int = 300) -> None:
    ctx.add_messages(
        [
            UserMessage(content="why does test_broken fail", metadata={"test_token_count": 200}),
            *tool(LOG, tokens=log_tokens),
        ]
    )
    ctx.get_context_window()


def test_ttl_needs_idle_time_and_occupancy_and_never_runs_in_a_window_build() -> None:
    clock = Clock()
    ctx = ttl_context(clock)
    fill(ctx)
    clock.now += 105
    assert ctx.compress_context() == "noop"
    clock.now += 15
    before = ctx.get_messages()
    assert ctx.get_context_window().context_messages == before  # a window build never runs it
    clock.now += 120
    assert ctx.compress_context() == "compressed"
    result = ctx.get_messages()[2]
    assert result.metadata["rule_compression_pass"] == "ttl"
    assert ctx.reload(marker(result).group(1))[0].content == LOG  # type: ignore[union-attr]


def test_ttl_does_nothing_below_the_occupancy_threshold_or_when_disabled() -> None:
    clock = Clock()
    low = ttl_context(clock)
    fill(low, log_tokens=100)  # 300 of 1000 tokens
    clock.now += 500
    assert low.compress_context() == "noop"
    off = offloader_context(clock=clock, context_window=1000, add_message_threshold_ratio=10, ttl_seconds=0)
    fill(off)
    clock.now += 500
    assert off.compress_context() == "noop"


def test_ttl_occupancy_and_message_ratios_are_configurable() -> None:
    clock = Clock()
    ctx = ttl_context(clock, ttl_context_occupancy_ratio=0.2, ttl_message_threshold_ratio=0.5)
    fill(ctx, log_tokens=100)  # 300 tokens >= 200, but the result (100) is under 500
    clock.now += 500
    assert ctx.compress_context() == "noop"
    other = ttl_context(clock, ttl_context_occupancy_ratio=0.2)
    fill(other, log_tokens=100)
    clock.now += 500
    assert other.compress_context() == "compressed"


def test_ttl_walks_the_whole_view_and_skips_done_and_protected_results() -> None:
    clock = Clock()
    ctx = ttl_context(clock)
    fill(ctx)
    ctx.add_messages(tool(LOG, tokens=300, name="read_file", call_id="2"))
    ctx.get_context_window(window_size=1)  # the window holds only the newest message
    clock.now += 200
    assert ctx.compress_context() == "compressed"
    view = ctx.get_messages()
    assert marker(view[2]) and view[4].content == LOG
    clock.now += 200
    assert ctx.compress_context() == "noop"  # already rule-compressed: not again


def test_ttl_offloads_plainly_when_rules_save_nothing() -> None:
    clock = Clock()
    ctx = ttl_context(clock)
    ctx.add_messages(
        [UserMessage(content="go", metadata={"test_token_count": 200}), *tool("q" * 300, tokens=300)]
    )
    ctx.get_context_window()
    clock.now += 200
    assert ctx.compress_context() == "compressed"
    assert str(ctx.get_messages()[2].content).startswith("q" * 300 + "\n[[OFFLOAD:")


def test_ttl_is_a_noop_without_tool_results() -> None:
    clock = Clock()
    ctx = ttl_context(clock)
    ctx.add_messages([UserMessage(content="hello " * 400, metadata={"test_token_count": 900})])
    ctx.get_context_window()
    clock.now += 500
    assert ctx.compress_context() == "noop"


def test_an_overflow_triggered_compression_does_not_wait_for_idle_time() -> None:
    clock = Clock()
    ctx = ttl_context(clock)
    fill(ctx)
    assert ctx.recover_from_model_exception(RuntimeError("context_length_exceeded")) is True


# --- content rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b", ContentType.GIT_DIFF),
        (json.dumps([{"id": i} for i in range(3)]), ContentType.JSON),
        ('{"a": {"b": [1, 2]}}', ContentType.JSON),
        ("<html><body><div><p>hi</p><a href='x'>l</a></div></body></html>", ContentType.HTML),
        ("src/a.py:10:def f():\nsrc/b.py:22:    f()\nsrc/c.py:3:import f", ContentType.SEARCH_RESULTS),
        (LOG, ContentType.LOG),
        ("just some words\nand more words", ContentType.PLAIN_TEXT),
        ("<returncode>0</returncode>\n<output>\nhello\n</output>", ContentType.PLAIN_TEXT),
    ],
)
def test_router_detects_each_kind(text: str, kind: ContentType) -> None:
    assert detect(text) is kind


def test_json_keeps_structure_and_a_few_items_plus_those_matching_the_request() -> None:
    rows = [{"id": i, "name": f"flight HAT{i:03d}", "seats": list(range(30))} for i in range(200)]
    result = compress(json.dumps(rows), RuleBudget(max_chars=3000, terms=("hat150",)))
    assert result is not None and result.content_type is ContentType.JSON
    assert result.text.startswith("JSON array of 200 items")
    assert '"name":"flight HAT000"' in result.text and "HAT150" in result.text
    assert "more of 200 items" in result.text


def test_search_results_keep_file_counts_and_lines_matching_the_request() -> None:
    lines = [f"src/mod{i % 7}.py:{i}:    value = compute({i})" for i in range(300)]
    lines[250] = "src/special.py:250:    def fromstring(cls, data):"
    result = compress("\n".join(lines), RuleBudget(max_chars=1500, terms=("fromstring",)))
    assert result is not None and result.content_type is ContentType.SEARCH_RESULTS
    assert result.text.startswith("300 matches in 8 files")
    assert "def fromstring(cls, data)" in result.text


def test_html_keeps_visible_text_only() -> None:
    page = (
        "<html><head><style>p{color:red}</style><script>var x=1;</script></head><body>"
        + ("<div><p>Visible paragraph</p></div>" * 50)
        + "</body></html>"
    )
    result = compress(page, RuleBudget(max_chars=500))
    assert result is not None and "Visible paragraph" in result.text
    assert "<div>" not in result.text and "var x" not in result.text and "color:red" not in result.text


def test_plain_text_collapses_repeats_and_returns_none_without_savings() -> None:
    result = compress("same line 1\n" * 50 + "the end", RuleBudget(max_chars=10_000))
    assert result is not None and result.text.count("same line") == 1 and "the end" in result.text
    assert compress("short and unique", RuleBudget(max_chars=10)) is None


def test_a_result_the_rules_cannot_shrink_enough_is_cut_head_and_tail_keeping_the_marker() -> None:
    wide = json.dumps({f"key_{i}": i for i in range(2000)})  # every key is structure: all kept
    ctx = offloader_context(context_window=1000)
    ctx.add_messages([UserMessage(content="go"), *tool(wide)])
    text = str(ctx.get_messages()[2].content)
    body, last = text.rsplit("\n", 1)
    assert "\n...\n" in body and len(body) <= 400
    assert body.startswith('JSON object with 2000 keys\n{"key_0":0') and body.endswith('"key_1999":1999}')
    assert OFFLOAD_MARKER_RE.fullmatch(last)
