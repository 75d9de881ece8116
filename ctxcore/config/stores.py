"""The store sections: ``redis`` and ``database``."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, field_validator

from ctxcore.config.base import STRICT
from ctxcore.errors import ConfigError

__all__ = ["DatabaseSettings", "RedisSettings"]

_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5}")


class RedisSettings(BaseModel):
    """Redis: broker, locks, fast-path state and log.

    With ``cluster_nodes`` (``host:port`` seeds, a list or one comma-separated string) every
    ctxcore key lives on that Redis Cluster and ``url`` names only Celery's broker and result
    backend, a plain Redis (kombu's Redis transport has no cluster mode).
    """

    model_config = STRICT
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="ctxcore", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    socket_timeout: float = Field(default=5.0, gt=0)
    cluster_nodes: tuple[str, ...] = ()

    @field_validator("cluster_nodes", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        for node in value if isinstance(value, list | tuple) else ():
            if not isinstance(node, str) or _HOST_PORT.fullmatch(node) is None:
                raise ConfigError(f"cluster node {node!r} is not host:port (e.g. 127.0.0.1:7000)")
        return value


class DatabaseSettings(BaseModel):
    """Optional SQL storage of state, log and offloads (``url`` None: Redis holds them)."""

    model_config = STRICT
    url: str | None = None
    table_prefix: str = Field(default="ctxcore_", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,30}$")
