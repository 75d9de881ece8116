"""Planning and running pipeline stages: pure functions over a ``View``.

``plan_next_stage`` picks the first stage, in the fixed order L0->L1, recursive merge,
aggressive keep-recent, aggressive full-context, hard truncate, that has work to do on a
view over its target. ``run_stage`` runs exactly one and returns the full new block list;
it never mutates the view. ``compress_until_target`` loops the two (embedded use); the
distributed workers run one stage per task and save each result with compare-and-swap.

Layout: ``planning`` (``plan_next_stage``), ``running`` (``run_stage``), ``model_call`` (the
round-level stages' prompt and reply) and ``loop`` (``compress_until_target``); this module
re-exports their names.
"""

from __future__ import annotations

from ctxcore.pipeline.loop import PipelineRun, compress_until_target
from ctxcore.pipeline.planning import MIN_L1_SOURCE_TOKENS, plan_next_stage
from ctxcore.pipeline.running import SUMMARIZER_CONTEXT_FLOOR, SUMMARIZER_CONTEXT_RATIO, run_stage
from ctxcore.summarize.blocks import Summarizer, parse_blocks

__all__ = [
    "MIN_L1_SOURCE_TOKENS",
    "SUMMARIZER_CONTEXT_FLOOR",
    "SUMMARIZER_CONTEXT_RATIO",
    "PipelineRun",
    "Summarizer",
    "compress_until_target",
    "parse_blocks",
    "plan_next_stage",
    "run_stage",
]
