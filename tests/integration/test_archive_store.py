"""The recall archive contract of every StateStore backend: written atomically with the state."""

from __future__ import annotations

import threading

import pytest

from ctxcore.state import CompressionState, ConversationKey, StateStore
from ctxcore.state.archive import ArchiveChunk, ArchiveWrite
from tests.conftest import Backend


@pytest.fixture
def store(backend: Backend) -> StateStore:
    return backend.state


def write(n: int, text: str = "text", index: bytes = b"\x00index\xff") -> ArchiveWrite:
    chunk = ArchiveChunk(f"{n:012d}", f"{n + 1:012d}", f"{text} {n}", 3)
    return ArchiveWrite((chunk,), index + bytes([n]), n)


def test_an_archive_is_saved_with_its_state_and_read_back(
    store: StateStore, conv_key: ConversationKey
) -> None:
    assert store.load_archive(conv_key) is None and store.archive_chunks(conv_key) == []
    assert store.save(conv_key, CompressionState(archive_version=1), 0, archive=write(1))
    assert store.load_archive(conv_key) == b"\x00index\xff\x01"
    assert store.save(conv_key, CompressionState(archive_version=2), 1, archive=write(3, "later"))
    # A chunk id written twice keeps its first text; the index is the newest.
    assert store.save(conv_key, CompressionState(archive_version=3), 2, archive=write(1, "changed"))
    assert [(c.chunk_id, c.text) for c in store.archive_chunks(conv_key)] == [
        ("000000000001-000000000002", "text 1"),
        ("000000000003-000000000004", "later 3"),
    ]
    assert store.load_archive(conv_key) == b"\x00index\xff\x01"
    state = store.load(conv_key)
    assert state is not None and state.archive_version == 3


def test_a_lost_race_writes_no_archive(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.save(conv_key, CompressionState(), 0)
    assert not store.save(conv_key, CompressionState(), 0, archive=write(7))
    assert store.load_archive(conv_key) is None and store.archive_chunks(conv_key) == []


def test_concurrent_archiving_saves_leave_exactly_the_winners_archive(
    store: StateStore, conv_key: ConversationKey
) -> None:
    barrier = threading.Barrier(8)
    won: list[int] = []

    def attempt(n: int) -> None:
        barrier.wait()
        if store.save(conv_key, CompressionState(archive_version=n), 0, archive=write(n)):
            won.append(n)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    (n,) = won
    assert [c.chunk_id for c in store.archive_chunks(conv_key)] == [f"{n:012d}-{n + 1:012d}"]
    assert store.load_archive(conv_key) == b"\x00index\xff" + bytes([n])


def test_delete_removes_the_archive(store: StateStore, conv_key: ConversationKey) -> None:
    assert store.save(conv_key, CompressionState(), 0, archive=write(1))
    store.delete(conv_key)
    assert store.load_archive(conv_key) is None and store.archive_chunks(conv_key) == []


def test_archives_are_per_conversation_key(store: StateStore, tenant: str) -> None:
    a, b = ConversationKey(f"{tenant}-a", "c"), ConversationKey(f"{tenant}_a", "c")
    assert store.save(a, CompressionState(), 0, archive=write(1, "of a"))
    assert store.archive_chunks(b) == [] and store.load_archive(b) is None
    assert [c.text for c in store.archive_chunks(a)] == ["of a 1"]
