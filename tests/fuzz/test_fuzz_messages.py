"""Fuzzing message sequences: parallel tool calls, missing results, internal markers inside
user text, huge and empty contents, unicode, images, and malformed input.

Properties (about 100 examples each; ``CTXCORE_LONG=1``: 10,000):
- parsing and appending never raise anything but ``InvalidMessageError``, and a rejected
  batch leaves the log as it was;
- protocol-invalid input is rejected with ``InvalidMessageError`` naming a message;
- for accepted input every served window (fast path: ``assemble_window`` + rules, before
  and after compaction stages) passes ``check_window``, holds both anchors verbatim and
  fits the budget, or ``BudgetExceeded`` is raised because the anchors alone do not fit;
- the embedded engine's processors (rules and LLM compressors with the offline model)
  never break the protocol or lose an anchor.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.engine import ContextEngine
from ctxcore.errors import BudgetExceeded, InvalidMessageError
from ctxcore.markers import INTERNAL_USER_PREFIXES, OFFLOAD_PREFIX, RECALLED_CONTEXT, TRUNCATED
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.state import ConversationKey, MemoryMessageLog, MemoryOffloadStore, MemoryStateStore
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, anchors
from ctxcore.window import check_window, close_interrupted_tool_calls
from tests.chaos.helpers import LONG
from workers.service import ContextService, InlineQueue

pytestmark = [pytest.mark.fuzz, pytest.mark.slow, pytest.mark.timeout(900 if LONG else 300)]

FUZZ = settings(
    max_examples=10_000 if LONG else 100,
    deadline=None,
    # No "explain" phase: its line tracing makes each example several times slower.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
COUNTER = TiktokenCounter()
KEY = ConversationKey("fuzz", "conv")

# --- raw content ------------------------------------------------------------------------

_unicode = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
# Recalled context is the one internal prefix an append refuses (ctxcore adds it to windows
# and never logs it): these sequences must all be accepted, so it is left out.
_LOGGABLE_PREFIXES = [p for p in INTERNAL_USER_PREFIXES if p != RECALLED_CONTEXT]
_markers = st.sampled_from([*_LOGGABLE_PREFIXES, OFFLOAD_PREFIX, TRUNCATED, "<state_snapshot>", "</summary>"])
_DATA_URL = "data:image/png;base64," + "iVBORw0KGgo" * 40


@st.composite
def _text(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["words", "unicode", "empty", "marker_inside", "huge", "json", "data_url"]))
    if kind == "words":
        return draw(st.from_regex(r"[a-z ]{1,80}", fullmatch=True))
    if kind == "unicode":
        return draw(_unicode)
    if kind == "empty":
        return draw(st.sampled_from(["", " ", "\n", "\x00"]))
    if kind == "marker_inside":
        # A marker inside (not at the start of) real user text must not make it internal.
        return f"{draw(_unicode)} {draw(_markers)} {draw(_unicode)}".strip() or "x"
    if kind == "huge":
        return draw(st.sampled_from(["lorem ipsum dolor ", "数据", "🙂", '{"k": [1, 2]} '])) * draw(
            st.integers(500, 6_000)
        )
    if kind == "json":
        return json.dumps({"rows": draw(st.lists(st.integers(), max_size=30))})
    return f"see {_DATA_URL} here"


@st.composite
def _content(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["text", "text", "text", "parts", "none"]))
    if kind == "text":
        return draw(_text())
    if kind == "none":
        return None
    parts: list[Any] = []
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["text", "image_data", "image_url", "bare", "anthropic_image"]))
        if part == "text":
            parts.append({"type": "text", "text": draw(_text())})
        elif part == "image_data":
            parts.append({"type": "image_url", "image_url": {"url": _DATA_URL}})
        elif part == "image_url":
            parts.append({"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}})
        elif part == "anthropic_image":
            parts.append({"type": "image", "source": {"type": "base64", "data": "AAAA"}})
        else:
            parts.append(draw(_unicode))
    return parts


# --- conversations ------------------------------------------------------------------------


@st.composite
def valid_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Protocol-valid raw messages: turns with parallel tool calls (results in any order,
    ids reused across steps), calls the user interrupted (a user message instead of the
    remaining results), internal user messages, an optional in-flight tail whose results
    may be missing."""
    out: list[dict[str, Any]] = []
    for t in range(draw(st.integers(1, 5))):
        content = draw(_content())
        if t == 0 or draw(st.booleans()):
            out.append({"role": "user", "content": content if content not in (None, []) else f"request {t}"})
        if draw(st.integers(0, 4)) == 0:
            out.append(
                {
                    "role": "user",
                    "content": f"{draw(st.sampled_from(_LOGGABLE_PREFIXES))} {draw(_text())}",
                }
            )
        for _ in range(draw(st.integers(0, 3))):
            width = draw(st.integers(1, 4))
            calls = [
                {
                    "id": f"call_{k}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"k": k})},
                }
                for k in range(width)
            ]
            out.append({"role": "assistant", "content": draw(_content()), "tool_calls": calls})
            order = draw(st.permutations(range(width)))
            interrupted = draw(st.integers(0, 6)) == 0
            if interrupted:
                order = order[: draw(st.integers(0, width - 1))]
            for k in order:
                result: dict[str, Any] = {
                    "role": "tool",
                    "tool_call_id": f"call_{k}",
                    "content": draw(_content()),
                }
                if draw(st.integers(0, 5)) == 0:
                    result["metadata"] = {"is_error": True}
                out.append(result)
            if interrupted:
                out.append({"role": "user", "content": "stop, do something else"})
        out.append({"role": "assistant", "content": draw(_content())})
    if draw(st.booleans()):
        out.append({"role": "user", "content": draw(_text()) or "latest"})
        width = draw(st.integers(1, 3))
        calls = [{"id": f"c{k}", "name": "grep", "arguments": "{}"} for k in range(width)]
        out.append({"role": "assistant", "content": "", "tool_calls": calls})
        for k in range(draw(st.integers(0, width))):  # results may be missing: in flight
            out.append({"role": "tool", "tool_call_id": f"c{k}", "content": draw(_text())})
    return out


_MUTATIONS = (
    "drop_middle_result",
    "orphan_result",
    "duplicate_call_id",
    "unknown_role",
    "bad_content",
    "bad_tool_calls",
    "system_inside",
    "tool_without_id",
    "not_an_object",
)


def _mutate(messages: list[dict[str, Any]], mutation: str, at: int) -> list[dict[str, Any]] | None:
    """``messages`` made protocol-invalid by ``mutation`` (None when it does not apply)."""
    out = [dict(m) for m in messages]
    at = at % (len(out) + 1)
    if mutation == "drop_middle_result":
        tools = [i for i, m in enumerate(out) if m["role"] == "tool"]
        # A result missing in the middle: an assistant message follows its step (a user
        # message there would make it an interrupted call, which is valid).
        for i in tools:
            after = next((m for m in out[i + 1 :] if m["role"] != "tool"), None)
            if after is not None and after["role"] == "assistant":
                return out[:i] + out[i + 1 :]
        return None
    if mutation == "orphan_result":
        return [{"role": "tool", "tool_call_id": "nobody-called-me", "content": "x"}, *out]
    if mutation == "duplicate_call_id":
        call = {"id": "dup", "type": "function", "function": {"name": "a", "arguments": "{}"}}
        return [*out, {"role": "assistant", "content": "", "tool_calls": [call, call]}]
    if mutation == "unknown_role":
        return [*out[:at], {"role": "robot", "content": "beep"}, *out[at:]]
    if mutation == "bad_content":
        return [*out[:at], {"role": "user", "content": 42}, *out[at:]]
    if mutation == "bad_tool_calls":
        return [*out[:at], {"role": "assistant", "content": "", "tool_calls": "bash"}, *out[at:]]
    if mutation == "system_inside":
        return [*out, {"role": "system", "content": "be nice"}]
    if mutation == "tool_without_id":
        return [*out[:at], {"role": "tool", "content": "x"}, *out[at:]]
    return [*out[:at], ["not", "a", "message"], *out[at:]]  # type: ignore[list-item]


def _service() -> ContextService:
    return ContextService(
        Settings.load({"engine": {"keep_recent_messages": 2}}),
        MemoryStateStore(),
        MemoryMessageLog(),
        MemoryOffloadStore(),
        InlineQueue(),
        counter=COUNTER,
    )


def _assert_window(service: ContextService, budget: int, system: list[AnyMessage]) -> None:
    logged = service.log.read_after(KEY, None)
    try:
        window = service.get_window(KEY, budget, system)
    except BudgetExceeded as exc:
        # Only when the anchors alone (with system and tools) do not fit.
        assert exc.system_tokens + exc.tools_tokens + exc.anchor_tokens > budget
        return
    assert check_window(window.messages) == [], check_window(window.messages)
    assert COUNTER.count_messages(window.messages) <= budget
    served = {m.context_message_id: m for m in window.messages if m.context_message_id}
    for index in anchors(logged, service.detector).indices():
        anchor = logged[index]
        assert served.get(anchor.context_message_id) == anchor, "anchor lost or altered"


def _compact(service: ContextService, budget: int) -> None:
    service.state_store.set_budget(KEY, budget)
    coordinator = Coordinator(
        service.state_store,
        service.log,
        COUNTER,
        lambda _key: ExtractiveModel(COUNTER),
        keep_recent_messages=2,
    )
    exhausted: list[str] = []
    for _ in range(6):
        stage = coordinator.plan(KEY, exhausted=exhausted)
        if stage is None:
            return
        result = coordinator.run_stage(KEY, stage)
        if result.outcome != "compressed":
            exhausted.append(stage.kind)


_SYSTEM = [SystemMessage(content="You are a careful agent.")]


@FUZZ
@given(
    raw=valid_conversation(),
    cuts=st.lists(st.integers(0, 60), max_size=3),
    budget=st.sampled_from([300, 2_000, 20_000]),
)
def test_valid_sequences_are_accepted_and_every_window_is_sound(
    raw: list[dict[str, Any]], cuts: list[int], budget: int
) -> None:
    messages = from_openai(raw)
    assert check_window(close_interrupted_tool_calls(messages)) == []  # interrupted calls: valid
    service = _service()
    bounds = sorted({0, len(messages), *(c % (len(messages) + 1) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        service.append(KEY, messages[start:end])  # valid input: never rejected
    logged = service.log.read_after(KEY, None)
    assert [m.model_copy(update={"context_message_id": None}) for m in logged] == messages
    _assert_window(service, budget, _SYSTEM)
    _compact(service, budget)
    _assert_window(service, budget, _SYSTEM)


@FUZZ
@given(
    raw=valid_conversation(),
    mutation=st.sampled_from(_MUTATIONS),
    at=st.integers(0, 50),
)
def test_invalid_sequences_raise_invalid_message_error_and_write_nothing(
    raw: list[dict[str, Any]], mutation: str, at: int
) -> None:
    mutated = _mutate(raw, mutation, at)
    if mutated is None:
        return
    service = _service()
    with pytest.raises(InvalidMessageError) as info:
        service.append(KEY, from_openai(mutated))
    assert info.value.index >= -1 and info.value.field
    assert service.log.read_after(KEY, None) == []


_anything: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _unicode,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_unicode, children, max_size=4),
    max_leaves=12,
)
_message_like = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "robot", ""])},
    optional={
        "content": _anything | _content(),
        "tool_calls": _anything,
        "tool_call_id": _anything,
        "name": _anything,
        "metadata": _anything,
        "message_id": _anything,
        "context_message_id": _anything,
    },
)


@FUZZ
@given(raw=st.lists(_message_like | _anything, max_size=8), budget=st.integers(1, 5_000))
def test_arbitrary_input_never_raises_anything_else(raw: list[Any], budget: int) -> None:
    service = _service()
    try:
        messages = from_openai(raw)
        service.append(KEY, messages)
    except InvalidMessageError:
        assert service.log.read_after(KEY, None) == []
        return
    _assert_window(service, max(budget, 1), [])


_ENGINE_CHAINS: list[Callable[[int], list[tuple[str, dict[str, Any]]]]] = [
    lambda window: [
        (
            "MessageOffloader",
            {"tokens_threshold": window // 2, "large_message_threshold": 200, "trim_size": 50},
        ),
        (
            "ToolResultBudgetProcessor",
            {"tokens_threshold": window // 2, "large_message_threshold": 100, "trim_size": 50},
        ),
        (
            "MicroCompactProcessor",
            {"compactable_tool_names": ["*"], "keep_recent_per_tool": 1, "trigger_threshold": 1},
        ),
        ("RoundLevelCompressor", {"trigger_total_tokens": window, "target_total_tokens": window // 2}),
    ],
    lambda window: [
        ("CompactCompletedToolTurns", {"keep_recent_turns": 1}),
        ("CurrentRoundCompressor", {"trigger_context_ratio": 0.3, "min_target_context_ratio": 0.01}),
        ("DialogueCompressor", {"trigger_context_ratio": 0.3, "min_target_context_ratio": 0.01}),
    ],
]


@FUZZ
@given(
    raw=valid_conversation(),
    chain=st.integers(0, len(_ENGINE_CHAINS) - 1),
    window=st.sampled_from([1_500, 8_000]),
)
def test_engine_processors_keep_the_protocol_and_the_anchors(
    raw: list[dict[str, Any]], chain: int, window: int
) -> None:
    messages = from_openai(raw)
    engine = ContextEngine({"context_window_tokens": window, "strict_processors": True})
    ctx = engine.create_context("fuzz", processors=_ENGINE_CHAINS[chain](window), token_counter=COUNTER)
    ctx.add_messages(messages)
    try:
        result = ctx.get_context_window(system_messages=_SYSTEM)
    except BudgetExceeded as exc:
        # A budget-guaranteeing chain may refuse, but only when the anchors really do not fit.
        assert exc.system_tokens + exc.tools_tokens + exc.anchor_tokens > exc.budget
        return
    out = result.get_messages()
    assert check_window(out) == [], check_window(out)
    if any(p.guarantees_budget() for _, p in ctx.processors):
        tokens = COUNTER.count_messages(out) + COUNTER.count_tools(result.get_tools())
        assert tokens <= window, (tokens, window)
    logged = ctx.get_raw_messages()
    served = {m.context_message_id: m for m in out if m.context_message_id}
    for index in anchors(logged, DEFAULT_DETECTOR).indices():
        anchor = logged[index]
        assert served.get(anchor.context_message_id) == anchor, "anchor lost or altered"
