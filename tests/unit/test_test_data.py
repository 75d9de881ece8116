"""The repository's test data: present, licensed, small, and the dated chats as specified."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ctxcore.eval.data import load_conversations
from ctxcore.tokens import TiktokenCounter
from tests import datasets
from tests.datasets import DATA_DIR, FILES, conversations, require_data


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_dialogue_qa", DATA_DIR / "make_dialogue_qa.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_every_file_is_in_the_repository_with_its_licence_and_under_2_mb() -> None:
    for name in FILES:
        assert require_data(name).stat().st_size > 0
    assert (DATA_DIR / "LICENSE-tau-bench.txt").read_text().startswith("MIT License")
    assert "MIT" in (DATA_DIR / "LICENSE-mini-swe-agent.md").read_text()
    assert sum(p.stat().st_size for p in DATA_DIR.iterdir() if p.is_file()) < 2 * 1024 * 1024
    assert not [p.name for p in DATA_DIR.iterdir() if "locomo" in p.name.lower()]


def test_a_missing_file_fails_instead_of_skipping(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(datasets.PATHS, "dialogue_qa.jsonl", tmp_path / "gone")
    with pytest.raises(pytest.fail.Exception, match="missing from the repository"):
        require_data("dialogue_qa.jsonl")


def test_the_chats_are_what_the_generator_writes() -> None:
    assert require_data("dialogue_qa.jsonl").read_text(encoding="utf-8") == _generator().render()


def test_the_chats_have_dated_sittings_facts_stated_once_and_evidence() -> None:
    counter = TiktokenCounter()
    chats = load_conversations(require_data("dialogue_qa.jsonl"))
    records = {r["id"]: r for r in conversations("dialogue_qa.jsonl")}
    assert len(chats) >= 3
    for chat in chats:
        texts = {m.metadata["extra"]["msg_id"]: str(m.content) for m in chat.messages}
        assert len(texts) == len(chat.messages), "every message has a unique msg_id"
        assert re.fullmatch(r"\[Sitting 1, .+\]", str(chat.system[0].content))
        sittings = {i.split(":")[0] for i in texts}
        assert len(sittings) >= 5
        for sitting in sittings - {"D1"}:
            assert re.match(rf"\[Sitting {sitting[1:]}, ", texts[f"{sitting}:1"]), sitting
        # 0.25 of the chat's tokens must force compaction: several thousand tokens.
        assert counter.count_messages([*chat.system, *chat.messages]) > 6000
        categories = {q.category for q in chat.qa}
        evidenced = {e for q in chat.qa for e in q.evidence}
        assert {"single-hop", "multi-hop", "temporal", "adversarial"} <= categories
        for q in chat.qa:
            if q.category == "adversarial":
                assert not q.answerable and not q.evidence
                continue
            assert q.evidence and all(e in texts for e in q.evidence), q
            said = [i for i, text in texts.items() if q.answer.casefold() in text.casefold()]
            if q.category == "temporal":
                sitting = q.evidence[-1].split(":")[0]
                assert said == [f"{sitting}:1"] or (sitting == "D1" and not said), q
            else:
                # Said in its own message, and elsewhere only where a multi-hop fact builds on it.
                assert q.evidence[-1] in said and set(said) <= evidenced, (q.answer, said)
        assert records[chat.id]["source"].endswith("(MIT)")
