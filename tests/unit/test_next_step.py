"""Next-step references, budget parts, prompt-cache share, lag and the matched-fill control."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from ctxcore.eval import EvalConfig, evaluate_file, policy_base
from ctxcore.eval.accounting import PARTS, CacheTracker, RawMessages, WindowCosts, parts, tools_key
from ctxcore.eval.baselines import LosslessPolicy
from ctxcore.eval.data import conversation
from ctxcore.eval.harness import evaluate_conversation
from ctxcore.eval.policies import POLICIES, CountingModel, FullPolicy, PolicySetup, PolicyWindow
from ctxcore.eval.references import checkpoints, extract, sign_test, window_text
from ctxcore.messages import AnyMessage, AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.tokens import TiktokenCounter
from ctxcore.turns import DEFAULT_DETECTOR

COUNTER = TiktokenCounter()
MODEL = ExtractiveModel(COUNTER)


def call(call_id: str, command: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "name": "bash", "arguments": json.dumps({"command": command})}],
    }


def planted_run(steps: int = 20) -> dict[str, Any]:
    """A run whose assistant at the 95% checkpoint reuses ``frobnicate_widget`` (printed once,
    at step 3) and the line number 4711 (printed once, at step 5)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the crash in pkg/app.py."},
    ]
    for i in range(steps):
        messages.append(call(f"c{i}", f"cat pkg/mod{i}.py"))
        out = f"def helper{i}(): pass"
        if i == 3:
            out = "def frobnicate_widget(x):\n    return x"
        if i == 5:
            out = "error at line 4711"
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": out})
    messages.append(call("last", "sed -n 4711,4720p pkg/app.py && grep -n frobnicate_widget pkg/app.py"))
    messages.append({"role": "tool", "tool_call_id": "last", "content": "ok"})
    return {"id": "planted", "messages": messages}


def write(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_extract_finds_the_four_kinds() -> None:
    text = (
        "Edit src/app/core.py and models.py; call get_foreign_related_value on self.related.field, "
        "see ModelChoiceField at line 1261 (not 12), grep for 'empty label text' and `x = 1`, "
        "but not 'word' nor tiny_x? nor README"
    )
    found = set(extract(text))
    assert ("src/app/core.py", "path") in found and ("models.py", "path") in found
    assert ("get_foreign_related_value", "identifier") in found
    assert ("self.related.field", "identifier") in found and ("ModelChoiceField", "identifier") in found
    assert ("1261", "number") in found and ("12", "number") not in found
    assert ("empty label text", "quoted") in found and ("x = 1", "quoted") in found
    assert not any(t in ("word", "README") for t, _ in found)


def test_tool_call_arguments_that_are_not_json_are_read_as_written() -> None:
    message = AssistantMessage(
        content="", tool_calls=[ToolCall(id="a", name="bash", arguments="cat src/x.py {")]
    )
    assert "src/x.py" in window_text([message])


def test_references_occur_earlier_and_not_in_the_task() -> None:
    conv = conversation(planted_run())
    cps = checkpoints(conv.messages, conv.system)
    assert [c.share for c in cps] == [0.40, 0.60, 0.80, 0.95]
    last = cps[-1]
    texts = {r.text: r for r in last.references}
    assert {"frobnicate_widget", "4711"} <= set(texts)
    # pkg/app.py is in the task: every window holds it, it is no reference.
    assert "pkg/app.py" not in texts
    assert texts["frobnicate_widget"].stale(last.index) and texts["4711"].stale(last.index)


def test_a_run_shorter_than_its_checkpoints_has_fewer_and_none_is_reported_as_none(tmp_path: Path) -> None:
    run = {
        "id": "short",
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "Now bye."},
            {"role": "assistant", "content": "Bye."},
            {"role": "user", "content": "Thanks."},
        ],
    }
    conv = conversation(run)
    cps = checkpoints(conv.messages, conv.system)
    # 40% and 60% fall on the same assistant message, 80% and 95% on none.
    assert len(cps) == 1 and cps[0].references == ()
    report = evaluate_file(write(tmp_path, [run]), EvalConfig(policies=["full"], budget=1000))
    refs = {r["policy"]: r["overall"]["references"] for r in report["reports"]}
    assert refs["full"]["overall"] is None and refs["full"]["checkpoints_without_reference"] == 1


class DropOne(LosslessPolicy):
    """Every raw message but those holding ``frobnicate_widget`` (a planted miss)."""

    name = "drop-one"
    reference = False

    def window(self) -> PolicyWindow:
        kept = [m for m in self.messages if "frobnicate_widget" not in window_text([m])]
        return PolicyWindow([*self.setup.system, *kept], list(self.setup.tools))


def test_a_window_that_drops_one_known_reference_scores_lower_by_exactly_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(POLICIES, DropOne.name, DropOne)
    conv = conversation(planted_run())
    results = evaluate_conversation(conv, ["lossless", "drop-one"], 100_000, model=MODEL, counter=COUNTER)
    full_hits = [sum(c.hits) for c in results["lossless"].checkpoints]
    drop_hits = [sum(c.hits) for c in results["drop-one"].checkpoints]
    refs = [len(c.hits) for c in results["lossless"].checkpoints]
    assert full_hits == refs  # every raw message: every reference held
    assert [a - b for a, b in zip(full_hits, drop_hits, strict=True)] == [0, 0, 0, 1]


def test_sign_test() -> None:
    assert sign_test(0, 0) is None
    assert sign_test(5, 5) == 1.0
    assert sign_test(10, 0) == pytest.approx(2 / 1024, abs=1e-4)


def test_parts_add_up_to_the_budget_and_the_cache_shares_the_equal_prefix() -> None:
    system = SystemMessage(content="be brief")
    task = UserMessage(content="Fix it.")
    step = AssistantMessage(
        content="", tool_calls=[ToolCall(id="a", name="bash", arguments='{"command":"ls"}')]
    )
    result = ToolMessage(tool_call_id="a", content="x.py")
    cleared = ToolMessage(tool_call_id="a", content="[cleared]")
    raw = RawMessages()
    raw.add([task, step, result])
    raw.set_anchors([task])

    def costs(window: list[AnyMessage]) -> WindowCosts:
        each = [COUNTER.count_messages([m]) - 3 for m in window]
        tools: list[dict[str, Any]] = []
        return WindowCosts(window, each, 0, COUNTER.count_messages(window), tools_key(tools))

    first = costs([system, task, step, result])
    split = parts(first, raw, 1000)
    assert set(split) == set(PARTS) and sum(split.values()) == 1000
    assert split["anchors"] > 0 and split["raw"] > 0 and split["rewritten"] == 0
    assert parts(costs([system, task, step, cleared]), raw, 1000)["rewritten"] > 0
    cache = CacheTracker()
    assert cache.shared(first) == 0
    assert cache.shared(costs([system, task, step, result])) == sum(first.costs)
    changed = costs([system, task, step, cleared])
    assert cache.shared(changed) == sum(changed.costs[:3])


def setup_for(budget: int, **kwargs: Any) -> PolicySetup:
    return PolicySetup(
        "run",
        budget,
        [SystemMessage(content="s")],
        [],
        COUNTER,
        CountingModel(MODEL, COUNTER),
        DEFAULT_DETECTOR,
        **kwargs,
    )


def first_compaction(lag: int) -> int:
    """The window at which ``full`` first serves a summary block, with ``lag``."""
    policy = FullPolicy(setup_for(1500, lag=lag))
    conv = conversation(planted_run(40))
    policy.append([conv.messages[0]])
    for n in range(1, 200):
        step = list(conv.messages[2 * n - 1 : 2 * n + 1])
        if not step:
            break
        policy.append(step)
        window = policy.window()
        if window.stages:
            return n
    raise AssertionError("no compaction")


def test_a_lagging_worker_lands_the_compaction_that_many_windows_later() -> None:
    assert first_compaction(4) - first_compaction(0) == 4


def test_lag_is_refused_when_negative_or_longer_than_every_run(tmp_path: Path) -> None:
    path = write(tmp_path, [planted_run()])
    with pytest.raises(ConfigError, match="lag must be >= 0"):
        EvalConfig(policies=["full"], budget=1000, lag=-1)
    with pytest.raises(ConfigError, match="no compaction would ever land"):
        evaluate_file(path, EvalConfig(policies=["full"], budget=1000, lag=500))


def test_full_runs_with_the_services_settings_never_eval_constants() -> None:
    defaults = Settings()
    policy = FullPolicy(setup_for(4000))
    coordinator = policy.coordinator
    assert coordinator.trigger_ratio == defaults.service.trigger_ratio
    assert coordinator.target_ratio == defaults.service.target_ratio
    assert coordinator.keep_recent_messages == defaults.engine.keep_recent_messages
    assert coordinator.max_result_ratio == defaults.engine.max_result_ratio
    assert policy.rules is not None
    # Other settings change what full does, and nothing in the eval keeps its own copy.
    custom = Settings.load(
        {
            "service": {"trigger_ratio": 0.9, "target_ratio": 0.5},
            "engine": {"keep_recent_messages": 2, "rule_chain": "none"},
        }
    )
    other = FullPolicy(setup_for(4000, settings=custom))
    assert (other.coordinator.trigger_ratio, other.coordinator.target_ratio) == (0.9, 0.5)
    assert other.coordinator.keep_recent_messages == 2 and other.rules is None
    assert EvalConfig(policies=["full"], budget=100).settings == defaults
    for name in ("TRIGGER_RATIO", "TARGET_RATIO", "KEEP_RECENT_MESSAGES"):
        assert not hasattr(policy_base, name)


def test_the_matched_fill_control_uses_fulls_budget_share() -> None:
    source = Path(__file__).resolve().parents[1] / "data" / "minisweagent.jsonl"
    report = evaluate_file(source, EvalConfig(policies=["full"], budget=8000, limit=3))
    refs = next(r for r in report["reports"] if r["policy"] == "full")["overall"]["references"]
    fill, matched = refs["fill"]["mean"], refs["matched_fill"]["fill"]["mean"]
    assert fill is not None and matched is not None and abs(fill - matched) <= 0.01
    assert sum(refs["vs_matched_fill"][k] for k in ("win", "loss", "tie")) == 3
