"""Pipeline configuration and the stage records that travel between planner, runner and workers."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ctxcore.errors import ConfigError
from ctxcore.markers import ROUND_LEVEL_MEMORY_BLOCK, TRUNCATED
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.model import Usage

__all__ = ["STAGE_ORDER", "PipelineConfig", "Stage", "StageKind", "StageResult"]

StageKind = Literal[
    "l0_to_l1", "recursive_merge", "aggressive_keep_recent", "aggressive_full_context", "hard_truncate"
]

STAGE_ORDER: tuple[StageKind, ...] = (
    "l0_to_l1",
    "recursive_merge",
    "aggressive_keep_recent",
    "aggressive_full_context",
    "hard_truncate",
)


class PipelineConfig(BaseModel):
    """Targets and knobs of the compaction pipeline.

    Pass targets left unset default to 30/160, 20/160 and 10/160 of ``target_tokens``
    (the reference's 30k/20k/10k of 160k): the least one pass may produce; a pass may use
    the room left under ``target_tokens``. L0->L1 summarises only the oldest whole steps it
    needs to reach the target (``summarise_all_pending``: every eligible step, as the
    incremental ``Coordinator.compress`` API promises).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_tokens: int = Field(gt=0)
    keep_recent_messages: int = Field(default=4, ge=0)
    first_pass_target_tokens: int | None = Field(default=None, gt=0)
    second_pass_target_tokens: int | None = Field(default=None, gt=0)
    third_pass_target_tokens: int | None = Field(default=None, gt=0)
    truncate_head_ratio: float = Field(default=0.2, gt=0, lt=1)
    compression_call_max_tokens: int = Field(default=250_000, gt=0)
    # The summarisation model's context (input and output together; None: no limit): each
    # call's input is split across calls or trimmed to fit it with room for the output.
    context_window_tokens: int | None = Field(default=None, gt=0)
    # The most output the model client sends for (model.max_tokens): the room a call keeps
    # for its output within the context is no larger (None: what the pipeline asks for).
    max_output_tokens: int | None = Field(default=None, gt=0)
    # Raw tokens one L1 block stands for at most: bounds what one summary must hold.
    l1_source_tokens: int | None = Field(default=None, gt=0)
    summarise_all_pending: bool = False
    # The most tokens one tool result of the tail takes in a served window (the default
    # chain's ``ToolResultCap``): the excess is never served, so compaction does not try
    # to make room for it (None: results are served whole).
    result_cap_tokens: int | None = Field(default=None, gt=0)
    # The most the served view may cost (the window's budget; None: ``target_tokens``). When
    # the verbatim tail alone is over the target, the hard truncate keeps the block lines that
    # fit under this instead of wiping every block to its marker: the window fits its budget
    # either way, and what a wiped block said would be gone for good.
    ceiling_tokens: int | None = Field(default=None, gt=0)
    # The most of ``target_tokens`` the summary blocks together may fill: the rest is the
    # verbatim tail's, which is what the agent acts on (the pass targets still bound each
    # summary from below).
    summary_share: float = Field(default=0.4, gt=0, le=1)
    # ... but never less than this many tokens (nor more than the target): a share of a small
    # room (tau-bench's ~1,000 tokens, a 4k budget) left a block a few lines after its header
    # and sections, and every compaction folded the results the agent quotes next into it.
    # Below what the share gives at 8k (2,560; 2,480 with the recall tool's definition in the
    # budget, where a floor of 2,500 already moved A 8k by -0.007), so 8k and up are as they
    # were (bench/README, "Small rooms"): tau-bench 0.592 -> 0.639 of next-step references.
    summary_floor_tokens: int = Field(default=2000, ge=0)
    # The protected recent messages are shown to the summariser for understanding only (it
    # never summarises them): each as its first and last characters, this many in all, so a
    # large tool output is not paid for in every call (0: whole).
    protected_preview_chars: int = Field(default=800, ge=0)
    compression_marker: str = ROUND_LEVEL_MEMORY_BLOCK
    truncated_marker: str = TRUNCATED
    # Secrets (API keys, tokens, passwords, private keys) are cut from the prompt sent to
    # the summarisation endpoint; turn off only for a model you trust with them.
    redact_secrets: bool = True

    @model_validator(mode="after")
    def _check(self) -> Self:
        first, second, third = self.pass_targets()
        if not third <= second <= first:
            raise ConfigError(
                f"pass targets must satisfy third ({third}) <= second ({second}) <= first ({first})"
            )
        return self

    def pass_targets(self) -> tuple[int, int, int]:
        """First, second and third pass targets, defaults resolved."""
        t = self.target_tokens
        return (
            self.first_pass_target_tokens or max(t * 30 // 160, 1),
            self.second_pass_target_tokens or max(t * 20 // 160, 1),
            self.third_pass_target_tokens or max(t * 10 // 160, 1),
        )

    def chunk_tokens(self) -> int:
        """Raw tokens per L1 block."""
        return self.l1_source_tokens or max(self.pass_targets()[0] * 6, 3000)


class Stage(BaseModel):
    """One planned pipeline stage over a view of ``based_on_version``.

    ``first_id``/``last_id`` bound the raw tail messages it summarises (None when it
    touches no raw message); ``block_ids`` name the existing blocks it replaces.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: StageKind
    based_on_version: int = Field(ge=0)
    target_tokens: int = Field(gt=0)
    first_id: str | None = None
    last_id: str | None = None
    block_ids: list[str] = Field(default_factory=list)


class StageResult(BaseModel):
    """What a stage produced: the full new ordered block list, cursor and pinned ids.

    ``changed`` is False when the stage could not improve the view (model failure,
    no benefit): the caller keeps the previous state and escalates.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: Stage
    blocks: list[SummaryBlock]
    covered_until: str | None
    pinned: list[str]
    changed: bool
    tokens_before: int
    tokens_after: int
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    detail: str = ""
    # Verify before commit (``pipeline.verify``): working-set lines put back into the
    # stage's blocks, and targets whose steps stayed raw because their lines did not fit.
    restored_lines: int = 0
    kept_raw: int = 0

    def usage(self, model: str = "") -> Usage:
        """The summariser usage of this stage."""
        return Usage(
            self.input_tokens,
            self.output_tokens,
            self.input_tokens + self.output_tokens,
            self.model_calls,
            model,
        )
