"""The processor registry: name -> processor class, one per engine.

There is no process-wide registry: ``builtin_registry()`` builds a new one holding the
built-in processors, which each ``ContextEngine`` takes unless it is given its own; a
processor of yours is registered on the engine that is to build it
(``engine.registry.register(cls)``, also a class decorator).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, TypeVar

from ctxcore.errors import ConfigError
from ctxcore.processors.base import ContextProcessor
from ctxcore.processors.compact_tool_turns import CompactCompletedToolTurns
from ctxcore.processors.current_round import CurrentRoundCompressor
from ctxcore.processors.dialogue import DialogueCompressor
from ctxcore.processors.message_offloader import MessageOffloader
from ctxcore.processors.micro_compact import MicroCompactProcessor
from ctxcore.processors.round_level import RoundLevelCompressor
from ctxcore.processors.summary_offloader import MessageSummaryOffloader
from ctxcore.processors.tool_result_budget import ToolResultBudgetProcessor
from ctxcore.processors.tool_result_cap import ToolResultCap
from ctxcore.processors.tool_result_window import ToolResultWindowProcessor
from ctxcore.processors.window_limit import WindowLimit

__all__ = ["BUILT_INS", "ProcessorRegistry", "builtin_registry"]

P = TypeVar("P", bound=type[ContextProcessor[Any]])

BUILT_INS: tuple[type[ContextProcessor[Any]], ...] = (
    CompactCompletedToolTurns,
    CurrentRoundCompressor,
    DialogueCompressor,
    MessageOffloader,
    MessageSummaryOffloader,
    MicroCompactProcessor,
    RoundLevelCompressor,
    ToolResultBudgetProcessor,
    ToolResultCap,
    ToolResultWindowProcessor,
    WindowLimit,
)
"""Every processor ctxcore ships, in every engine's registry."""


class ProcessorRegistry:
    """A thread-safe mapping of processor type names to classes."""

    def __init__(self, classes: Iterable[type[ContextProcessor[Any]]] = ()) -> None:
        self._classes = {cls.processor_type(): cls for cls in classes}
        self._lock = threading.Lock()

    def register(self, cls: P, *, name: str | None = None) -> P:
        """Add ``cls`` to this registry under ``name``, else its ``processor_type()``,
        replacing any earlier class: so an engine can override a built-in deliberately. The
        class is not changed (another registry may hold it under another name). Returns
        ``cls``, so it also decorates a class (``@engine.registry.register``)."""
        with self._lock:
            self._classes[name if name is not None else cls.processor_type()] = cls
        return cls

    def get(self, name: str) -> type[ContextProcessor[Any]]:
        """The class registered as ``name``.

        Raises:
            ConfigError: no processor of that name is registered.
        """
        with self._lock:
            found = self._classes.get(name)
        if found is not None:
            return found
        raise ConfigError(
            f"cannot find processor type {name!r}; registered: {', '.join(self.names())}. Register it "
            "on this engine (engine.registry.register) or pass ContextEngine a registry holding it"
        )

    def names(self) -> list[str]:
        """All registered names, sorted."""
        with self._lock:
            return sorted(self._classes)

    def create(self, name: str, config: Any = None) -> ContextProcessor[Any]:
        """Instantiate processor ``name`` with ``config`` (a config model, a dict or None).

        Raises:
            ConfigError: unknown name, invalid config, or a constructor that failed.
        """
        cls = self.get(name)
        try:
            return cls(config)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"init processor type {name!r} failed: {exc}") from exc

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return isinstance(name, str) and name in self._classes


def builtin_registry() -> ProcessorRegistry:
    """A new registry holding the built-in processors (``BUILT_INS``)."""
    return ProcessorRegistry(BUILT_INS)
