"""ConversationKey validation: crafted ids never reach Redis keys, SQL rows or file paths."""

from __future__ import annotations

import pytest

from ctxcore.errors import InvalidKeyError
from ctxcore.state import ConversationKey, validate_id

CRAFTED = [
    pytest.param("", id="empty"),
    pytest.param("a:b", id="colon"),
    pytest.param("a{b", id="open-brace"),
    pytest.param("a}b", id="close-brace"),
    pytest.param("{t:c}", id="hash-tag"),
    pytest.param("a/b", id="slash"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("..", id="dot-dot"),
    pytest.param("../etc", id="parent"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("café", id="unicode"),
    pytest.param("ｔｅｎａｎｔ", id="fullwidth"),
    pytest.param("a\u200bb", id="zero-width-space"),
    pytest.param("x" * 10_000, id="10kB"),
    pytest.param("x" * 129, id="129-chars"),
    pytest.param("a b", id="space"),
    pytest.param("a\n", id="trailing-newline"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a*", id="glob"),
    pytest.param("a'; DROP TABLE x; --", id="sql"),
    pytest.param(None, id="none"),
    pytest.param(42, id="int"),
]


@pytest.mark.parametrize("bad", CRAFTED)
def test_crafted_tenant_id_is_rejected(bad: object) -> None:
    with pytest.raises(InvalidKeyError, match="tenant_id"):
        ConversationKey(bad, "conv")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", CRAFTED)
def test_crafted_conversation_id_is_rejected(bad: object) -> None:
    with pytest.raises(InvalidKeyError, match="conversation_id"):
        ConversationKey("tenant", bad)  # type: ignore[arg-type]


def test_error_message_of_a_huge_id_is_short() -> None:
    with pytest.raises(InvalidKeyError) as info:
        validate_id("x" * 10_000, "tenant_id")
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("good", ["a", "A-b_c.d", "0", "x" * 128, "conv..1", "tenant-42"])
def test_safe_ids_are_accepted(good: str) -> None:
    key = ConversationKey(good, good)
    assert key.hash_tag == f"{{{good}:{good}}}"
    assert str(key) == f"{good}/{good}"


def test_keys_are_values() -> None:
    assert ConversationKey("t", "c") == ConversationKey("t", "c")
    assert len({ConversationKey("t", "c"), ConversationKey("t", "c"), ConversationKey("c", "t")}) == 2
    assert ConversationKey("t", "a") < ConversationKey("t", "b")
