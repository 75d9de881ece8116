"""Hypothesis strategies: valid conversations with parallel tool calls, anchors and internal messages."""

from __future__ import annotations

from hypothesis import strategies as st

from ctxcore.markers import MEMORY_BLOCK_ROUND, SYSTEM_REMINDER
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage

# Profiles ("ci", "long") are registered and loaded in tests/conftest.py.

_words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)


@st.composite
def conversations(draw: st.DrawFn, max_turns: int = 6, in_flight: bool | None = None) -> list[AnyMessage]:
    """A protocol-valid conversation: turns of real user input, tool steps (ids reused across
    steps on purpose), internal user messages, and optionally an in-flight tail."""
    messages: list[AnyMessage] = []
    if draw(st.booleans()):
        messages.append(SystemMessage(content="system prompt"))
    n_turns = draw(st.integers(min_value=0, max_value=max_turns))
    for t in range(n_turns):
        messages.append(UserMessage(content=f"request {t}: {draw(_words)}"))
        if draw(st.integers(0, 5)) == 0:
            messages.append(UserMessage(content=f"{SYSTEM_REMINDER} note {t}"))
        for s in range(draw(st.integers(0, 3))):
            width = draw(st.integers(1, 3))
            # Ids restart per step: real agents reuse them across a conversation.
            calls = [
                ToolCall(
                    id=f"call_{k}", name=draw(st.sampled_from(["bash", "read_file", "grep"])), arguments="{}"
                )
                for k in range(width)
            ]
            messages.append(AssistantMessage(content=f"step {t}.{s}", tool_calls=calls))
            order = draw(st.permutations(range(width)))
            for k in order:
                body = draw(st.sampled_from(["ok", "x" * draw(st.integers(0, 3000)), "Traceback: boom"]))
                messages.append(
                    ToolMessage(
                        tool_call_id=f"call_{k}",
                        content=body,
                        metadata={"is_error": body.startswith("Trace")},
                    )
                )
        if draw(st.integers(0, 6)) == 0:
            messages.append(UserMessage(content=f"{MEMORY_BLOCK_ROUND}\nsummary {t}"))
        messages.append(AssistantMessage(content=f"answer {t}"))
    tail = draw(st.booleans()) if in_flight is None else in_flight
    if tail and n_turns:
        messages.append(UserMessage(content="latest request"))
        width = draw(st.integers(1, 3))
        calls = [ToolCall(id=f"call_{k}", name="bash", arguments="{}") for k in range(width)]
        messages.append(AssistantMessage(content="working", tool_calls=calls))
        for k in range(draw(st.integers(0, width))):
            messages.append(ToolMessage(tool_call_id=f"call_{k}", content="partial"))
    return messages
