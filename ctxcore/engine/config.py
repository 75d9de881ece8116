"""``ContextEngineConfig``: the embedded engine's settings (validated strictly, as every
config is, by ``config.base.validate_config``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveInt

from ctxcore.config import RecallSettings, Settings
from ctxcore.config.base import validate_config
from ctxcore.config.compaction import UserMarkers

__all__ = ["DEFAULT_DEBUG_DIR", "CompressionRecallConfig", "ContextEngineConfig"]

# The reference's last fallback for the debug records' directory (spec 5.4), under the
# working directory.
DEFAULT_DEBUG_DIR = "context/context_debug"

CompressionRecallConfig = RecallSettings
"""Chunking of archived originals for recall by LLM compressors (spec 2.2): the ``recall``
section's model. With ``enabled`` what the compressors fold is archived in the context and
searchable (``ModelContext.recall``, the ``recall_compressed_context`` tool in every window)."""


class ContextEngineConfig(UserMarkers):
    """Engine-wide settings (spec 2.2) with ctxcore's deliberate changes.

    * ``enable_tiktoken_counter`` defaults to True: budgets are compared with exact counts;
      False selects ``EstimateCounter`` (``len // 4``).
    * No OpenRouter lookup of model windows (the library never touches the network), so
      the two ``*openrouter*`` fields of the reference do not exist here.
    * ``strict_processors``: a processor failure is re-raised after the pipeline finished
      (still isolated, so the context stays consistent); tests turn this on.
    * ``internal_user_prefixes`` / ``internal_user_patterns``: more internal user-role
      markers, on top of ctxcore's own, that never count as real user messages; the
      patterns default to ``HARNESS_USER_PATTERNS`` (deviation from spec 1.4: harness
      reminders are not the user's intent), ``()`` turns them off. ``harness_structure``
      adds the structural rule of ``UserDetector`` (off: it also catches a person's reply).
      These three are the ``engine`` section's (``UserMarkers``), defined once.
    * ``enable_reload`` adds the ``reload_original_context_messages`` tool definition to
      every window's tools.
    """

    max_context_message_num: PositiveInt | None = None
    default_window_message_num: PositiveInt | None = None
    default_window_round_num: PositiveInt | None = None
    enable_reload: bool = False
    enable_tiktoken_counter: bool = True
    context_window_tokens: PositiveInt | None = None
    model_name: str | None = None
    model_context_window_tokens: dict[str, PositiveInt] | None = None
    compression_recall_config: CompressionRecallConfig = Field(default_factory=CompressionRecallConfig)
    # The compressors' dumps (spec 5.3) and JSONL debug records (spec 5.4) go to
    # ``context_debug_dir`` (``{session_id}``/``{context_id}`` expanded; None:
    # ``DEFAULT_DEBUG_DIR``) when on, as the reference's rail sets each compressor's
    # ``enable_compression_dump``/``compression_dump_dir``; a compressor's own dump
    # settings win. Rule processors write none.
    enable_context_debug: bool = False
    context_debug_dir: str | None = None
    strict_processors: bool = False

    @classmethod
    def from_settings(cls, settings: Settings, **fields: Any) -> ContextEngineConfig:
        """The engine config of a ``Settings`` tree: the ``engine`` section's user markers and
        tokenizer model (as ``model_name``) and the ``recall`` section; ``fields`` add to them.

        Raises:
            ConfigError: an invalid or unknown field, naming it.
        """
        engine = settings.engine
        tree = {
            **engine.model_dump(include=set(UserMarkers.model_fields)),
            "model_name": engine.tokenizer_model,
            "compression_recall_config": settings.recall,
        }
        return validate_config(cls, tree | fields, "ContextEngineConfig")
