"""MessageOffloader, ToolResultBudgetProcessor and ToolResultWindowProcessor (spec 4.8, 4.11, 4.12)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_text,
    messages_to_json,
)
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state.filesystem import FilesystemOffloadStore
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore


class CountingStore(MemoryOffloadStore):
    """A memory store that counts writes (and can be told to fail)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.writes = 0
        self.fail = fail

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        if self.fail:
            raise OSError("disk full")
        written = super().put_if_absent(key, handle, messages)
        self.writes += written
        return written


def context(processors: list[Any], store: Any = None, **config: Any) -> ModelContext:
    eng = ContextEngine({"strict_processors": True, **config}, offload_store=store or CountingStore())
    return eng.create_context("c", "s", processors=processors)


def step(call_id: str, name: str, content: str, arguments: str = "{}") -> list[AnyMessage]:
    call = ToolCall(id=call_id, name=name, arguments=arguments)
    return [
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(content=content, tool_call_id=call_id),
    ]


def handle_of(message: AnyMessage) -> str:
    match = OFFLOAD_MARKER_RE.search(str(message.content))
    assert match, f"no offload marker in {message.content!r}"
    return match.group(1)


def assert_reloads_original(ctx: ModelContext, message: AnyMessage) -> None:
    original = ctx.raw_message(str(message.context_message_id))
    assert original is not None
    assert messages_to_json(ctx.reload(handle_of(message))) == messages_to_json([original])


BIG = "x" * 1500


# --- MessageOffloader -----------------------------------------------------------------


def offloader(**config: Any) -> list[Any]:
    return [("MessageOffloader", {"keep_last_round": False, "tokens_threshold": 1, **config})]


def test_large_tool_result_is_trimmed_with_a_marker_and_reloadable() -> None:
    ctx = context(offloader(trim_size=10))
    ctx.add_messages([UserMessage(content="go"), *step("1", "bash", BIG), AssistantMessage(content="ok")])
    tool = ctx.get_messages()[2]
    assert str(tool.content).startswith("x" * 10 + "...\n[[OFFLOAD: handle=")
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == "1"
    assert_reloads_original(ctx, tool)


def test_thresholds_gate_the_offloader() -> None:
    messages = [UserMessage(content="go"), *step("1", "bash", BIG), AssistantMessage(content="ok")]
    quiet = context(offloader(tokens_threshold=10_000))
    quiet.add_messages(messages)
    assert quiet.get_messages()[2].content == BIG
    by_count = context(offloader(tokens_threshold=10_000, messages_threshold=3))
    by_count.add_messages(messages)
    assert by_count.get_messages()[2].content != BIG
    kept = context(offloader(messages_to_keep=10))
    kept.add_messages(messages)
    assert kept.get_messages()[2].content == BIG


def test_only_configured_roles_large_messages_and_old_enough_messages_are_offloaded() -> None:
    messages = [
        UserMessage(content="task " + BIG),
        AssistantMessage(content="a" * 1500),
        *step("1", "bash", "short"),
        *step("2", "bash", BIG),
        AssistantMessage(content="done"),
        UserMessage(content="next"),
    ]
    ctx = context(offloader(offload_message_type=["assistant", "tool", "user"], messages_to_keep=2))
    ctx.add_messages(messages)
    view = ctx.get_messages()
    assert view[0].content == messages[0].content  # the task anchor is never touched
    assert "[[OFFLOAD:" in str(view[1].content)
    assert view[3].content == "short"
    assert "[[OFFLOAD:" in str(view[5].content)
    tools_only = context(offloader())
    tools_only.add_messages(messages)
    assert tools_only.get_messages()[1].content == messages[1].content


def test_keep_last_round_spares_everything_after_the_last_final_reply() -> None:
    ctx = context(offloader(keep_last_round=True))
    ctx.add_messages(
        [
            UserMessage(content="a"),
            *step("1", "bash", BIG),
            AssistantMessage(content="ok"),
            *step("2", "bash", BIG),
        ]
    )
    view = ctx.get_messages()
    assert "[[OFFLOAD:" in str(view[2].content)
    assert view[5].content == BIG  # in the running round, after the last final reply


@pytest.mark.parametrize(
    ("protected", "arguments", "spared"),
    [
        (["read_file"], '{"path": "a.py"}', True),
        (["read_file:*.py"], '{"path": "src/a.py"}', True),
        (["read_file:*.py"], '{"path": "notes.md"}', False),
        (["read_file:?.py"], '{"path": "a.py"}', True),
        (["grep", "read_file:*.md"], '{"path": "notes.md"}', True),
        (["read_file:*.py"], '{"opts": {"path": "deep/a.py"}}', True),
        ([], '{"path": "a.py"}', False),
    ],
)
def test_protected_tool_names_match_name_or_argument_pattern(
    protected: list[str], arguments: str, spared: bool
) -> None:
    ctx = context(offloader(protected_tool_names=protected))
    ctx.add_messages(
        [UserMessage(content="read"), *step("1", "read_file", BIG, arguments), AssistantMessage(content="k")]
    )
    assert (ctx.get_messages()[2].content == BIG) is spared


def test_offload_stores_the_logged_original_not_a_processed_copy() -> None:
    ctx = context(offloader(tokens_threshold=10**9))
    ctx.add_messages([UserMessage(content="go"), *step("1", "bash", BIG), AssistantMessage(content="ok")])
    view = ctx.get_messages()
    ctx.set_messages([*view[:2], view[2].model_copy(update={"content": "y" * 1500}), view[3]])
    assert ctx.compress_context() == "compressed"
    assert ctx.reload(handle_of(ctx.get_messages()[2]))[0].content == BIG


def test_a_failed_offload_write_keeps_the_message_unchanged() -> None:
    ctx = context(offloader(), store=CountingStore(fail=True))
    ctx.add_messages([UserMessage(content="go"), *step("1", "bash", BIG), AssistantMessage(content="ok")])
    assert ctx.get_messages()[2].content == BIG


def test_filesystem_store_marker_names_the_file_holding_the_original(tmp_path: Path) -> None:
    store = FilesystemOffloadStore(tmp_path)
    ctx = context(offloader(), store=store)
    ctx.add_messages([UserMessage(content="go"), *step("1", "bash", BIG), AssistantMessage(content="ok")])
    match = OFFLOAD_MARKER_RE.search(str(ctx.get_messages()[2].content))
    assert match and match.group(2) == "filesystem"
    path = Path(match.group(3))
    assert path == store.path_for(ctx.key, match.group(1)) and path.exists()
    assert json.loads(path.read_text())["messages"][0]["content"] == BIG
    assert_reloads_original(ctx, ctx.get_messages()[2])


# --- ToolResultBudgetProcessor --------------------------------------------------------


def budget(**config: Any) -> list[Any]:
    return [
        (
            "ToolResultBudgetProcessor",
            {"tokens_threshold": 600, "large_message_threshold": 50, "trim_size": 20, **config},
        )
    ]


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_largest_results_of_an_over_budget_turn_are_persisted_until_it_fits() -> None:
    store = CountingStore()
    ctx = context(budget(), store=store)
    ctx.add_messages(
        [
            UserMessage(content="go"),
            *step("1", "bash", words(150)),
            *step("2", "bash", words(400)),
            *step("3", "bash", words(60)),
            AssistantMessage(content="done"),
        ]
    )
    view = ctx.get_messages()
    assert str(view[4].content).startswith("<persisted-output>\nOutput too large (")
    assert "Preview (first 20 chars):\n" + words(400)[:20] + "\n...\n</persisted-output>" in str(
        view[4].content
    )
    assert view[2].content == words(150) and view[6].content == words(60)
    assert store.writes == 1
    assert_reloads_original(ctx, view[4])


def test_each_turn_has_its_own_budget_and_the_allowlist_is_never_offloaded() -> None:
    turn = [*step("1", "grep", words(250)), AssistantMessage(content="ok")]
    ctx = context(budget(tool_name_allowlist=["grep"]))
    ctx.add_messages([UserMessage(content="a"), *turn, UserMessage(content="b"), *turn])
    assert all(m.content == words(250) for m in ctx.get_messages() if isinstance(m, ToolMessage))
    other = context(budget())
    other.add_messages([UserMessage(content="a"), *turn, UserMessage(content="b"), *turn])
    assert all(m.content == words(250) for m in other.get_messages() if isinstance(m, ToolMessage))


def test_budget_trigger_and_already_offloaded_results() -> None:
    store = CountingStore()
    ctx = context(budget(), store=store)
    ctx.add_messages([UserMessage(content="go"), *step("1", "bash", words(400))])
    assert store.writes == 1
    ctx.add_messages(step("2", "bash", words(10)))
    ctx.add_messages(AssistantMessage(content="done"))
    assert store.writes == 1  # the placeholder is not offloaded again
    assert ctx.compress_context() == "noop"


def test_budget_defaults_match_the_reference() -> None:
    from ctxcore.processors import ToolResultBudgetConfig

    config = ToolResultBudgetConfig()
    assert (config.tokens_threshold, config.large_message_threshold, config.trim_size) == (50000, 10000, 3000)
    assert config.tool_name_allowlist is None


# --- ToolResultWindowProcessor --------------------------------------------------------


def window(**config: Any) -> list[Any]:
    return [
        ("ToolResultWindowProcessor", {"tool_names": ["search"], "keep_last_k": 2, "trim_size": 15, **config})
    ]


def test_results_outside_the_newest_k_of_listed_tools_are_persisted() -> None:
    store = CountingStore()
    ctx = context(window(), store=store)
    ctx.add_messages(
        [
            UserMessage(content="go"),
            *step("1", "web_search", "r1 " * 20),
            *step("2", "bash", "b " * 20),
            *step("3", "code_search", "r3 " * 20),
            *step("4", "web_search", "r4 " * 20),
        ]
    )
    view = ctx.get_messages()
    assert str(view[2].content).startswith("<persisted-output>")  # suffix match: web_search
    assert view[4].content == "b " * 20  # not listed
    assert view[6].content == "r3 " * 20 and view[8].content == "r4 " * 20
    assert view[2].metadata["tool_result_window_managed"] is True
    assert store.writes == 1
    ctx.add_messages(step("5", "web_search", "r5"))  # one more result: exactly one more offload
    assert store.writes == 2
    assert str(ctx.get_messages()[6].content).startswith("<persisted-output>")


def test_small_results_are_compacted_in_place_and_reported_without_a_write() -> None:
    store = CountingStore()
    events: list[Any] = []
    ctx = context(window(keep_last_k=1, min_offload_chars=100, small_result_trim_size=5), store=store)
    ctx.subscribe(events.append)
    ctx.add_messages(
        [
            UserMessage(content="go"),
            *step("1", "search", "0123456789" * 3),
            *step("2", "search", "tiny"),
            *step("3", "search", "z"),
        ]
    )
    view = ctx.get_messages()
    assert view[2].content == "<windowed-output>\n01234\n...\n</windowed-output>"
    assert view[4].content == "tiny" and view[4].metadata["tool_result_window_managed"] is True
    assert store.writes == 0
    completed = [e for e in events if e.status == "completed"][-1]
    cut = completed.event.removed_ranges
    assert [(r.first, r.last) for r in cut] == [(view[2].context_message_id, view[2].context_message_id)]


def test_empty_tool_list_does_nothing() -> None:
    ctx = context(window(tool_names=[]))
    ctx.add_messages(
        [
            UserMessage(content="go"),
            *step("1", "search", "a"),
            *step("2", "search", "b"),
            *step("3", "search", "c"),
        ]
    )
    assert ctx.compression_states == []


# --- list content ---------------------------------------------------------------------


def as_parts(message: AnyMessage) -> AnyMessage:
    if isinstance(message, ToolMessage) and isinstance(message.content, str):
        return message.model_copy(update={"content": [{"type": "text", "text": message.content}]})
    return message


@pytest.mark.parametrize(
    "processors",
    [offloader(trim_size=10), budget(), window(), window(min_offload_chars=1000, small_result_trim_size=5)],
    ids=["MessageOffloader", "ToolResultBudgetProcessor", "ToolResultWindowProcessor", "windowed in place"],
)
def test_a_result_sent_as_text_parts_is_handled_as_its_text(processors: list[Any]) -> None:
    # OpenHands and LiteLLM's Anthropic route send every content as a list of parts: such a
    # result was never offloaded, so the next rules cleared what these would have previewed.
    messages = [
        UserMessage(content="go"),
        *step("1", "search", BIG),
        *step("2", "search", words(400)),
        *step("3", "search", "r3 " * 20),
        *step("4", "search", "r4 " * 20),
        AssistantMessage(content="done"),
    ]
    as_text, from_parts = context(processors), context(processors)
    as_text.add_messages(messages)
    from_parts.add_messages([as_parts(m) for m in messages])
    texts = [OFFLOAD_MARKER_RE.sub("", message_text(m)) for m in as_text.get_messages()]
    assert texts != [message_text(m) for m in messages]  # the processor acted
    assert [OFFLOAD_MARKER_RE.sub("", message_text(m)) for m in from_parts.get_messages()] == texts
