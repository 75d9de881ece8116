"""``ContextEngineConfig`` and the strict config validation every processor shares.

Deviation from spec section 0: configs reject unknown keys (``extra="forbid"``) instead of
silently ignoring them, so a misspelt threshold fails at ``create_context`` rather than
leaving a processor at its default. Every problem becomes one ``ConfigError`` naming the
component, the field and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, Field, PositiveInt, ValidationError

from ctxcore.config import RecallSettings, Settings
from ctxcore.config.base import RETIRED, STRICT
from ctxcore.config.compaction import UserMarkers
from ctxcore.errors import ConfigError

__all__ = [
    "DEFAULT_DEBUG_DIR",
    "CompressionRecallConfig",
    "ContextEngineConfig",
    "StrictConfig",
    "validate_config",
]

# The reference's last fallback for the debug records' directory (spec 5.4), under the
# working directory.
DEFAULT_DEBUG_DIR = "context/context_debug"

M = TypeVar("M", bound=BaseModel)


class StrictConfig(BaseModel):
    """Base of every ctxcore config model: immutable, unknown keys rejected."""

    model_config = STRICT


def _describe(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in error.get("loc", ()))
    kind = error.get("type", "")
    reason = error.get("msg", "")
    if kind == "extra_forbidden":
        reason = (
            f"removed; {RETIRED[loc]}" if loc in RETIRED else "unknown field (not accepted by this config)"
        )
    if not loc:
        return str(reason).removeprefix("Value error, ")
    shown = "" if kind == "extra_forbidden" else f" (got {error.get('input')!r})"
    return f"field {loc!r}: {reason}{shown}"


def validate_config(model: type[M], raw: M | Mapping[str, Any] | None, component: str) -> M:
    """Build ``model`` from an instance, a plain dict of its fields, or None (defaults).

    Raises:
        ConfigError: naming ``component``, each offending field and the reason.
    """
    if raw is None:
        raw = {}
    if isinstance(raw, model):
        return raw
    if isinstance(raw, BaseModel):
        raise ConfigError(
            f"{component}: expected a {model.__name__} or a dict of its fields, got {type(raw).__name__}"
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{component}: config must be a {model.__name__} or a dict, got {type(raw).__name__}"
        )
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        details = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"{component}: invalid config: {details}") from exc


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
