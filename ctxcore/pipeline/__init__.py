"""The compaction pipeline: pure stages over a ``View``, shared by embedded and distributed use."""

from ctxcore.pipeline.models import STAGE_ORDER, PipelineConfig, Stage, StageKind, StageResult
from ctxcore.pipeline.stages import (
    PipelineRun,
    Summarizer,
    compress_until_target,
    parse_blocks,
    plan_next_stage,
    run_stage,
)
from ctxcore.pipeline.view import BLOCK_META, View, block_message, block_provenance

__all__ = [
    "BLOCK_META",
    "STAGE_ORDER",
    "PipelineConfig",
    "PipelineRun",
    "Stage",
    "StageKind",
    "StageResult",
    "Summarizer",
    "View",
    "block_message",
    "block_provenance",
    "compress_until_target",
    "parse_blocks",
    "plan_next_stage",
    "run_stage",
]
