"""The baselines every figure is measured against keep their windows (``tests/data/frozen_baselines.json``,
written at 1293df3 by ``tests/data/make_frozen_baselines.py``, re-written once since: see it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from ctxcore.eval.baselines import StepsPolicy
from ctxcore.eval.policy_base import PolicyWindow

DATA = Path(__file__).resolve().parents[1] / "data"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_frozen_baselines", DATA / "make_frozen_baselines.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_mask_and_truncate_serve_the_windows_they_served_at_1293df3() -> None:
    pinned = json.loads((DATA / "frozen_baselines.json").read_text())
    assert len(pinned) == 24 and all(pinned.values())
    assert generator().frozen() == pinned


def test_the_pin_fails_when_steps_keeps_other_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    original = StepsPolicy.window

    def one_step_less(self: StepsPolicy) -> PolicyWindow:
        window = original(self)
        body = [m for m in window.messages if m.role != "system"]
        # Leave out the oldest message after the anchors when the window has more than them.
        if len(body) > 3:
            drop = next(i for i, m in enumerate(window.messages) if m.role != "system") + 2
            window.messages = [m for i, m in enumerate(window.messages) if i != drop]
        return window

    monkeypatch.setattr(StepsPolicy, "window", one_step_less)
    pinned = json.loads((DATA / "frozen_baselines.json").read_text())
    now = generator().frozen()
    changed = {k for k in pinned if pinned[k] != now[k]}
    assert changed and all(k.endswith(("|steps", "|mask")) for k in changed)
