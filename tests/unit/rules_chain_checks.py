"""Checks the rule-chain tests share: log ids on a message list, and a chain's output sound
against its input (a valid window, every anchor kept, every offload handle recoverable)."""

from __future__ import annotations

from collections.abc import Sequence

from ctxcore.messages import AnyMessage, messages_to_json
from ctxcore.processors.offload import OFFLOAD_MARKER_RE
from ctxcore.state.keys import ConversationKey
from ctxcore.state.memory import MemoryOffloadStore
from ctxcore.turns import anchors
from ctxcore.window import check_window


def with_ids(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    return [m.model_copy(update={"context_message_id": f"{i + 1:012d}"}) for i, m in enumerate(messages)]


def assert_sound(
    before: list[AnyMessage], after: list[AnyMessage], store: MemoryOffloadStore, key: ConversationKey
) -> None:
    assert check_window(after) == []
    for index in anchors(before).indices():
        assert before[index] in after
    by_id = {m.context_message_id: m for m in before}
    for message in after:
        for handle, _, _ in OFFLOAD_MARKER_RE.findall(str(message.content)):
            stored = store.get(key, handle)
            assert stored is not None
            assert messages_to_json(stored) == messages_to_json([by_id[message.context_message_id]])
