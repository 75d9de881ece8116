"""Server time of the web inspector's pages (``workers.ui``) for a big conversation.

The issue's goal: a conversation page of 2,000 messages and 20 kept versions renders in
<= 1 s of server time. The app runs in-process (Starlette's test client: no network), on
Redis db 0 with a unique key prefix (deleted at the end). Prints the median and worst of
``--repeat`` renders of each page. ``--long``: 10,000 messages.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis
from fastapi.testclient import TestClient

from ctxcore.config import Settings, hash_token
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import CompressionState, ConversationKey, SummaryBlock
from ctxcore.state.base import format_log_id
from workers.http import create_app
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime
from workers.service import InlineQueue

TOKEN = "bench-ui-token"


def _fill(rt: Runtime, key: ConversationKey, messages: int, versions: int) -> None:
    batch = []
    for i in range(messages // 4):
        batch += [
            UserMessage(content=f"step {i}: " + "words " * 40),
            AssistantMessage(content=None, tool_calls=[ToolCall(id=f"c{i}", name="grep")]),
            ToolMessage(content="output line\n" * 30, tool_call_id=f"c{i}"),
            AssistantMessage(content=f"answer {i} " + "more words " * 30),
        ]
    for start in range(0, len(batch), 500):
        rt.log.append(key, batch[start : start + 500])
    per = messages // (versions + 1)
    for v in range(versions):
        blocks = [
            SummaryBlock(
                block_id=f"v{v}-b{b}",
                messages=[UserMessage(content=f"summary {b} of version {v} " + "gist " * 80)],
                first_id=format_log_id(b * per // 2 + 1),
                last_id=format_log_id((b + 1) * per // 2),
                tokens_before=4000,
                tokens_after=300,
            )
            for b in range(min(v + 1, 10))
        ]
        state = CompressionState(covered_until=format_log_id((v + 1) * per), blocks=blocks)
        assert rt.state_store.save(key, state, v)


def _time(client: TestClient, url: str, repeat: int) -> tuple[float, float]:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        r = client.get(url)
        seconds.append(time.perf_counter() - started)
        assert r.status_code == 200, (url, r.status_code)
    return statistics.median(seconds), max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--long", action="store_true", help="10,000 messages")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    messages, versions = (10_000 if args.long else 2_000), 20
    prefix = f"benchui{uuid.uuid4().hex[:8]}"
    settings = Settings.load(
        {
            "redis": {"url": "redis://127.0.0.1:6379/0", "key_prefix": prefix},
            # Pages count against the tenant's request rate: a bucket the repeats never empty.
            "http": {"tokens": {hash_token(TOKEN): "acme"}, "requests_per_second": 10_000, "burst": 10_000},
        }
    )
    rt = Runtime(settings)
    key = ConversationKey("acme", "big")
    try:
        _fill(rt, key, messages, versions)
        client = TestClient(create_app(rt, InlineQueue()), base_url="http://bench.local")
        assert client.post("/ui/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
        print(f"conversation: {messages} messages, {versions} kept versions (Redis, in-process app)")
        print(f"{'page':<44} {'median s':>9} {'worst s':>9}")
        for name, url in (
            ("conversation (preview at the recorded budget)", "/ui/c/big"),
            ("conversation, preview at 100,000 tokens", "/ui/c/big?budget=100000"),
            ("history (journal, 20 versions)", "/ui/c/big/history"),
            ("diff of the oldest and newest kept", "/ui/c/big/diff?a=1&b=20"),
            ("conversations list", "/ui/"),
        ):
            median, worst = _time(client, url, args.repeat)
            print(f"{name:<44} {median:>9.3f} {worst:>9.3f}")
        print("goal: <= 1 s of server time for the conversation page")
    finally:
        cleaner = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        delete_prefixed_keys(cleaner, prefix)
        cleaner.close()
        rt.redis.close()


if __name__ == "__main__":
    main()
