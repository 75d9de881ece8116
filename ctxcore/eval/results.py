"""What a replay measures: one conversation under one policy, its checkpoints and final window."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ctxcore.eval.references import Checkpoint
from ctxcore.eval.scoring import QATally
from ctxcore.messages import AnyMessage

__all__ = ["CheckpointScore", "ConversationResult", "FinalWindow"]


@dataclass
class CheckpointScore:
    """One checkpoint's window under one policy: the references it holds (``hits``, in the
    order of ``checkpoint.references``), its tokens (None: the window raised), and whether the
    run up to there is over the budget by at least its newest step (``pressed``: the window
    must leave something out)."""

    checkpoint: Checkpoint
    hits: tuple[bool, ...]
    tokens: int | None
    budget: int
    pressed: bool

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record: the references held and missed by kind."""
        refs = self.checkpoint.references
        return {
            "share": self.checkpoint.share,
            "message": self.checkpoint.index,
            "references": len(refs),
            "held": sum(self.hits),
            "missed": [r.text for r, hit in zip(refs, self.hits, strict=True) if not hit][:20],
            "fill": None if self.tokens is None else round(self.tokens / self.budget, 4),
        }


@dataclass
class FinalWindow:
    """The last window of a replay as it would be sent (empty with ``error`` when it raised)."""

    messages: list[AnyMessage] = field(default_factory=list)
    tools: list[Mapping[str, Any]] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


@dataclass
class ConversationResult:
    """Everything measured on one conversation under one policy."""

    id: str
    policy: str
    budget: int
    messages: int
    raw_tokens: int
    reference: bool = False
    windows: int = 0
    failed: int = 0
    failure_kinds: Counter[str] = field(default_factory=Counter)
    violations: int = 0
    anchor_windows: int = 0
    over_budget_windows: int = 0
    fallback_windows: int = 0
    peak_tokens: int = 0
    final_tokens: int = 0
    stages: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stage_failures: int = 0
    summariser_calls: int = 0
    summariser_input_tokens: int = 0
    summariser_output_tokens: int = 0
    elapsed_seconds: float = 0.0
    qa: QATally | None = None
    control: QATally | None = None
    control_truncate: QATally | None = None
    # The fixed compacted set scored on the final window plus one recall-tool call with the
    # question (policies with the tool only): what the agent can find by asking.
    qa_tool: QATally | None = None
    # The control asked the same way: other conversations' questions put to this one's tool.
    control_tool: QATally | None = None
    probes_final: dict[str, float] = field(default_factory=dict)
    probes_windows: dict[str, float] = field(default_factory=dict)
    malformed_calls: int = 0
    recall_windows: int = 0
    recall_passages: int = 0
    recall_tokens: int = 0
    recall_query_ms: list[float] = field(default_factory=list)
    series: list[tuple[int, int]] = field(default_factory=list)
    final: FinalWindow = field(default_factory=FinalWindow)
    # Summary lines of the final window's blocks (``ctxcore.eval.readability``).
    readability: dict[str, int] = field(default_factory=dict)
    checkpoints: list[CheckpointScore] = field(default_factory=list)
    # Tokens of each part of the budget summed over the served windows that had to leave
    # something out (``accounting.PARTS``; ``_Replay.pressed``), and how many there were.
    parts: Counter[str] = field(default_factory=Counter)
    pressed_windows: int = 0
    # Input tokens of every served window, and how many of them repeat the previous window's
    # leading messages exactly (what a prefix cache serves).
    input_tokens: int = 0
    cached_tokens: int = 0

    @property
    def budget_exceeded(self) -> int:
        """Windows that raised ``BudgetExceeded``."""
        return self.failure_kinds.get("budget_exceeded", 0)

    @property
    def anchor_rate(self) -> float | None:
        """Windows with both anchors verbatim, over every window (failed ones included)."""
        return round(self.anchor_windows / self.windows, 4) if self.windows else None

    @property
    def compression_ratio(self) -> float:
        """Raw tokens over final window tokens."""
        return self.raw_tokens / self.final_tokens if self.final_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        out: dict[str, Any] = {
            "id": self.id,
            "policy": self.policy,
            "budget": self.budget,
            "messages": self.messages,
            "raw_tokens": self.raw_tokens,
            "windows": self.windows,
            "failed": self.failed,
            "failure_row": dict(self.failure_kinds),
            "budget_exceeded": self.budget_exceeded,
            "violations": self.violations,
            "anchor_rate": self.anchor_rate,
            "over_budget_windows": None if self.reference else self.over_budget_windows,
            "fallback_windows": self.fallback_windows,
            "peak_window_tokens": self.peak_tokens,
            "peak_budget_ratio": round(self.peak_tokens / self.budget, 4),
            "final_window_tokens": self.final_tokens,
            "budget_use": round(self.final_tokens / self.budget, 4),
            "compression_ratio": round(self.compression_ratio, 3),
            "stages": dict(self.stages),
            "failures": self.failures[:10],
            "stage_failures": self.stage_failures,
            "summariser_calls": self.summariser_calls,
            "summariser_input_tokens": self.summariser_input_tokens,
            "summariser_output_tokens": self.summariser_output_tokens,
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "window_tokens": [list(p) for p in self.series],
        }
        if self.qa is not None:
            out["qa"] = self.qa.rates()
        if self.recall_query_ms:
            out["recall"] = {
                "windows": self.recall_windows,
                "passages": self.recall_passages,
                "tokens": self.recall_tokens,
            }
        if self.probes_final or self.probes_windows:
            out["probes"] = {
                name: {"final": round(self.probes_final[name], 4), "windows": self.probes_windows.get(name)}
                for name in self.probes_final
            }
            out["malformed_calls"] = self.malformed_calls
        if self.readability:
            out["readability"] = dict(self.readability)
        if self.checkpoints:
            out["checkpoints"] = [c.as_dict() for c in self.checkpoints]
        out["window_input_tokens"] = self.input_tokens
        out["cached_tokens"] = self.cached_tokens
        out["parts"] = dict(self.parts)
        out["pressed_windows"] = self.pressed_windows
        return out
