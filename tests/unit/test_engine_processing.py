"""Running processors: hooks, failure isolation, state events, active compression (overflow
recovery is in ``test_overflow_recovery.py``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import ctxcore.engine.store as engine_store
from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.errors import ConfigError, CtxcoreError
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.processors import (
    CompressionStateEvent,
    ContextEvent,
    ContextProcessor,
    ProcessorConfig,
    ProcessorRegistry,
)
from ctxcore.processors.events import HISTORY_LIMIT
from tests.unit.engine_processors import (
    Blocker,
    Recorder,
    TagConfig,
    Tagger,
    make,
    registry_with_test_processors,
)


@pytest.fixture
def registry() -> ProcessorRegistry:
    return registry_with_test_processors()


# --- add pipeline ---------------------------------------------------------------------


def test_add_hooks_run_in_order_and_feed_each_other(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("Tagger", {"tag": "a"}), ("Tagger", {"tag": "b"})])
    ctx.add_messages(UserMessage(content="hi"))
    assert ctx.get_messages()[0].content == "hi+a+b"
    assert ctx.get_raw_messages()[0].content == "hi"
    assert ctx.get_messages()[0].context_message_id == ctx.get_raw_messages()[0].context_message_id


def test_a_failing_processor_is_skipped_reported_and_listed(registry: ProcessorRegistry) -> None:
    ctx = make(
        registry,
        [("Tagger", {"tag": "a"}), ("Tagger", {"tag": "bad", "fail": True}), ("Tagger", {"tag": "c"})],
    )
    ctx.add_messages(UserMessage(content="hi"))
    assert ctx.get_messages()[0].content == "hi+a+c"
    assert [(f.processor, f.phase, str(f.error)) for f in ctx.last_failures] == [
        ("Tagger", "add_messages", "boom bad")
    ]
    failed = [s for s in ctx.compression_states if s.status == "failed"]
    assert failed[0].reason == "processor_error" and "boom bad" in failed[0].error
    assert failed[0].summary.startswith("Context processor failed")
    ctx.add_messages(UserMessage(content="again"))
    assert len(ctx.last_failures) == 1  # failures are per operation


def test_strict_processors_raise_after_the_add_completed(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("Tagger", {"fail": True}), ("Tagger", {"tag": "ok"})], strict_processors=True)
    with pytest.raises(RuntimeError, match="boom"):
        ctx.add_messages(UserMessage(content="hi"))
    assert ctx.get_messages()[0].content == "hi+ok"


def test_cancellation_is_reported_and_re_raised_without_losing_the_batch(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("Tagger", {"tag": "a"}), ("Tagger", {"cancel": True})])
    with pytest.raises(KeyboardInterrupt):
        ctx.add_messages(UserMessage(content="hi"))
    assert ctx.compression_states[-1].status == "failed"
    assert ctx.compression_states[-1].reason == "processor_cancelled"
    assert [m.content for m in ctx.get_messages()] == ["hi+a"]
    assert len(ctx.get_raw_messages()) == 1


def test_cancellation_in_a_window_hook_is_reported_and_re_raised(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("WindowCanceller", None)])
    ctx.add_messages(UserMessage(content="hi"))
    with pytest.raises(asyncio.CancelledError):
        ctx.get_context_window()
    assert (ctx.compression_states[-1].status, ctx.compression_states[-1].phase) == (
        "failed",
        "get_context_window",
    )


def test_triggered_processor_emits_a_started_completed_pair_with_sizes(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("Tagger", {"tag": "longer tag"})])
    ctx.add_messages(UserMessage(content="hi"))
    started, completed = ctx.compression_states
    assert (started.status, completed.status) == ("started", "completed")
    assert started.operation_id == completed.operation_id
    assert started.summary.startswith("Compressing 1 messages")
    assert completed.before is not None and completed.after is not None
    assert completed.after.tokens > completed.before.tokens
    assert completed.summary.endswith("modified 1 messages")
    assert completed.to_dict()["type"] == "context.compression_state"


def test_state_history_is_bounded_and_subscribers_cannot_break_it(registry: ProcessorRegistry) -> None:
    eng = ContextEngine(registry=registry)
    seen: list[CompressionStateEvent] = []
    eng.subscribe(seen.append)
    ctx = eng.create_context("c", processors=[("Tagger", None)])

    def broken(event: CompressionStateEvent) -> None:
        raise ValueError("subscriber bug")

    ctx.subscribe(broken)
    for i in range(60):
        ctx.add_messages(UserMessage(content=str(i)))
    assert len(seen) == 120
    assert len(ctx.compression_states) == HISTORY_LIMIT
    assert ctx.compression_states[-1] == seen[-1]


# --- registry -------------------------------------------------------------------------


def test_unknown_processor_and_failing_constructor_raise_config_errors(registry: ProcessorRegistry) -> None:
    with pytest.raises(ConfigError, match="cannot find processor type 'Nope'"):
        make(registry, [("Nope", None)])

    class Exploding(ContextProcessor[ProcessorConfig]):
        def __init__(self, config: Any = None) -> None:
            raise OSError("no disk")

    registry.register(Exploding)
    with pytest.raises(ConfigError, match="init processor type 'Exploding' failed: no disk"):
        make(registry, [("Exploding", None)])
    with pytest.raises(ConfigError, match="Tagger: invalid config: field 'colour'"):
        make(registry, [("Tagger", {"colour": "red"})])


def test_register_takes_an_optional_name_and_decorates_a_class() -> None:
    mine = ProcessorRegistry()

    class Named(ContextProcessor[ProcessorConfig]):
        pass

    assert mine.register(Named, name="TestOnlyNamed") is Named
    assert mine.get("TestOnlyNamed") is Named and "Named" not in mine
    # The name belongs to that registry: the class and other registries are unchanged.
    assert Named.processor_type() == "Named"
    other = ProcessorRegistry()
    other.register(Named, name="TestOnlyOther")
    assert other.names() == ["TestOnlyOther"] and mine.names() == ["TestOnlyNamed"]

    engine = ContextEngine()

    @engine.registry.register
    class TestOnlyEngine(ContextProcessor[ProcessorConfig]):
        pass

    assert engine.registry.get("TestOnlyEngine") is TestOnlyEngine
    assert "TestOnlyEngine" not in ContextEngine().registry


# --- active compression ---------------------------------------------------------------


def test_compress_runs_offloaders_then_compressors_and_never_views(registry: ProcessorRegistry) -> None:
    ctx = make(
        registry,
        [
            ("Recorder", {"tag": "compressor"}),
            ("ViewRecorder", {"tag": "view"}),
            ("OffloadRecorder", {"tag": "off"}),
        ],
    )
    ctx.add_messages([UserMessage(content=str(i)) for i in range(4)])
    assert ctx.compress_context() == "compressed"
    assert Recorder.order == ["off", "compressor"]
    assert [m.content for m in ctx.get_messages()] == ["2", "3"]
    assert len(ctx.get_raw_messages()) == 4
    completed = [s for s in ctx.compression_states if s.status == "completed"]
    assert all(s.phase == "active_compress" and s.trigger == "manual" for s in completed)
    assert completed[-1].compact_summary == "summary compressor"


def test_compress_allowlist_selects_by_processor_type(registry: ProcessorRegistry) -> None:
    ctx = make(registry, [("Recorder", {"tag": "a"}), ("OffloadRecorder", {"tag": "b"})])
    ctx.add_messages([UserMessage(content="x"), UserMessage(content="y")])
    assert ctx.compress_context(processor_types=["Recorder"]) == "compressed"
    assert Recorder.order == ["a"]
    assert ctx.compress_context(processor_types=["MicroCompactProcessor"]) == "noop"
    assert ctx.compression_states[-1].status == "skipped"
    assert ctx.compression_states[-1].reason == "no_matching_processor"


def test_compress_is_noop_when_nothing_changes_and_keeps_the_callers_trigger(
    registry: ProcessorRegistry,
) -> None:
    ctx = make(registry, [("Recorder", {"fail": True})])
    ctx.add_messages(UserMessage(content="x"))
    assert ctx.compress_context(compression_trigger="") == "noop"
    assert (ctx.compression_states[-1].status, ctx.compression_states[-1].trigger) == ("noop", "")


def test_compress_is_busy_while_a_processor_runs_and_adds_bypass_processors_during_it(
    registry: ProcessorRegistry,
) -> None:
    blocker = Blocker()
    ctx = ContextEngine(registry=registry).create_context(
        "c", processors=[blocker, Tagger(TagConfig(tag="t"))]
    )
    worker = threading.Thread(target=ctx.add_messages, args=(UserMessage(content="slow"),))
    worker.start()
    assert blocker.entered.wait(5)
    assert ctx.compress_context() == "busy"
    assert ctx.compression_states[-1].reason == "busy"
    blocker.release.set()
    worker.join(5)

    # During an active compression, adds are logged at once and join the view unprocessed.
    class Adding(ContextProcessor[ProcessorConfig]):
        def on_compress(
            self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any
        ) -> tuple[ContextEvent | None, list[AnyMessage]]:
            adder = threading.Thread(target=ctx.add_messages, args=(UserMessage(content="during"),))
            adder.start()
            adder.join(5)
            assert ctx.get_raw_messages()[-1].content == "during"
            assert all(m.content != "during" for m in ctx.get_messages())
            return ContextEvent("Adding"), messages

    other = ContextEngine(registry=registry).create_context(
        "d", processors=[Adding(), Tagger(TagConfig(tag="t"))]
    )
    other.add_messages(UserMessage(content="before"))
    assert other.compress_context() == "compressed"
    assert [m.content for m in other.get_messages()] == ["before+t", "during"]


def test_hooks_of_one_context_never_overlap_and_a_blocked_add_is_logged(
    registry: ProcessorRegistry, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(engine_store, "LOCK_WARN_SECONDS", 0.05)
    blocker = Blocker()
    ctx = ContextEngine(registry=registry).create_context("c", processors=[blocker])
    first = threading.Thread(target=ctx.add_messages, args=(UserMessage(content="1"),))
    first.start()
    assert blocker.entered.wait(5)
    blocker.entered.clear()
    second = threading.Thread(target=ctx.add_messages, args=(UserMessage(content="2"),))
    with caplog.at_level(logging.WARNING, logger="ctxcore.engine"):
        second.start()
        time.sleep(0.2)
        assert not blocker.entered.is_set()  # the second add waits for the first
        blocker.release.set()
        first.join(5)
        second.join(5)
    assert any("waiting" in r.getMessage() for r in caplog.records)
    assert [m.content for m in ctx.get_messages()] == ["1", "2"]


def test_engine_compress_context_needs_an_existing_context(registry: ProcessorRegistry) -> None:
    eng = ContextEngine(registry=registry)
    with pytest.raises(CtxcoreError, match="no context"):
        eng.compress_context("missing")
    eng.create_context("c", processors=[("Recorder", None)]).add_messages(
        [UserMessage(content="a"), UserMessage(content="b")]
    )
    assert eng.compress_context("c") == "compressed"
