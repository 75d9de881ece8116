"""Test helpers shipped with the library (standard library only, no test framework needed).

``OpenAIServer`` is a real local OpenAI-compatible endpoint with scripted faults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxcore.testing.openai_server import FAULT_KINDS, OpenAIServer

__all__ = ["FAULT_KINDS", "OpenAIServer"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that ``python -m ctxcore.testing.openai_server`` does not find
    # its own module already imported by this package (runpy warns about that).
    if name in __all__:
        from ctxcore.testing import openai_server

        return getattr(openai_server, name)
    raise AttributeError(f"module 'ctxcore.testing' has no attribute {name!r}")
