"""The compaction sections: ``model`` (the summariser), ``engine`` (the rule chain) and ``recall``."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, field_validator, model_validator

from ctxcore.config.base import STRICT
from ctxcore.errors import ConfigError
from ctxcore.recall.index import require_fts5
from ctxcore.turns import HARNESS_USER_PATTERNS, UserDetector, compile_patterns

__all__ = ["EngineSettings", "ModelSettings", "RecallSettings", "UserMarkers"]


class ModelSettings(BaseModel):
    """The summarisation model: any OpenAI-compatible endpoint, or the offline ``ExtractiveModel``
    when ``base_url`` is None."""

    model_config = STRICT
    base_url: str | None = None
    name: str = "gpt-4o-mini"
    api_key_env: str = Field(default="OPENAI_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # A call's timeout is ``timeout`` plus ``timeout_per_output_token`` for each output token
    # it asks for: a CPU model writes ~10-30 tokens a second (bench/real_model.py), so one
    # flat timeout either cuts long summaries or waits a minute on a dead short call.
    timeout: float = Field(default=60.0, gt=0)
    timeout_per_output_token: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=4096, gt=0)
    temperature: float = Field(default=0.0, ge=0, le=2)
    # The model's context length (prompt and output together): a summariser call's input is
    # split or trimmed to fit it with room for the output (None: no limit beyond the
    # pipeline's compression_call_max_tokens).
    context_window_tokens: int | None = Field(default=None, gt=0)

    @property
    def offline(self) -> bool:
        """True when no endpoint is configured (the deterministic offline model is used)."""
        return self.base_url is None


class UserMarkers(BaseModel):
    """Which user-role messages the harness wrote (never the user's intent): defined once, for
    the ``engine`` section and for ``ContextEngineConfig``."""

    model_config = STRICT
    internal_user_prefixes: tuple[str, ...] = ()
    # Regexes of harness-written user messages (never an anchor); () turns the defaults off.
    internal_user_patterns: tuple[str, ...] = HARNESS_USER_PATTERNS
    # Also treat a user message right after a tool-using turn's final reply as internal.
    harness_structure: bool = False

    @field_validator("internal_user_patterns")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        compile_patterns(value, "internal_user_patterns")
        return value

    def detector(self) -> UserDetector:
        """The ``UserDetector`` these settings describe."""
        return UserDetector(
            extra_prefixes=self.internal_user_prefixes,
            patterns=self.internal_user_patterns,
            harness_structure=self.harness_structure,
        )


class EngineSettings(UserMarkers):
    """Tokenizer and conversation-shape knobs shared by every conversation."""

    tokenizer_model: str | None = None
    # The newest three steps (call + result each) stay verbatim through L0->L1: the agent acts
    # on what it just did. Only the most aggressive pass may take them.
    keep_recent_messages: int = Field(default=6, ge=0)
    rule_chain: Literal["default", "none"] = "default"
    # The most of the window one tool result may take in the default chain (ToolResultCap).
    max_result_ratio: float = Field(default=0.25, gt=0, le=1)

    @property
    def result_cap_ratio(self) -> float | None:
        """``max_result_ratio`` when the default chain (whose cap it is) serves the windows,
        else None: compaction and the trigger count tool results whole."""
        return self.max_result_ratio if self.rule_chain == "default" else None


class RecallSettings(BaseModel):
    """Compression recall: archive what compaction folds, search it, spend headroom on it.

    The ``recall`` section, and ``ContextEngineConfig.compression_recall_config`` (spec 2.2).
    """

    model_config = STRICT
    enabled: bool = False
    # Auto-recall: windows spend leftover room on the archived passages closest to the intent.
    auto: bool = False
    chunk_size_tokens: int = Field(default=3000, gt=0)
    chunk_overlap_tokens: int = Field(default=300, ge=0)
    auto_passage_tokens: int = Field(default=256, gt=0)
    auto_max_ratio: float = Field(default=0.25, gt=0, le=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.chunk_overlap_tokens >= self.chunk_size_tokens:
            raise ConfigError(
                f"chunk_overlap_tokens ({self.chunk_overlap_tokens}) must be below chunk_size_tokens "
                f"({self.chunk_size_tokens})"
            )
        if self.auto and not self.enabled:
            raise ConfigError("auto needs enabled: set enabled = true as well")
        if self.enabled:
            require_fts5("recall.enabled")
        return self
