"""The README's walk-throughs, run top to bottom as a reader would (``tests/readme_runner.py``):
one shell, its background processes left running from one walk-through to the next, a
Python session per walk-through started from that shell, every port each one says it
starts checked free before and listening after. Then copies of the README with a clash, an
undeclared reuse or a taken port, which must fail (tests of the test)."""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ctxcore.config import Settings
from ctxcore.state import ConversationKey
from tests.readme_declarations import SKIPPED, ReadmeRunFailed, check_declarations, parse_sections
from tests.readme_runner import run_readme
from workers.keyspace import delete_prefixed_keys
from workers.runtime import Runtime

pytestmark = [pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


@pytest.fixture()
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix for a run of the README; its keys are deleted after."""
    prefix = f"readme{uuid.uuid4().hex[:8]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        delete_prefixed_keys(client, prefix)
    finally:
        client.close()


def sections_text(text: str, *titles: str) -> str:
    """``text`` with only the named ``###`` sections (and the skipped ones) kept after the first."""
    head, rest = text.split("\n### ", 1)
    keep = {*titles, *SKIPPED}
    kept = [part for part in rest.split("\n### ") if part.split("\n", 1)[0].strip() in keep]
    return head + "".join("\n### " + part for part in kept)


def test_the_readme_walk_throughs_declare_what_they_start_and_reuse() -> None:
    assert check_declarations(README.read_text(encoding="utf-8")) == []


@pytest.mark.timeout(400)
def test_the_readme_walk_throughs_run_top_to_bottom_in_one_shell(
    redis_url: str, tmp_path: Path, key_prefix: str
) -> None:
    text = README.read_text(encoding="utf-8")
    run = run_readme(text, tmp_path, redis_url=redis_url, repo=REPO, key_prefix=key_prefix)
    assert run.finished == [
        "Embedded, in the agent's process",
        "The Python client",
        "LangChain v1 agents",
        "OpenAI Agents SDK",
        "Any OpenAI SDK agent: the proxy",
    ]
    assert set(run.ports) == {"8099", "9808", "8080", "8081"} and len(set(run.ports.values())) == 4
    # The worker said what summarises (no CTXCORE_MODEL_BASE_URL in the walk-throughs)
    assert "ctxcore worker: summarising with the offline ExtractiveModel" in run.shell_log
    # What the walk-throughs wrote, under the run's own key prefix
    settings = Settings.load({"redis": {"url": redis_url, "key_prefix": run.key_prefix}})
    rt = Runtime(settings)
    try:
        conversations = set(rt.log.list_conversations("acme"))
        assert {"run-42", "langchain-run-1", "agents-run-1", "proxy-run-1"} <= conversations
        # The proxy's two calls: user, reply, user, streamed reply, each logged once
        assert len(rt.log.read_after(ConversationKey("acme", "proxy-run-1"), None)) == 4
        # LangChain's final reply is in the log once invoke returned (after_agent)
        langchain = rt.log.read_after(ConversationKey("acme", "langchain-run-1"), None)
        assert langchain[-1].role == "assistant" and not langchain[-1].tool_calls
    finally:
        rt.redis.close()
    assert run.python_output.count("\n") >= 4, run.python_output


@pytest.mark.timeout(400)
def test_a_clash_in_a_copy_of_the_readme_fails(redis_url: str, tmp_path: Path, key_prefix: str) -> None:
    """The proxy walk-through as it once was: it starts the model endpoint and a worker again
    (and says nothing): the second model endpoint cannot bind, nor the second worker its
    metrics port. The declarations are not checked, so the run itself must notice."""
    text = sections_text(
        README.read_text(encoding="utf-8"),
        "Embedded, in the agent's process",
        "The Python client",
        "Any OpenAI SDK agent: the proxy",
    )
    clash = (
        ".venv/bin/python -m ctxcore.testing.openai_server --port 8099 &   # the upstream\n"
        "CTXCORE_WORKER__METRICS_PORT=9808 .venv/bin/ctxcore worker --hostname w2@%h &\n"
        ".venv/bin/ctxcore serve --port 8081 &"
    )
    copy, replaced = re.subn(r"^\.venv/bin/ctxcore serve --port 8081 &.*$", clash, text, flags=re.MULTILINE)
    assert replaced == 1
    assert any("starts port 8099 without saying so" in p for p in check_declarations(copy))
    with pytest.raises(ReadmeRunFailed) as failed:
        run_readme(copy, tmp_path, redis_url=redis_url, repo=REPO, key_prefix=key_prefix, static_checks=False)
    message = str(failed.value)
    assert "“Any OpenAI SDK agent: the proxy”" in message and "exited" in message, message
    assert "openai_server --port" in message or "worker --hostname w2" in message, message


def test_a_port_another_walk_through_started_is_named_before_it_is_started_again(
    redis_url: str, tmp_path: Path
) -> None:
    """A copy that says (honestly) that the proxy starts port 8080 again: the declarations
    name the clash, and the run stops before starting anything twice."""
    text = sections_text(
        README.read_text(encoding="utf-8"),
        "Embedded, in the agent's process",
        "Any OpenAI SDK agent: the proxy",
    )
    text = text.replace("port 8081", "port 8099").replace("--port 8081", "--port 8099")
    assert any("starts port 8099, already started by “Embedded" in p for p in check_declarations(text))
    with pytest.raises(ReadmeRunFailed, match=r"starts port 8099 .*already taken by walk-through “Embedded"):
        run_readme(text, tmp_path, redis_url=redis_url, repo=REPO, static_checks=False)


def test_a_port_taken_by_something_else_fails_naming_it_and_the_readme_advice(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tests.readme_runner as runner

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    free = iter([port])
    monkeypatch.setattr(runner, "_free_port", lambda: next(free))  # 8099, the only port, is taken
    text = sections_text(README.read_text(encoding="utf-8"), "Embedded, in the agent's process")
    try:
        with pytest.raises(ReadmeRunFailed) as failed:
            run_readme(text, tmp_path, redis_url=redis_url, repo=REPO)
    finally:
        taken.close()
    message = str(failed.value)
    assert f"starts port 8099 (here {port}), already taken by something else" in message
    assert "A port already taken" in message and "A port already taken" in README.read_text()


@pytest.mark.timeout(400)
def test_a_silent_dependency_on_an_earlier_python_session_fails(
    redis_url: str, tmp_path: Path, key_prefix: str
) -> None:
    """LangChain's walk-through uses the client walk-through's ``client`` and ``llm``; a copy
    that does not say it continues that session runs in a new one and fails."""
    text = sections_text(
        README.read_text(encoding="utf-8"),
        "Embedded, in the agent's process",
        "The Python client",
        "LangChain v1 agents",
    )
    copy, replaced = re.subn(
        r"\*\*Python:\*\* continues the session of the Python client", "**Python:** a new session, like", text
    )
    assert replaced == 1
    with pytest.raises(ReadmeRunFailed, match=r"NameError: name '(client|llm)' is not defined"):
        run_readme(copy, tmp_path, redis_url=redis_url, repo=REPO, key_prefix=key_prefix)


def test_declarations_catch_an_undeclared_variable_or_port_and_a_missing_declaration() -> None:
    text = README.read_text(encoding="utf-8")
    proxy = text.split("### Any OpenAI SDK agent: the proxy", 1)[1].split("\n### ", 1)[0]
    quiet = proxy.replace("`CTXCORE_TOKEN` and", "and")
    assert quiet != proxy
    assert any(
        "reads CTXCORE_TOKEN, exported by “The Python client”, without saying it reuses it" in p
        for p in check_declarations(text.replace(proxy, quiet))
    )
    unsaid = proxy.replace("the model endpoint (port 8099) as", "the model endpoint as")
    assert any(
        "uses port 8099 without saying it starts or reuses it" in p
        for p in check_declarations(text.replace(proxy, unsaid))
    )
    bare = re.sub(r"\*\*Starts:\*\*.*?\n\n", "", proxy, count=1, flags=re.DOTALL)
    assert any(
        "does not say what it starts and reuses" in p for p in check_declarations(text.replace(proxy, bare))
    )
    titles = [s.title for s in parse_sections(text)]
    assert set(SKIPPED) <= set(titles)
