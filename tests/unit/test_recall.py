"""Compression recall: chunks, the FTS5 index, the search, archiving with the state, embedded use."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

import ctxcore.processors.round_level as round_level_module
from ctxcore.config import Settings
from ctxcore.coordinator import Coordinator
from ctxcore.coordinator.saving import save_result
from ctxcore.engine import ContextEngine
from ctxcore.errors import ConfigError, InvalidKeyError, InvalidMessageError, RecallDisabled
from ctxcore.markers import COMPRESSION_RECALL_PREFIX
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage, message_text
from ctxcore.pipeline import Stage, StageResult, View
from ctxcore.pipeline.view import block_message
from ctxcore.processors.recall_tool import RECALL_TOOL_NAME, execute_recall_tool
from ctxcore.recall import (
    ChunkingConfig,
    RecallIndex,
    archive_messages,
    chunk_messages,
    query_words,
    recall,
)
from ctxcore.recall.chunks import head_within
from ctxcore.state import CompressionState, ConversationKey, FilesystemOffloadStore
from ctxcore.state.memory import MemoryMessageLog, MemoryStateStore
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from tests.datasets import swe_runs
from tests.pipeline_helpers import logged
from workers.service import ContextService, InlineQueue

COUNTER = TiktokenCounter()
KEY = ConversationKey("acme", "run-1")


def ided(messages: list[AnyMessage], start: int = 1) -> list[AnyMessage]:
    return [m.model_copy(update={"context_message_id": f"{n:012d}"}) for n, m in enumerate(messages, start)]


def facts(n: int) -> list[AnyMessage]:
    """A chat where message i states one distinctive fact."""
    out: list[AnyMessage] = []
    for i in range(n):
        out.append(UserMessage(content=f"note {i}: the gateway port for service alpha{i} is {8000 + i}"))
        out.append(AssistantMessage(content=f"noted, alpha{i} listens on {8000 + i} " + "filler " * 40))
    return ided(out)


def test_chunks_are_message_aligned_sized_and_overlapping() -> None:
    messages = facts(40)
    chunks = chunk_messages(messages, COUNTER, 400, 80)
    assert len(chunks) > 4
    assert all(c.tokens <= 400 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        assert b.first_id <= a.last_id  # the overlap: b starts inside a
    assert chunks[0].first_id == "000000000001" and chunks[-1].last_id == "000000000080"
    assert "[000000000001] role=user" in chunks[0].text  # whole serialised messages


def test_a_long_message_is_split_at_line_breaks_into_parts() -> None:
    lines = "\n".join(f"line {i} of a long tool output with words" for i in range(400))
    (long,) = ided([ToolMessage(tool_call_id="x", content=lines)])
    chunks = chunk_messages([long], COUNTER, 300, 30)
    assert len(chunks) > 3 and [c.part for c in chunks] == list(range(1, len(chunks) + 1))
    assert all(c.first_id == c.last_id == "000000000001" and c.tokens <= 300 for c in chunks)
    assert all(c.text.splitlines()[0].startswith(("line", "[000000000001]")) for c in chunks)


def test_a_chunk_head_fits_its_limit_and_ends_at_a_line() -> None:
    text = "\n".join(f"line {i} holds value {i * 7} and a path src/mod_{i}.py" for i in range(300))
    tokens = COUNTER.count_text(text)
    head, used = head_within(text, tokens, 500, COUNTER)
    assert used == COUNTER.count_text(head) <= 500 and used > 400
    assert text.startswith(head) and text[len(head)] == "\n"
    assert head_within(text, tokens, tokens, COUNTER) == (text, tokens)


def test_the_index_ranks_by_bm25_and_round_trips_through_bytes() -> None:
    _index, write = archive_messages(None, facts(30), COUNTER, ChunkingConfig(300, 30, 64))
    assert write is not None and write.version == 1 and write.chunks
    again = RecallIndex.from_bytes(write.index)
    hits = again.search(query_words("which port does alpha17 use"))
    assert hits and "alpha17" in hits[0].text and hits[0].score > 0
    # FTS5 syntax in a query is plain words, never an error.
    for query in ('"alpha3', "alpha3 NEAR port", "alpha* OR", "AND NOT ) ("):
        assert isinstance(again.search(query_words(query)), list)


def test_each_log_id_is_archived_once() -> None:
    messages = facts(20)
    index, first = archive_messages(None, messages[:30], COUNTER, ChunkingConfig(300, 30, 64))
    assert first is not None
    _, again = archive_messages(index, messages[:30], COUNTER, ChunkingConfig(300, 30, 64))
    assert again is None
    _, more = archive_messages(index, messages[20:], COUNTER, ChunkingConfig(300, 30, 64))
    assert more is not None and min(c.first_id for c in more.chunks) == "000000000031"


def test_recall_returns_at_most_two_chunks_within_the_limit_or_says_why() -> None:
    index, _ = archive_messages(None, facts(60), COUNTER, ChunkingConfig(300, 30, 64))
    answer = recall(index, "alpha42 gateway port", 2000, COUNTER)
    assert 1 <= len(answer.hits) <= 2 and sum(h.tokens for h in answer.hits) <= 2000
    assert "alpha42" in answer.hits[0].text
    assert len(recall(index, "alpha port note noted", 1_000_000, COUNTER).hits) == 2
    small = recall(index, "alpha42", 50, COUNTER)
    assert small.hits and small.hits[0].tokens <= 50  # the best chunk cut to fit
    miss = recall(index, "zebra quokka", 2000, COUNTER)
    assert not miss.hits and "broader" in miss.note
    assert "no archive" in recall(None, "alpha", 2000, COUNTER).note
    huge = recall(index, "alpha42 " * 200_000, 2000, COUNTER)
    assert huge.query_truncated and huge.hits


def coordinator(store: MemoryStateStore, log: MemoryMessageLog, budget: int) -> Coordinator:
    return Coordinator(
        store,
        log,
        COUNTER,
        lambda _key: ExtractiveModel(COUNTER),
        default_budget=budget,
        recall_for=lambda _key: ChunkingConfig(600, 60, 128),
    )


def compact(coord: Coordinator) -> None:
    for _ in range(16):
        stage = coord.plan(KEY)
        if stage is None:
            return
        coord.run_stage(KEY, stage)


def test_stages_archive_what_they_fold_with_the_state_and_mark_their_blocks() -> None:
    store, log = MemoryStateStore(), MemoryMessageLog()
    record = next(swe_runs())
    _, rest = logged(record["messages"])
    log.append(KEY, [m.model_copy(update={"context_message_id": None}) for m in rest])
    coord = coordinator(store, log, 8000)
    compact(coord)
    state = store.load(KEY)
    assert state is not None and state.blocks and state.archive_version >= 1
    chunks = store.archive_chunks(KEY)
    assert chunks and store.load_archive(KEY) is not None
    for block in state.blocks:
        text = message_text(block.messages[-1])
        assert text.splitlines()[-1] == f"{COMPRESSION_RECALL_PREFIX} id={block.first_id}-{block.last_id}]]"
    # Everything covered is archived exactly once: a rollback and a new compaction add nothing.
    count = len(chunks)
    assert store.rollback(KEY, 1, state.version)
    compact(coord)
    assert len(store.archive_chunks(KEY)) >= count
    index = RecallIndex.from_bytes(store.load_archive(KEY) or b"")
    assert index.chunk_count() == len(store.archive_chunks(KEY))
    # The service finds a folded command through the same index.
    settings = Settings.load({"recall": {"enabled": True}})
    service = ContextService(settings, store, log, None, InlineQueue(), counter=COUNTER)
    first_call = next(m for m in rest if isinstance(m, AssistantMessage) and m.tool_calls)
    command = json.loads(first_call.tool_calls[0].arguments)["command"]
    answer = service.recall(KEY, command, 3000)
    assert answer.hits and any(first_call.context_message_id <= h.last_id for h in answer.hits)


def test_recall_off_empty_queries_and_keys_are_refused_clearly() -> None:
    service = ContextService(Settings(), MemoryStateStore(), MemoryMessageLog(), None, InlineQueue())
    with pytest.raises(RecallDisabled, match=r"recall\.enabled"):
        service.recall(KEY, "x")
    on = ContextService(
        Settings.load({"recall": {"enabled": True}}),
        MemoryStateStore(),
        MemoryMessageLog(),
        None,
        InlineQueue(),
    )
    with pytest.raises(InvalidMessageError, match="query"):
        on.recall(KEY, "   ")
    with pytest.raises(InvalidMessageError, match="max_tokens"):
        on.recall(KEY, "x", 0)
    assert "no archive" in on.recall(KEY, "x").note
    with pytest.raises(InvalidKeyError):
        ConversationKey("tenant/a", "c")
    with pytest.raises(ConfigError, match="auto needs enabled"):
        Settings.load({"recall": {"auto": True}})
    with pytest.raises(ConfigError, match="chunk_overlap_tokens"):
        Settings.load({"recall": {"enabled": True, "chunk_size_tokens": 100, "chunk_overlap_tokens": 100}})


def test_tenants_never_share_an_archive() -> None:
    store, log = MemoryStateStore(), MemoryMessageLog()
    a, b = ConversationKey("tenant-a", "c"), ConversationKey("tenant_a", "c")
    _index, write = archive_messages(None, facts(10), COUNTER, ChunkingConfig())

    assert write is not None and store.save(a, CompressionState(archive_version=1), 0, archive=write)
    service = ContextService(Settings.load({"recall": {"enabled": True}}), store, log, None, InlineQueue())
    assert service.recall(a, "alpha3").hits
    assert not service.recall(b, "alpha3").hits


def embedded(tmp_path: Path | None = None) -> ContextEngine:
    return ContextEngine(
        {
            "context_window_tokens": 6000,
            "compression_recall_config": {
                "enabled": True,
                "chunk_size_tokens": 800,
                "chunk_overlap_tokens": 80,
            },
        },
        offload_store=FilesystemOffloadStore(tmp_path) if tmp_path is not None else None,
    )


def round_level() -> list[tuple[str, dict[str, object]]]:
    return [
        (
            "RoundLevelCompressor",
            {"trigger_total_tokens": 3500, "target_total_tokens": 3000, "model_client": ExtractiveModel()},
        )
    ]


def test_embedded_compressors_archive_mark_and_answer_the_tool(tmp_path: Path) -> None:
    engine = embedded(tmp_path)
    ctx = engine.create_context("chat", processors=round_level())
    ctx.add_messages([m.model_copy(update={"context_message_id": None}) for m in facts(50)])
    window = ctx.get_context_window()
    assert RECALL_TOOL_NAME in [t["function"]["name"] for t in window.get_tools()]
    text = "\n".join(message_text(m) for m in window.get_messages())
    assert COMPRESSION_RECALL_PREFIX in text
    answer = ctx.recall("alpha2 gateway port")
    assert answer.hits and "alpha2 " in answer.hits[0].text
    call = ToolCall(id="r1", name=RECALL_TOOL_NAME, arguments=json.dumps({"query": "alpha2 port"}))
    assert "alpha2" in execute_recall_tool(ctx, call.arguments)
    assert execute_recall_tool(ctx, "{}").startswith("error")
    # The archive survives save_state/load_state and lives under the store's root.
    state = ctx.save_state()
    assert state["archive"] and (tmp_path / "default" / "chat" / "archive.sqlite").exists()
    other = ContextEngine({"compression_recall_config": {"enabled": True}}).create_context(
        "chat", processors=round_level()
    )
    other.load_state(state)
    assert other.recall("alpha2 gateway port").hits
    # Recall off: a clear error.
    with pytest.raises(RecallDisabled, match="compression_recall_config"):
        ContextEngine().create_context("c").recall("x")


def test_the_filesystem_archive_refuses_a_symlink(tmp_path: Path) -> None:
    store = FilesystemOffloadStore(tmp_path / "root")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root" / "t").mkdir(parents=True)
    os.symlink(outside, tmp_path / "root" / "t" / "c")
    with pytest.raises(InvalidKeyError, match="symbolic link"):
        store.put_archive(ConversationKey("t", "c"), b"data")
    assert not list(outside.iterdir())


def test_embedded_auto_recall_spends_the_room_left_after_the_blocks() -> None:
    from ctxcore.markers import RECALLED_CONTEXT

    engine = ContextEngine(
        {
            "context_window_tokens": 6000,
            "compression_recall_config": {
                "enabled": True,
                "auto": True,
                "chunk_size_tokens": 400,
                "chunk_overlap_tokens": 40,
            },
        }
    )
    ctx = engine.create_context("chat", processors=round_level())
    ctx.add_messages([m.model_copy(update={"context_message_id": None}) for m in facts(50)])
    ctx.add_messages([UserMessage(content="remind me: which port does alpha3 use?")])
    window = ctx.get_context_window()
    messages = window.get_messages()
    recalled = [m for m in messages if message_text(m).startswith(RECALLED_CONTEXT)]
    assert len(recalled) == 1 and "alpha3" in message_text(recalled[0])
    assert COUNTER.count_messages(messages) + COUNTER.count_tools(window.get_tools()) <= 6000
    # Served only: the view never holds it.
    assert not any(message_text(m).startswith(RECALLED_CONTEXT) for m in ctx.get_messages())


def test_a_stage_whose_saving_the_archive_note_outweighs_is_not_saved() -> None:
    # With recall on each new block ends with the archive's note (~20 tokens). A re-summary
    # that saved fewer tokens than that counted as progress and ran again on the same view:
    # 1,198 calls of one pass in a 45-window tau-bench run.
    store = MemoryStateStore()
    tail = [
        UserMessage(content="Book the cheapest flight.", context_message_id="000000000001"),
        AssistantMessage(content="Searching flights " * 30, context_message_id="000000000002"),
        UserMessage(content="Thanks, go ahead.", context_message_id="000000000003"),
    ]
    view = View(version=0, tail=tuple(tail))
    text = "## Task state\n- assistant: Searching flights for the user."
    message = block_message(
        text,
        block_id="L1-000000000002-000000000002",
        first_id="000000000002",
        last_id="000000000002",
        level=1,
        scope="s",
    )
    block = SummaryBlock(
        block_id="L1-000000000002-000000000002",
        messages=[message.model_copy(update={"context_message_id": "000000000002"})],
        first_id="000000000002",
        last_id="000000000002",
    )
    unmarked = view.with_blocks([block], "000000000002").tokens(COUNTER)
    stage = Stage(kind="l0_to_l1", based_on_version=0, target_tokens=100)
    chunking = ChunkingConfig(600, 60, 128)

    def saved(before: int) -> str:
        result = StageResult(
            stage=stage,
            blocks=[block],
            covered_until="000000000002",
            pinned=["000000000001"],
            changed=True,
            tokens_before=before,
            tokens_after=unmarked,
        )
        state = store.load(KEY) or CompressionState()
        return save_result(store, KEY, view, state, stage, result, chunking, COUNTER).outcome

    assert saved(unmarked + 5) == "skipped" and store.load(KEY) is None
    assert saved(unmarked + 200) == "compressed"
    state = store.load(KEY)
    assert state is not None and COMPRESSION_RECALL_PREFIX in message_text(state.blocks[0].messages[-1])


def test_an_embedded_compression_the_archive_note_outweighs_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The embedded compressor marks its new blocks after the passes measured them; a result
    # the note makes no smaller than before is no compression (and archives nothing), as a
    # service stage is not saved. A note larger than any saving stands in for the case.
    def huge_note(block: SummaryBlock) -> SummaryBlock:
        *head, last = block.messages
        note = message_text(last) + "\n" + "archived " * 5000
        return block.model_copy(update={"messages": [*head, last.model_copy(update={"content": note})]})

    monkeypatch.setattr(round_level_module, "mark_archived", huge_note)
    ctx = embedded().create_context("chat", processors=round_level())
    messages = [m.model_copy(update={"context_message_id": None}) for m in facts(50)]
    ctx.add_messages(messages)
    window = ctx.get_context_window()
    text = "\n".join(message_text(m) for m in window.get_messages())
    assert "archived archived" not in text
    assert not ctx.recall("alpha2 gateway port").hits
