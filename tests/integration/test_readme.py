"""The README's Python blocks run, in order, as one script: against the real app on a
loopback port and the local OpenAI-compatible server (``ctxcore.testing.openai_server``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ctxcore.state import ConversationKey
from ctxcore.testing.openai_server import OpenAIServer
from tests.live_server import TOKEN, live_api

pytestmark = pytest.mark.redis

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` blocks of a Markdown text."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_python_blocks_run(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 4  # embedded, client, LangChain, Agents SDK
    proxy = {"context_window_tokens": {"local-8k": 8192}}
    with (
        OpenAIServer() as llm,
        live_api(redis_url, worker=False, proxy={**proxy, "upstream_base_url": llm.base_url}) as api,
    ):
        monkeypatch.setenv("CTXCORE_URL", api.url)
        monkeypatch.setenv("CTXCORE_TOKEN", TOKEN)
        monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "local")
        namespace: dict[str, object] = {"__name__": "readme"}
        for number, block in enumerate(blocks):
            exec(compile(block, f"README.md python block {number + 1}", "exec"), namespace)
        conversations = set(api.runtime.log.list_conversations("acme"))
        assert {"run-42", "langchain-run-1", "agents-run-1", "proxy-run-1"} <= conversations
        # The proxy's two calls: user, reply, user, streamed reply, each logged once
        assert len(api.runtime.log.read_after(ConversationKey("acme", "proxy-run-1"), None)) == 4
        # Every block's model call reached the local endpoint
        assert len(llm.requests) >= 4
    assert capsys.readouterr().out.count("\n") >= 4
