"""The processor registry: name -> processor class.

``REGISTRY`` is the default registry and the one module-level mutable object of the
processors package; built-ins add themselves when ``ctxcore.processors`` is imported, other
modules with ``@register_processor`` (``ContextEngine.register_processor``). Each new
``ContextEngine`` copies it, so ``engine.registry.register()`` affects that engine only; a
``ProcessorRegistry`` passed to ``ContextEngine`` is used as it is (tests, plugins).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ctxcore.errors import ConfigError
from ctxcore.processors.base import ContextProcessor

__all__ = ["REGISTRY", "ProcessorRegistry", "register_processor"]


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
        raise ConfigError(
            f"cannot find processor type {name!r}; registered: {', '.join(self.names())}. Register it "
            "on this engine (engine.registry.register) or with @ContextEngine.register_processor "
            "before the engine is created (each engine copies the default registry then)"
        )

    def copy(self) -> ProcessorRegistry:
        """A new registry holding what this one (and its parent) holds now; later
        registrations on either side stay on that side."""
        copied = ProcessorRegistry()
        if self._parent is not None:
            copied._classes.update(self._parent.copy()._classes)
        with self._lock:
            copied._classes.update(self._classes)
        return copied

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


P = TypeVar("P", bound=type[ContextProcessor[Any]])


@overload
def register_processor(
    cls: P, /, *, name: str | None = None, registry: ProcessorRegistry | None = None
) -> P: ...


@overload
def register_processor(
    *, name: str | None = None, registry: ProcessorRegistry | None = None
) -> Callable[[P], P]: ...


def register_processor(
    cls: P | None = None, /, *, name: str | None = None, registry: ProcessorRegistry | None = None
) -> P | Callable[[P], P]:
    """Class decorator adding a processor to a registry (the engine's by default).

    Usable bare (``@register_processor``), with arguments
    (``@register_processor(name="MyCompressor")``) or as a call
    (``register_processor(MyCompressor, registry=mine)``). Registering a name again replaces the
    previous class, so a module can override a built-in deliberately.
    """

    def decorate(target: P) -> P:
        if name is not None:
            target._processor_type = name  # type: ignore[attr-defined]
        (registry or REGISTRY).register(target)
        return target

    return decorate(cls) if cls is not None else decorate
