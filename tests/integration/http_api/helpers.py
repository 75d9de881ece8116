"""What the HTTP API tests share: the tenants' tokens, a client with its runtime and queue,
settings for a key prefix of its own, and message dicts."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from workers.runtime import Runtime
from workers.service import InlineQueue

TOKEN_A = "secret-token-of-tenant-a"
TOKEN_B = "secret-token-of-tenant-b"
AUTH_A = {"Authorization": f"Bearer {TOKEN_A}"}
AUTH_B = {"Authorization": f"Bearer {TOKEN_B}"}
CONV = "/v1/conversations"


class Api:
    """A test client plus the runtime and queue behind it."""

    def __init__(self, client: TestClient, runtime: Runtime, queue: InlineQueue) -> None:
        self.client = client
        self.runtime = runtime
        self.queue = queue

    def append(self, conv: str, messages: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
        return self.client.post(
            f"{CONV}/{conv}/messages", json={"messages": messages}, headers=headers or AUTH_A
        )


def settings_for(url: str, prefix: str, **overrides: Any) -> Settings:
    """Two tenants' tokens on ``url`` under ``prefix``; ``overrides`` are settings sections."""
    data: dict[str, Any] = {
        "redis": {"url": url, "key_prefix": prefix},
        "http": {"tokens": {hash_token(TOKEN_A): "tenant-a", hash_token(TOKEN_B): "tenant-b"}},
    }
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    return Settings.load(data)


def user(text: str, **extra: Any) -> dict[str, Any]:
    """A user message dict."""
    return {"role": "user", "content": text, **extra}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    """An assistant message dict."""
    return {"role": "assistant", "content": text, **extra}
