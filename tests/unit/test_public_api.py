"""The public API of ``ctxcore`` is pinned, and importing the package stays cheap."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import ctxcore
from ctxcore import errors

PINNED = [
    "ApiError",
    "AssistantMessage",
    "AsyncCtxcoreClient",
    "AsyncModelContext",
    "AuthenticationError",
    "BudgetExceeded",
    "ConfigError",
    "ConflictError",
    "ContextEngine",
    "ContextEngineConfig",
    "ContextStats",
    "ContextWindow",
    "Coordinator",
    "CtxcoreClient",
    "CtxcoreError",
    "CursorNotFoundError",
    "ErrorKind",
    "EstimateCounter",
    "InvalidKeyError",
    "InvalidMessageError",
    "InvalidRequestError",
    "InvalidWindowError",
    "ModelContext",
    "ModelError",
    "NotFoundError",
    "OperationFailed",
    "QuotaExceeded",
    "RateLimited",
    "RecallDisabled",
    "StoreError",
    "StoreUnavailable",
    "SystemMessage",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "ToolMessage",
    "TruncateRefused",
    "UnsupportedItemError",
    "UsageError",
    "UserMessage",
    "VersionNotKept",
    "Violation",
    "assemble_window",
    "check_window",
    "close_interrupted_tool_calls",
    "from_openai",
    "to_openai",
]


def test_all_is_pinned() -> None:
    # Adding or removing a public name is a decision: change PINNED with it.
    assert ctxcore.__all__ == PINNED


def test_every_public_name_resolves_to_its_defining_object() -> None:
    from ctxcore.assemble import assemble_window
    from ctxcore.client import AsyncCtxcoreClient, CtxcoreClient
    from ctxcore.coordinator import Coordinator
    from ctxcore.engine import AsyncModelContext, ContextEngine, ContextEngineConfig, ModelContext

    expected = {
        "assemble_window": assemble_window,
        "AsyncCtxcoreClient": AsyncCtxcoreClient,
        "CtxcoreClient": CtxcoreClient,
        "Coordinator": Coordinator,
        "AsyncModelContext": AsyncModelContext,
        "ContextEngine": ContextEngine,
        "ContextEngineConfig": ContextEngineConfig,
        "ModelContext": ModelContext,
    }
    for name in PINNED:
        value = getattr(ctxcore, name)
        assert value is not None, name
        if name in expected:
            assert value is expected[name], name
    assert set(PINNED) <= set(dir(ctxcore))


def test_every_error_of_the_tree_is_public() -> None:
    tree = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, errors.CtxcoreError)
        and value.__module__ == errors.__name__
    }
    assert tree <= set(PINNED)
    for name in tree:
        assert getattr(ctxcore, name) is getattr(errors, name)


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = ctxcore.Nope


def test_import_ctxcore_loads_no_client_library_or_engine() -> None:
    heavy = ("openai", "redis", "sqlalchemy", "ctxcore.engine")
    code = f"import sys, ctxcore; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
