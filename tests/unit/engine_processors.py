"""Processors the engine tests run: a tagger, a window canceller, recorders of the order hooks
run in, a blocker; and a registry with them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

from ctxcore.engine import ContextEngine, ModelContext
from ctxcore.messages import AnyMessage, replace_content
from ctxcore.processors import (
    ContextEvent,
    ContextProcessor,
    ProcessorConfig,
    ProcessorRegistry,
    builtin_registry,
)
from ctxcore.window import ContextWindow


class TagConfig(ProcessorConfig):
    tag: str = "x"
    fail: bool = False
    cancel: bool = False


class Tagger(ContextProcessor[TagConfig]):
    """Appends its tag to every added user message (a visible, checkable rewrite)."""

    config_model = TagConfig
    kind = "compressor"
    calls: ClassVar[list[str]] = []

    def trigger_add_messages(self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any) -> bool:
        return True

    def on_add_messages(
        self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        Tagger.calls.append(self.config.tag)
        if self.config.cancel:
            raise KeyboardInterrupt
        if self.config.fail:
            raise RuntimeError(f"boom {self.config.tag}")
        out = [
            replace_content(m, f"{m.content}+{self.config.tag}") if m.role == "user" else m for m in messages
        ]
        return ContextEvent(self.processor_type(), messages_to_modify=[0]), out


class WindowCanceller(ContextProcessor[ProcessorConfig]):
    kind = "view"

    def trigger_get_context_window(self, ctx: ModelContext, window: ContextWindow, **kwargs: Any) -> bool:
        return True

    def on_get_context_window(
        self, ctx: ModelContext, window: ContextWindow, **kwargs: Any
    ) -> tuple[ContextEvent | None, ContextWindow]:
        raise asyncio.CancelledError


class Recorder(ContextProcessor[TagConfig]):
    """Records active-compression order; drops the oldest message when compressing."""

    config_model = TagConfig
    order: ClassVar[list[str]] = []

    def on_compress(
        self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        Recorder.order.append(self.config.tag)
        assert kwargs["force"] is True
        if self.config.fail:
            return None, messages
        return ContextEvent(self.processor_type(), compact_summary=f"summary {self.config.tag}"), messages[1:]


class OffloadRecorder(Recorder):
    kind = "offloader"


class ViewRecorder(Recorder):
    kind = "view"


class Blocker(ContextProcessor[ProcessorConfig]):
    """Holds the processor lock inside its add hook until released."""

    kind = "compressor"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.entered = threading.Event()
        self.release = threading.Event()

    def trigger_add_messages(self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any) -> bool:
        return True

    def on_add_messages(
        self, ctx: ModelContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        self.entered.set()
        assert self.release.wait(5)
        return None, messages


def registry_with_test_processors() -> ProcessorRegistry:
    """The built-in registry plus the test processors, their records cleared."""
    reg = builtin_registry()
    for cls in (Tagger, WindowCanceller, Recorder, OffloadRecorder, ViewRecorder):
        reg.register(cls)
    Tagger.calls.clear()
    Recorder.order.clear()
    return reg


def make(registry: ProcessorRegistry, processors: list[Any], **config: Any) -> ModelContext:
    """A context named ``c`` with ``processors``."""
    return ContextEngine(config, registry=registry).create_context("c", processors=processors)
