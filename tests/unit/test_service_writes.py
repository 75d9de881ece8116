"""``ContextService.append_if_match``: the HTTP append's preconditions, without HTTP.

The routes only translate; what ``If-Match`` and ``max_conversations`` mean lives in the
service, so it is tested here on the in-memory stores (the HTTP tests cover the statuses).
"""

from __future__ import annotations

import pytest

from ctxcore.config import Settings
from ctxcore.errors import ConflictError, QuotaExceeded
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.state import ConversationKey
from ctxcore.state.memory import MemoryMessageLog, MemoryStateStore
from workers.service import ContextService, InlineQueue

KEY = ConversationKey("acme", "c1")


def _service(settings: Settings | None = None) -> ContextService:
    return ContextService(settings or Settings(), MemoryStateStore(), MemoryMessageLog(), None, InlineQueue())


def _user(text: str, message_id: str | None = None) -> list[AnyMessage]:
    return [UserMessage(content=text, message_id=message_id)]


def test_if_match_star_needs_an_existing_conversation() -> None:
    service = _service()
    with pytest.raises(ConflictError, match=r"If-Match: \* but the conversation does not exist") as caught:
        service.append_if_match(KEY, _user("hi"), "*")
    assert caught.value.expected_last_id is None  # no log id to name: the body gets none
    service.append_if_match(KEY, _user("hi"), None)
    assert service.append_if_match(KEY, _user("more"), "*").ids == ["000000000002"]


def test_a_moved_log_is_a_conflict_naming_its_last_id() -> None:
    service = _service()
    first = service.append_if_match(KEY, _user("one"), None)
    assert (first.ids, first.last_id, first.replay) == (["000000000001"], "000000000001", False)
    service.append_if_match(KEY, _user("two"), "000000000001")
    with pytest.raises(ConflictError, match="does not match the log's last id '000000000002'") as caught:
        service.append_if_match(KEY, _user("three"), "000000000001")
    assert (caught.value.last_id, caught.value.expected_last_id) == ("000000000002", "000000000001")
    assert service.log.last_id(KEY) == "000000000002"  # nothing was appended


def test_a_replay_logs_nothing_and_says_so() -> None:
    service = _service()
    service.append_if_match(KEY, _user("one", "m-1"), None)
    again = service.append_if_match(KEY, _user("one", "m-1"), None)
    assert (again.ids, again.last_id, again.replay) == (["000000000001"], "000000000001", True)


def test_only_a_new_conversation_counts_against_the_limit() -> None:
    service = _service(Settings.load({"tenants": {"acme": {"max_conversations": 1}}}))
    service.append_if_match(KEY, _user("one"), None)
    service.append_if_match(KEY, _user("two"), None)  # the existing one still grows
    with pytest.raises(QuotaExceeded, match="limit of 1 conversations"):
        service.append_if_match(ConversationKey("acme", "c2"), _user("hi"), None)
    assert service.log.last_id(ConversationKey("acme", "c2")) is None
