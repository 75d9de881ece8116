"""The MessageLog contract under concurrency, against every backend: writers in threads with
stores of their own get unique gap-free ids, and one expected last id lets exactly one in."""

from __future__ import annotations

import threading

import pytest

from ctxcore.errors import (
    ConflictError,
)
from ctxcore.messages import (
    AnyMessage,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from ctxcore.state import ConversationKey
from tests.conftest import Backend


def users(*texts: str) -> list[AnyMessage]:
    return [UserMessage(content=t) for t in texts]


def test_concurrent_appends_get_unique_gap_free_ids(backend: Backend, conv_key: ConversationKey) -> None:
    # 8 threads, each with its own store object (for SQL its own engine: like 8 processes)
    threads, batches = 8, 15
    logs = [backend.independent_log() for _ in range(threads)]
    barrier = threading.Barrier(threads)
    got: list[list[str]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def appender(index: int) -> None:
        try:
            barrier.wait()
            for b in range(batches):
                batch: list[AnyMessage] = [
                    AssistantMessage(content=None, tool_calls=[ToolCall(id=f"c{index}", name="f")]),
                    ToolMessage(content=f"{index}:{b}", tool_call_id=f"c{index}"),
                    # Every thread also sends the same shared message: it must be logged once.
                    UserMessage(content=f"shared {b}", message_id=f"shared-{b}"),
                ]
                got[index] += logs[index].append(conv_key, batch)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    pool = [threading.Thread(target=appender, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    distinct = {i for ids in got for i in ids}
    total = threads * batches * 2 + batches
    assert sorted(distinct) == [f"{n:012d}" for n in range(1, total + 1)]
    stored = logs[0].read_after(conv_key, None)
    assert [m.context_message_id for m in stored] == sorted(distinct)
    assert sorted(m.text for m in stored if m.role == "user") == sorted(f"shared {b}" for b in range(batches))
    for index in range(threads):
        # Each thread's own messages are in its append order, each tool result after its call
        mine = [m.text for m in stored if m.role == "tool" and m.text.startswith(f"{index}:")]
        assert mine == [f"{index}:{b}" for b in range(batches)]
        shared_ids = got[index][2::3]
        assert shared_ids == [
            next(m.context_message_id for m in stored if m.text == f"shared {b}") for b in range(batches)
        ]


def test_one_expected_last_id_lets_exactly_one_of_16_writers_in(
    backend: Backend, conv_key: ConversationKey
) -> None:
    # Given a log ending at its first message and 16 writers (each its own client or
    # engine: like 16 processes) that all read that last id
    first = backend.log.append(conv_key, users("task"))[0]
    writers = 16
    logs = [backend.independent_log() for _ in range(writers)]
    barrier = threading.Barrier(writers)
    won: dict[int, list[str]] = {}
    lost: dict[int, ConflictError] = {}
    errors: list[BaseException] = []

    def batch(index: int) -> list[AnyMessage]:
        return [
            AssistantMessage(content=None, tool_calls=[ToolCall(id="c", name="f")], message_id=f"w{index}-a"),
            ToolMessage(content=f"result {index}", tool_call_id="c", message_id=f"w{index}-t"),
        ]

    def writer(index: int) -> None:
        try:
            barrier.wait()
            won[index] = logs[index].append(conv_key, batch(index), expected_last_id=first)
        except ConflictError as exc:
            lost[index] = exc
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    # Then exactly one appended, the 15 others got a conflict naming where the log ends
    assert len(won) == 1 and len(lost) == writers - 1
    ((winner, ids),) = won.items()
    assert ids == ["000000000002", "000000000003"]
    assert {exc.last_id for exc in lost.values()} == {"000000000003"}
    assert all(exc.expected_last_id == first for exc in lost.values())
    stored = backend.log.read_after(conv_key, None)
    assert [m.text for m in stored] == ["task", "", f"result {winner}"]
    # And the winner's retry (its response was lost) gets the same ids, writing nothing
    assert logs[winner].append(conv_key, batch(winner), expected_last_id=first) == ids
    assert backend.log.last_id(conv_key) == "000000000003"
    # While a loser retrying the same way still conflicts: its messages are not logged
    loser = next(iter(lost))
    with pytest.raises(ConflictError):
        logs[loser].append(conv_key, batch(loser), expected_last_id=first)
