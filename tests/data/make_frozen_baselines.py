"""Write ``frozen_baselines.json``: which messages ``steps``, ``mask`` and ``truncate`` keep.

The baselines every figure is measured against must not move: this pins, for a few runs of
the test data at a few budgets, every window each baseline serves (per window the index of
each message kept, with a short hash of its text where the baseline changed it). Written at
1293df3, re-written once for a deliberate change (stop 52: ``steps`` leaves out an older
step larger than the whole room and goes on, where it stopped there; four replays moved:
``steps`` and ``mask`` of two runs at 3,000 tokens);
``tests/unit/test_frozen_baselines.py`` compares. Re-run only for a deliberate change:

    .venv/bin/python tests/data/make_frozen_baselines.py [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from ctxcore.eval.data import groups, load_conversations, window_points  # noqa: E402
from ctxcore.eval.policies import CountingModel, PolicySetup, make_policy  # noqa: E402
from ctxcore.messages import AnyMessage, message_text  # noqa: E402
from ctxcore.summarize.extractive import ExtractiveModel  # noqa: E402
from ctxcore.tokens import TiktokenCounter  # noqa: E402
from ctxcore.turns import DEFAULT_DETECTOR  # noqa: E402

OUT = HERE / "frozen_baselines.json"
RUNS = (("minisweagent.jsonl", 2), ("tau_bench.jsonl", 2))
BUDGETS = (3000, 8000)
POLICIES = ("steps", "mask", "truncate")


def _kept(window: list[AnyMessage], history: list[AnyMessage]) -> list[str]:
    """Each window message as the index of the history message it is, else ``i~hash``."""
    out: list[str] = []
    for message in window:
        if message.role == "system":
            continue
        text = message_text(message)
        same = [i for i, m in enumerate(history) if m is message]
        if same:
            out.append(str(same[0]))
            continue
        like = [
            i
            for i, m in enumerate(history)
            if m.role == message.role
            and getattr(m, "tool_call_id", None) == getattr(message, "tool_call_id", None)
        ]
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        out.append(f"{like[-1] if like else '?'}~{digest}")
    return out


def frozen() -> dict[str, Any]:
    counter = TiktokenCounter()
    model = CountingModel(ExtractiveModel(counter), counter)
    out: dict[str, Any] = {}
    for name, count in RUNS:
        for conv in load_conversations(HERE / name)[:count]:
            units = groups(conv.messages)
            points = set(window_points(units))
            for budget in BUDGETS:
                for policy_name in POLICIES:
                    setup = PolicySetup(
                        conv.id, budget, list(conv.system), list(conv.tools), counter, model, DEFAULT_DETECTOR
                    )
                    policy = make_policy(policy_name, setup)
                    history: list[AnyMessage] = []
                    windows: list[list[str]] = []
                    for i, unit in enumerate(units):
                        policy.append(unit)
                        history.extend(unit)
                        if i in points:
                            windows.append(_kept(policy.window().messages, history))
                    out[f"{conv.id}|{budget}|{policy_name}"] = windows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = parser.parse_args()
    data = frozen()
    if args.check:
        same = json.loads(OUT.read_text()) == data
        print("same" if same else "DIFFERENT")
        raise SystemExit(0 if same else 1)
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({len(data)} replays)")


if __name__ == "__main__":
    main()
