"""The Python client of ctxcore's HTTP API: ``CtxcoreClient`` (blocking) and ``AsyncCtxcoreClient``.

Requests and responses are the pydantic models of ``ctxcore.client.models`` (the server
serves the same ones); errors are ``CtxcoreError``s with the HTTP ``status`` and ``code``.
"""

from ctxcore.client.aio import AsyncCtxcoreClient
from ctxcore.client.models import (
    AppendResponse,
    CompactResponse,
    StateResponse,
    TruncateResponse,
    UsageResponse,
    WindowResponse,
)
from ctxcore.client.retry import RetryPolicy
from ctxcore.client.sync import CtxcoreClient

Window = WindowResponse
"""The window a client gets: ``window.openai_messages()`` and ``window.tools`` go to the model."""

__all__ = [
    "AppendResponse",
    "AsyncCtxcoreClient",
    "CompactResponse",
    "CtxcoreClient",
    "RetryPolicy",
    "StateResponse",
    "TruncateResponse",
    "UsageResponse",
    "Window",
    "WindowResponse",
]
