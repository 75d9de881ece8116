"""Every store refuses crafted ids and handles before touching its backend, and distinct
conversations never share a Redis key."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from ctxcore.errors import ConfigError, InvalidKeyError
from ctxcore.messages import UserMessage
from ctxcore.state import (
    ConversationKey,
    FilesystemOffloadStore,
    MemoryMessageLog,
    MemoryOffloadStore,
    MemoryStateStore,
    RedisMessageLog,
    RedisOffloadStore,
    RedisStateStore,
    SqlMessageLog,
    SqlOffloadStore,
    SqlStateStore,
)
from tests.security.crafted import CRAFTED

pytestmark = [pytest.mark.security]


def _stores(kind: str, tmp_path: Path, redis_url: str) -> list[Any]:
    if kind == "memory":
        return [MemoryStateStore(), MemoryMessageLog(), MemoryOffloadStore()]
    if kind == "filesystem":
        return [FilesystemOffloadStore(tmp_path / "offloads")]
    if kind == "redis":
        client = redis.Redis.from_url(redis_url)
        prefix = f"sec{uuid.uuid4().hex[:6]}"
        return [
            RedisStateStore(client, prefix),
            RedisMessageLog(client, prefix),
            RedisOffloadStore(client, prefix),
        ]
    url = f"sqlite:///{tmp_path / 'sec.db'}"
    stores = [SqlStateStore(url), SqlMessageLog(url), SqlOffloadStore(url)]
    for store in stores:
        store.setup()
    return stores


@pytest.mark.parametrize(
    "kind", ["memory", "filesystem", pytest.param("redis", marks=pytest.mark.redis), "sqlite"]
)
def test_every_store_refuses_crafted_ids_and_handles(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    redis_url = request.getfixturevalue("redis_url") if kind == "redis" else ""
    stores = _stores(kind, tmp_path, redis_url)
    for raw in CRAFTED:
        with pytest.raises(InvalidKeyError):
            ConversationKey(raw, "c")
        with pytest.raises(InvalidKeyError):
            ConversationKey("t", raw)
        for store in stores:
            if hasattr(store, "list_conversations"):
                with pytest.raises(InvalidKeyError):
                    store.list_conversations(raw)
    key = ConversationKey("t", "c")
    for store in stores:
        if hasattr(store, "put_if_absent"):
            for handle in ("../../etc/passwd", "..", "ABCDEF0123", "a/b/c/d/e", "0" * 65, ""):
                with pytest.raises(InvalidKeyError):
                    store.put_if_absent(key, handle, [UserMessage(content="x")])
                with pytest.raises(InvalidKeyError):
                    store.get(key, handle)
    if kind == "filesystem":
        assert not any(
            p
            for p in tmp_path.rglob("*")
            if tmp_path / "offloads" not in p.parents and p != tmp_path / "offloads"
        )
    if kind == "redis":
        with pytest.raises(ConfigError):
            RedisStateStore(stores[0].client, prefix="x{evil}")


@given(
    a=st.from_regex(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
    b=st.from_regex(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
    c=st.from_regex(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
    d=st.from_regex(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
)
def test_distinct_conversations_never_share_a_redis_key(a: str, b: str, c: str, d: str) -> None:
    if (a, b) == (c, d):
        return
    one, two = ConversationKey(a, b), ConversationKey(c, d)
    assert one.hash_tag != two.hash_tag
    store = RedisStateStore.__new__(RedisStateStore)
    store.prefix = "p"
    assert store._key(one, "log") != store._key(two, "log")
