"""The loop: ``compress_until_target`` plans and runs stages until the view fits (embedded
use; the distributed workers run one stage per task)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxcore.errors import ModelError
from ctxcore.pipeline.checks import rejected_view_error, view_violations
from ctxcore.pipeline.models import STAGE_ORDER, PipelineConfig, StageResult
from ctxcore.pipeline.planning import plan_next_stage
from ctxcore.pipeline.running import run_stage
from ctxcore.pipeline.view import View
from ctxcore.summarize.blocks import Summarizer
from ctxcore.summarize.model import ModelClient
from ctxcore.tokens import TokenCounter

__all__ = ["PipelineRun", "compress_until_target"]


@dataclass
class PipelineRun:
    """The outcome of ``compress_until_target``."""

    view: View
    results: list[StageResult] = field(default_factory=list)
    errors: list[tuple[str, Exception]] = field(default_factory=list)


def compress_until_target(
    view: View,
    config: PipelineConfig,
    model_client: ModelClient | None,
    counter: TokenCounter,
    summarizer: Summarizer | None = None,
    *,
    max_stages: int = 32,
) -> PipelineRun:
    """Run stages until ``view`` fits ``config.target_tokens`` or no stage can help.

    A stage whose model call fails, that does not make the view smaller or whose result
    breaks the chat protocol (a custom summariser's orphan tool result, say: skipped, with
    an ``InvalidWindowError`` in ``errors``) is marked exhausted and the next kind is tried,
    ending with the deterministic hard truncate. Without ``model_client`` only the stages
    that need none run: ``l0_to_l1`` through ``summarizer`` (if given) and the hard truncate.
    """
    run = PipelineRun(view=view)
    exhausted: set[str] = set() if model_client is not None else _model_stages(summarizer)
    for _ in range(max_stages):
        stage = plan_next_stage(run.view, config, counter, exhausted=exhausted)
        if stage is None:
            break
        try:
            result = run_stage(stage, run.view, model_client, counter, summarizer, config=config)
        except ModelError as exc:
            run.errors.append((stage.kind, exc))
            exhausted.add(stage.kind)
            continue
        run.results.append(result)
        if not result.changed:
            exhausted.add(stage.kind)
            continue
        adopted = run.view.with_blocks(result.blocks, result.covered_until, version=run.view.version + 1)
        violations = view_violations(adopted)
        if violations:
            run.errors.append((stage.kind, rejected_view_error(run.view, stage.kind, "view", violations)))
            exhausted.add(stage.kind)
            continue
        run.view = adopted
    return run


def _model_stages(summarizer: Summarizer | None) -> set[str]:
    """The stage kinds that call the model client (``run_stage`` refuses them without one)."""
    free = {"hard_truncate", "l0_to_l1"} if summarizer is not None else {"hard_truncate"}
    return {kind for kind in STAGE_ORDER if kind not in free}
