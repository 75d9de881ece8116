"""The processor registry: name -> processor class.

``REGISTRY`` is the one module-level mutable object of the processors package; built-ins
add themselves when ``ctxcore.processors`` is imported, other modules with
``@register_processor``. A separate ``ProcessorRegistry`` can be passed to
``ContextEngine`` to isolate a set of processors (tests, plugins).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ctxcore.errors import ConfigError

if TYPE_CHECKING:
    from ctxcore.processors.base import ContextProcessor

__all__ = ["REGISTRY", "ProcessorRegistry"]


class ProcessorRegistry:
    """A thread-safe mapping of processor type names to classes."""

    def __init__(self, parent: ProcessorRegistry | None = None) -> None:
        self._classes: dict[str, type[ContextProcessor[Any]]] = {}
        self._parent = parent
        self._lock = threading.Lock()

    def register(self, cls: type[ContextProcessor[Any]]) -> None:
        """Add ``cls`` under its ``processor_type()`` (replacing any earlier class)."""
        with self._lock:
            self._classes[cls.processor_type()] = cls

    def get(self, name: str) -> type[ContextProcessor[Any]]:
        """The class registered as ``name`` (here or in the parent registry).

        Raises:
            ConfigError: no processor of that name is registered.
        """
        with self._lock:
            found = self._classes.get(name)
        if found is not None:
            return found
        if self._parent is not None:
            return self._parent.get(name)
        raise ConfigError(f"cannot find processor type {name!r}; registered: {', '.join(self.names())}")

    def names(self) -> list[str]:
        """All registered names, sorted."""
        with self._lock:
            own = set(self._classes)
        return sorted(own | set(self._parent.names() if self._parent else ()))

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
        try:
            return isinstance(name, str) and self.get(name) is not None
        except ConfigError:
            return False


REGISTRY = ProcessorRegistry()
