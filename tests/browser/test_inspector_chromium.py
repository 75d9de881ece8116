"""The web inspector in a real browser: the distribution's headless Chromium (``chromium``
and ``chromium-driver`` from Debian), driven by Selenium with that driver, no download.

Signs in, opens a compacted conversation, expands a block to its sources, diffs two
versions, rolls back through the confirmation, searches recall; another tenant's
conversation is not reachable; a ``<script>`` planted in a tool result and in a summary
does not run (the CSP allows no script, and the templates escape it to text).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.state import ConversationKey
from tests.conftest import server_unavailable
from tests.live_server import SLOW_TOKEN, TOKEN, LiveApi, serve_api
from workers.journal import result_entry, write_entry
from workers.ui.routes import EXPIRED
from workers.ui.sessions import COOKIE

pytestmark = pytest.mark.redis

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PLANTED = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def _browser() -> Any:
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        server_unavailable(
            "the browser test needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not download anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or DRIVER), options=options)


def _compacted(live: LiveApi) -> ConversationKey:
    """A conversation compacted by the real coordinator (journaled as the workers do), then
    one more version whose summary carries the planted markup."""
    rt = live.runtime
    key = ConversationKey("acme", f"browse-{uuid.uuid4().hex[:6]}")
    for i in range(12):
        rt.log.append(
            key,
            [
                UserMessage(content=f"step {i}: find the deployment notes about kestrel " + "words " * 60),
                AssistantMessage(content=None, tool_calls=[ToolCall(id=f"call-{i}", name="grep")]),
                ToolMessage(content=f"notes {i} {PLANTED} " + "output " * 80, tool_call_id=f"call-{i}"),
                AssistantMessage(content=f"answer {i} " + "more words " * 40),
            ],
        )
    rt.state_store.set_budget(key, 2500)
    for _ in range(10):
        stage = rt.coordinator.plan(key)
        if stage is None:
            break
        started = time.perf_counter()
        result = rt.coordinator.run_stage(key, stage)
        write_entry(rt.journal, key, result_entry(stage.kind, result, started))
    state = rt.state_store.load(key)
    assert state is not None and state.blocks, "the coordinator compacted nothing"
    planted = state.blocks[0].model_copy(
        update={"block_id": "planted", "messages": [UserMessage(content=f"summary {PLANTED}")]}
    )
    assert rt.state_store.save(
        key, state.model_copy(update={"blocks": [planted, *state.blocks[1:]]}), state.version
    )
    return key


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[LiveApi]:
    api = serve_api(redis_url, worker=False, recall={"enabled": True})
    try:
        yield api
    finally:
        api.close()


@pytest.fixture()
def browser() -> Iterator[Any]:
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str) -> None:
    """With ``CTXCORE_UI_SCREENSHOTS=<dir>``, save the page (the README's screenshots)."""
    where = os.environ.get("CTXCORE_UI_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"{name}.png"))


def _pwned(driver: Any) -> Any:
    # WebDriver's own script runs whatever the page's CSP: it only reads the page's state.
    return driver.execute_script("return window.__pwned === undefined ? null : window.__pwned")


def _follow(driver: Any, element: Any) -> None:
    """Click ``element`` and wait until the page it leads to replaced this one."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 10).until(expected_conditions.staleness_of(page))


def _sign_in(driver: Any, live: LiveApi, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{live.url}/ui/")
    assert driver.current_url.endswith("/ui/login")
    driver.find_element(By.ID, "token").send_keys(token)
    _follow(driver, driver.find_element(By.ID, "sign-in"))
    assert driver.current_url.endswith("/ui/"), driver.find_element(By.TAG_NAME, "body").text
    assert token not in driver.current_url


def test_the_inspector_in_chromium(live: LiveApi, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    key = _compacted(live)
    cid = key.conversation_id
    _sign_in(browser, live, TOKEN)
    cookie = browser.get_cookie("ctxcore_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: out of any script's reach
    _shot(browser, "conversations")

    _follow(browser, browser.find_element(By.LINK_TEXT, cid))
    assert f"/ui/c/{cid}" in browser.current_url
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "<script>window.__pwned = 1</script>" in body  # shown as text (tool result and summary)
    assert _pwned(browser) is None

    block = browser.find_element(By.ID, "block-1")
    assert block.get_attribute("open") is None
    block.find_element(By.TAG_NAME, "summary").click()
    assert block.get_attribute("open") is not None
    _shot(browser, "conversation")
    _follow(browser, block.find_element(By.CLASS_NAME, "sources"))
    sources = browser.find_element(By.ID, "sources").text
    assert "[tool call grep call-0]" in sources and "[result of call-0] notes 0" in sources
    assert _pwned(browser) is None

    browser.get(f"{live.url}/ui/c/{cid}/history")
    journal = browser.find_element(By.ID, "journal").text
    assert "compressed" in journal
    _shot(browser, "history")
    versions = live.runtime.state_store.history(key)
    newest, older = versions[0].version, versions[1].version
    browser.find_element(By.ID, f"a-{older}").click()
    browser.find_element(By.ID, f"b-{newest}").click()
    _follow(browser, browser.find_element(By.ID, "diff"))
    summary = browser.find_element(By.ID, "diff-summary").text
    assert "1 only in" in summary and _pwned(browser) is None
    _shot(browser, "diff")

    browser.get(f"{live.url}/ui/c/{cid}/history")
    _follow(browser, browser.find_element(By.ID, f"rollback-{older}"))
    _follow(browser, browser.find_element(By.ID, "confirm"))
    assert f"version {older} restored as version {newest + 1}" in browser.find_element(By.ID, "notice").text
    assert live.runtime.state_store.load(key).version == newest + 1  # type: ignore[union-attr]

    browser.get(f"{live.url}/ui/c/{cid}/recall")
    browser.find_element(By.ID, "query").send_keys("kestrel deployment notes")
    _follow(browser, browser.find_element(By.ID, "search"))
    assert "kestrel" in browser.find_element(By.ID, "hits").text and _pwned(browser) is None

    # Another tenant signs in: the conversation answers like an unknown one.
    _sign_in(browser, live, SLOW_TOKEN)
    assert cid not in browser.find_element(By.TAG_NAME, "body").text
    browser.get(f"{live.url}/ui/c/{cid}")
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "conversation not found" in text and "kestrel" not in text


def test_an_expired_session_in_chromium(live: LiveApi, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    key = ConversationKey("acme", f"short-{uuid.uuid4().hex[:6]}")
    sent = httpx.post(
        f"{live.url}/v1/conversations/{key.conversation_id}/messages",
        json={"messages": [{"role": "user", "content": "a short conversation"}]},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert sent.status_code in (200, 201), sent.text
    _sign_in(browser, live, TOKEN)
    row = browser.find_element(By.LINK_TEXT, key.conversation_id).find_element(By.XPATH, "../..")
    assert int(row.find_element(By.CLASS_NAME, "tokens").text) > 0  # the stored count of the append
    # The session's Redis key runs out (WebDriver reads the HttpOnly cookie; no page script can).
    cookie = browser.get_cookie(COOKIE)["value"]
    name = (
        f"{live.runtime.settings.redis.key_prefix}:ui:session:{hashlib.sha256(cookie.encode()).hexdigest()}"
    )
    assert live.runtime.redis.pexpire(name, 1)
    time.sleep(0.05)
    browser.get(f"{live.url}/ui/c/{key.conversation_id}")
    assert browser.current_url.endswith("/ui/login?expired=1")
    assert browser.find_element(By.ID, "error").text == EXPIRED
    assert browser.get_cookie(COOKIE) is None  # the stale cookie is cleared
    assert "a short conversation" not in browser.find_element(By.TAG_NAME, "body").text
