"""Real intents: harness reminders are never an anchor; a person's short reply is, and
appending never reclassifies an earlier message."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxcore.config import Settings
from ctxcore.engine import ContextEngine
from ctxcore.errors import ConfigError
from ctxcore.eval.data import conversation, groups
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, message_text
from ctxcore.state import CompressionState
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, HARNESS_USER_PATTERNS, UserDetector, anchors
from tests.datasets import DATA_DIR, swe_runs
from tests.strategies import conversations as generated

COUNTER = TiktokenCounter()
REMINDER = "Please always provide EXACTLY ONE action in triple backticks"


def is_reminder(message: AnyMessage) -> bool:
    return isinstance(message, UserMessage) and message_text(message).lstrip().startswith(REMINDER)


def person_replies() -> dict:  # type: ignore[type-arg]
    path = DATA_DIR / "person_replies.jsonl"
    if not path.exists():
        pytest.fail(f"test data {path} is missing from the repository", pytrace=False)
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_runs_hold_reminders_and_none_is_ever_an_anchor_or_pinned() -> None:
    with_reminders = 0
    for record in swe_runs():
        conv = conversation(record)
        if not any(is_reminder(m) for m in conv.messages):
            continue
        with_reminders += 1
        setup = PolicySetup(
            conv.id,
            8000,
            list(conv.system),
            [],
            COUNTER,
            CountingModel(ExtractiveModel(COUNTER), COUNTER),
            DEFAULT_DETECTOR,
        )
        policy = make_policy("full", setup)
        history: list[AnyMessage] = []
        for n, unit in enumerate(groups(conv.messages)):
            policy.append(unit)
            history.extend(unit)
            if n % 3:
                continue
            window = policy.window().messages
            found = anchors(history)
            assert not any(is_reminder(history[i]) for i in found.indices()), conv.id
            state = policy.states.load(policy.key) or CompressionState()  # type: ignore[attr-defined]
            pinned = [policy.log.get(policy.key, i) for i in state.pinned]  # type: ignore[attr-defined]
            assert not any(m is not None and is_reminder(m) for m in pinned), conv.id
            assert window
    assert with_reminders >= 3


def test_a_persons_yes_and_continue_are_the_intent_once_sent() -> None:
    record = person_replies()
    messages = conversation(record).messages
    for reply in ("yes", "continue"):
        end = next(i for i, m in enumerate(messages) if message_text(m) == reply) + 1
        found = anchors(messages[:end])
        assert found.intent is not None and message_text(messages[found.intent]) == reply
        # Embedded too: the engine's default detector says the same.
        engine = ContextEngine()
        ctx = engine.create_context(f"c-{reply}", history_messages=list(messages[:end]))
        assert ctx.statistic() is not None
        assert anchors(ctx.get_messages(), engine.detector).intent == found.intent
    # The structural rule (opt-in) takes such replies for harness nudges: that is why it is off.
    structural = UserDetector(harness_structure=True)
    found = anchors(messages, structural)
    assert found.intent is not None and message_text(messages[found.intent]).startswith("The CSV export")


def test_reminders_sent_as_content_parts_are_classified_by_their_text() -> None:
    parts = [{"type": "text", "text": f"  {REMINDER}, found 2 actions."}]
    assert not DEFAULT_DETECTOR.is_real(UserMessage(content=parts))
    assert DEFAULT_DETECTOR.is_real(UserMessage(content=[{"type": "text", "text": "please go on"}]))


def test_patterns_are_configured_everywhere_and_can_be_turned_off() -> None:
    reminder = UserMessage(content=f"{REMINDER}, found 3 actions.")
    assert Settings().engine.internal_user_patterns == HARNESS_USER_PATTERNS
    assert not Settings().engine.detector().is_real(reminder)
    off = Settings.from_env({"CTXCORE_ENGINE__INTERNAL_USER_PATTERNS": "[]"})
    assert off.engine.internal_user_patterns == () and off.engine.detector().is_real(reminder)
    assert not ContextEngine().detector.is_real(reminder)
    assert ContextEngine({"internal_user_patterns": []}).detector.is_real(reminder)


@pytest.mark.parametrize("pattern", ["(unclosed", ".*", "a?"])
def test_a_bad_pattern_fails_at_construction_naming_it(pattern: str) -> None:
    with pytest.raises(ConfigError, match=__import__("re").escape(repr(pattern))):
        UserDetector(patterns=(pattern,))
    with pytest.raises(ConfigError, match="internal_user_patterns"):
        Settings.load({"engine": {"internal_user_patterns": [pattern]}})
    with pytest.raises(ConfigError, match="internal_user_patterns"):
        ContextEngine({"internal_user_patterns": [pattern]})


def _nudged(messages: list[AnyMessage]) -> list[AnyMessage]:
    """A turn with a tool call, its final reply, then a short user message: the structural shape."""
    call = ToolCall(id="x1", name="bash", arguments="{}")
    return [
        *messages,
        UserMessage(content="do it"),
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(tool_call_id="x1", content="ok"),
        AssistantMessage(content="done?"),
        UserMessage(content="yes"),
    ]


@given(generated(), st.booleans(), st.booleans())
def test_appending_never_reclassifies_an_earlier_message(
    messages: list[AnyMessage], structural: bool, nudge: bool
) -> None:
    detector = UserDetector(harness_structure=structural)
    full = _nudged(messages) if nudge else messages
    flags = detector.real_flags(full)
    for end in range(len(full) + 1):
        assert detector.real_flags(full[:end]) == flags[:end]
    for i, message in enumerate(full):
        assert detector.is_real(message, full[:i]) == flags[i]
