"""``evaluate_file``: every listed policy over the conversations of a JSONL file, one run.

The baseline (``steps`` unless told otherwise) is added when missing, so every report
compares against a correct truncation measured on the same conversations at the same
budgets. One policy in all gives one report; several give ``{"baseline", "reports"}``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from ctxcore.eval.aggregate import aggregate
from ctxcore.eval.data import Conversation, groups, load_conversations, window_points
from ctxcore.eval.harness import MATCHED_FILL, REFERENCE_POLICY, evaluate_conversation
from ctxcore.eval.next_step import reference_figures
from ctxcore.eval.policies import POLICIES
from ctxcore.eval.replay import conversation_tokens
from ctxcore.eval.results import ConversationResult
from ctxcore.messages import to_openai
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import ModelClient
from ctxcore.tokens import TiktokenCounter, TokenCounter
from ctxcore.turns import DEFAULT_DETECTOR, UserDetector

__all__ = ["DEFAULT_BASELINE", "EvalConfig", "evaluate_file"]

DEFAULT_BASELINE = "steps"


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise ConfigError(f"--windows-out {path}: is a directory; name a .jsonl file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--windows-out {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"--windows-out {path}: not writable")


@dataclass
class EvalConfig:
    """What to run: policies at a fixed budget or a ratio of each conversation's size.

    ``budget_ratio`` R gives each conversation ``R x`` its total tokens (system messages,
    every message and tools, counted by ``counter``). ``baseline`` (None: none) is added to
    ``policies`` when missing and is what wins and losses are counted against. ``model`` is
    the summariser (default ``ExtractiveModel``); ``limit`` keeps the first conversations of
    the file and ``ids`` only the named ones. ``windows_out`` receives each conversation's
    final window per policy (JSONL).
    """

    policies: Sequence[str] = ("full",)
    budget: int | None = None
    budget_ratio: float | None = None
    baseline: str | None = DEFAULT_BASELINE
    limit: int | None = None
    ids: Sequence[str] | None = None
    step_stride: int = 1
    # The service's settings: ``full`` runs with their trigger, target, keep-recent and rule
    # chain (the defaults of ``Settings()`` unless given).
    settings: Settings = field(default_factory=Settings)
    # ``full``'s compactions land this many windows after they were asked for.
    lag: int = 0
    model: ModelClient | None = None
    counter: TokenCounter | None = None
    detector: UserDetector | None = None
    windows_out: str | Path | None = None
    # "auto": every listed ``full`` also runs as ``full+recall`` (archives and auto-recall).
    recall: str = "off"
    run_policies: list[str] = field(init=False)

    def __post_init__(self) -> None:
        if (self.budget is None) == (self.budget_ratio is None):
            raise ConfigError("give exactly one of budget and budget_ratio")
        if self.budget is not None and self.budget <= 0:
            raise ConfigError(f"budget must be > 0, got {self.budget}")
        if self.budget_ratio is not None and self.budget_ratio <= 0:
            raise ConfigError(f"budget_ratio must be > 0, got {self.budget_ratio}")
        if self.lag < 0:
            raise ConfigError(f"lag must be >= 0 windows, got {self.lag}")
        if self.step_stride < 1:
            raise ConfigError(f"step_stride must be >= 1, got {self.step_stride}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")
        if self.recall not in ("off", "auto"):
            raise ConfigError(f"recall must be off or auto, got {self.recall!r}")
        names = list(self.policies)
        if self.recall == "auto":
            at = names.index("full") + 1 if "full" in names else len(names)
            if "full+recall" not in names:
                names.insert(at, "full+recall")
        if not names:
            raise ConfigError(f"name at least one policy; choices: {', '.join(POLICIES)}")
        for name in [*names, *([self.baseline] if self.baseline else [])]:
            if name not in POLICIES:
                raise ConfigError(f"unknown policy {name!r}; choices: {', '.join(POLICIES)}")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"policy listed more than once: {', '.join(repeated)}")
        if self.baseline and POLICIES[self.baseline].reference:
            raise ConfigError(f"{self.baseline!r} is a reference row and cannot be the baseline")
        if self.windows_out is not None:
            _check_writable(Path(self.windows_out))
        self.run_policies = names + ([self.baseline] if self.baseline and self.baseline not in names else [])


def _write_windows(path: Path, rows: list[dict[str, Any]]) -> None:
    # A temp file renamed over the target: an interrupted run never leaves a partial file.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _window_row(result: ConversationResult) -> dict[str, Any]:
    final = result.final
    return {
        "id": result.id,
        "policy": result.policy,
        "budget": result.budget,
        "tokens": final.tokens if final.error is None else 0,
        "messages": to_openai(final.messages) if final.error is None else [],
        "tools": [dict(t) for t in final.tools] if final.error is None else [],
        "error": final.error,
    }


def _check_lag(lag: int, convs: Sequence[Conversation], stride: int, detector: UserDetector) -> None:
    longest = max(
        (len(window_points(groups(c.messages), step_stride=stride, detector=detector)) for c in convs),
        default=0,
    )
    if lag >= longest:
        raise ConfigError(
            f"lag {lag} is not below the windows of any selected run (the longest has {longest}): "
            "no compaction would ever land; give a smaller lag"
        )


def evaluate_file(
    path: str | Path,
    config: EvalConfig,
    progress: Callable[[ConversationResult], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``config``'s policies on the conversations of a JSONL file; the JSON report.

    The control questions of a conversation are those of the next conversation of the file
    (cyclically), whatever ``limit`` or ``ids`` select.
    """
    counter = config.counter or TiktokenCounter()
    model = config.model or ExtractiveModel(counter)
    detector = config.detector or DEFAULT_DETECTOR
    convs = load_conversations(path)
    if config.ids:
        known = {c.id for c in convs}
        unknown = [i for i in config.ids if i not in known]
        if unknown:
            raise ConfigError(f"{path}: no conversation with id {', '.join(map(repr, unknown))}")
    wanted = set(config.ids) if config.ids else None
    selected = [(n, c) for n, c in enumerate(convs) if wanted is None or c.id in wanted][: config.limit]
    if config.lag:
        _check_lag(config.lag, [c for _, c in selected], config.step_stride, detector)
    by_policy: dict[str, list[ConversationResult]] = {p: [] for p in config.run_policies}
    started = time.perf_counter()
    done = 0
    for n, conv in selected:
        other = convs[(n + 1) % len(convs)] if len(convs) > 1 else None
        control = other.qa if other is not None and conv.qa and other.qa else ()
        if config.budget is not None:
            budget = config.budget
        else:
            ratio = config.budget_ratio or 0.0
            budget = max(int(conversation_tokens(conv, counter) * ratio), 1)
        results = evaluate_conversation(
            conv,
            config.run_policies,
            budget,
            model=model,
            counter=counter,
            detector=detector,
            step_stride=config.step_stride,
            settings=config.settings,
            lag=config.lag,
            control_qa=control,
        )
        for name, result in results.items():
            by_policy.setdefault(name, []).append(result)
            if progress is not None:
                progress(result)
        done += 1
    if config.windows_out is not None:
        rows = [_window_row(by_policy[name][i]) for i in range(done) for name in config.run_policies]
        _write_windows(Path(config.windows_out), rows)
    baseline = {r.id: r for r in by_policy[config.baseline]} if config.baseline else None
    matched_runs = by_policy.pop(MATCHED_FILL, None)
    reports: list[dict[str, Any]] = [
        {
            "policy": name,
            "overall": aggregate(by_policy[name], baseline if name != config.baseline else None),
            "conversations": [r.as_dict() for r in by_policy[name]],
        }
        for name in config.run_policies
    ]
    if matched_runs is not None:
        # ``steps`` given ``full``'s fill at each checkpoint: its figures beside ``full``'s, and
        # ``full``'s wins and losses against it.
        for rep in reports:
            refs = rep["overall"].get("references")
            if rep["policy"] == REFERENCE_POLICY and refs is not None:
                matched = reference_figures(matched_runs, None)
                refs["matched_fill"] = matched
                refs["vs_matched_fill"] = reference_figures(
                    by_policy[REFERENCE_POLICY], {r.id: r for r in matched_runs}
                )["vs_baseline"]
    head: dict[str, Any] = {
        "file": str(path),
        "budget": config.budget,
        "budget_ratio": config.budget_ratio,
        "settings": {
            "trigger_ratio": config.settings.service.trigger_ratio,
            "target_ratio": config.settings.service.target_ratio,
            "keep_recent_messages": config.settings.engine.keep_recent_messages,
            "rule_chain": config.settings.engine.rule_chain,
            "max_result_ratio": config.settings.engine.max_result_ratio,
            "lag": config.lag,
            "step_stride": config.step_stride,
            "summariser": model.name,
            "tokenizer": counter.encoding_name or type(counter).__name__,
        },
    }
    elapsed = {"elapsed_seconds": round(time.perf_counter() - started, 2)}
    if len(reports) == 1:
        return {**head, **reports[0], **elapsed}
    return {
        **head,
        "baseline": config.baseline,
        "policies": config.run_policies,
        "reports": reports,
        **elapsed,
    }
