"""The processor contract: four hooks, an active-compression hook, a kind, the context they see.

A processor is a configured object the engine calls at two moments:

* **add** (``trigger_add_messages`` then ``on_add_messages``): with the batch being added;
  it returns the batch to append and may rewrite the stored view with ``ctx.set_messages``.
* **window** (``trigger_get_context_window`` then ``on_get_context_window``): with the
  window being built; it returns the window to serve and may persist a rewrite with
  ``ctx.set_messages``.

Active compression (``ModelContext.compress_context``) calls ``on_compress``. Which
processors it runs is decided by ``kind`` (offloaders first, then compressors; views never),
not by substrings of class names as in the reference (spec 3.4).

Triggers must be cheap: they run on every add and every window. Hooks are synchronous and
run under the context's processor lock, so a hook never races another hook of its context;
for the same reason a hook must not call ``add_messages`` or ``get_context_window`` of its
own context (the lock is not re-entrant).
Every hook receives ``**kwargs``: ``force`` (active compression) and ``phase`` always,
``compression_trigger`` and ``preserve_instruction`` in active compression.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

from ctxcore.config.base import StrictConfig, validate_config
from ctxcore.messages import AnyMessage
from ctxcore.processors.events import ContextEvent
from ctxcore.processors.rules import RuleEnv
from ctxcore.window import ContextWindow

if TYPE_CHECKING:
    from ctxcore.recall.embedded import ContextArchive
    from ctxcore.state.keys import ConversationKey
    from ctxcore.tokens import TokenCounter
    from ctxcore.turns import UserDetector

__all__ = ["ContextProcessor", "HeadroomConfig", "Kind", "ProcessorConfig", "ProcessorContext"]

Kind = Literal["offloader", "compressor", "view"]


class ProcessorContext(Protocol):
    """What a hook may use of the context it runs in (``ModelContext`` satisfies it).

    Declared here, in the processors' layer, so processors never import the engine: the
    engine depends on processors, not the other way round.
    """

    @property
    def key(self) -> ConversationKey:
        """The conversation offloads are stored under."""
        ...

    @property
    def token_counter(self) -> TokenCounter:
        """The counter every size in this context is measured with."""
        ...

    @property
    def detector(self) -> UserDetector:
        """Tells real user turns from harness-injected ones."""
        ...

    @property
    def context_max(self) -> int:
        """The model's window in tokens."""
        ...

    @property
    def archive(self) -> ContextArchive | None:
        """Where folded messages are archived for recall (None with recall off)."""
        ...

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds source for TTL decisions."""
        ...

    @property
    def last_window_access(self) -> float | None:
        """Clock value of the last window, None before the first."""
        ...

    @property
    def usage_fresh_after(self) -> str | None:
        """The log id after which provider-reported usage still describes the view."""
        ...

    def get_messages(self) -> list[AnyMessage]:
        """The current view."""
        ...

    def set_messages(self, messages: Sequence[AnyMessage]) -> None:
        """Replace the view (the log is untouched)."""
        ...

    def rule_env(self, new_ids: frozenset[str] | None = None) -> RuleEnv:
        """The environment rule processors run in."""
        ...

    def window_rule_env(self, window: ContextWindow) -> RuleEnv:
        """``rule_env`` with the window's room for context messages."""
        ...

    def archive_folded(self, messages: Sequence[AnyMessage]) -> None:
        """Archive what a compressor is about to fold (a no-op with recall off)."""
        ...

    def reload(self, handle: str) -> list[AnyMessage]:
        """The originals stored under an offload handle ([] if unknown)."""
        ...

    def api_key(self, env_name: str) -> str | None:
        """The API key in environment variable ``env_name``, read by the engine at start-up."""
        ...

    @property
    def debug_dir(self) -> str | None:
        """Where compressors write dumps and debug records (``enable_context_debug``; None: none)."""
        ...


class ProcessorConfig(StrictConfig):
    """Base of processor configs: immutable, unknown keys rejected with ``ConfigError``."""


class HeadroomConfig(ProcessorConfig):
    """Base of the configs of rules that can be headroom-aware (``RuleProcessor.headroom_aware``).

    Attributes:
        act_only_over_budget: act only while the messages are over the room of a window
            (the default chain's mode; see ``ctxcore.processors.rule_processor``).
    """

    act_only_over_budget: bool = False


C = TypeVar("C", bound=ProcessorConfig)


class ContextProcessor(Generic[C]):
    """Base class of every processor.

    Subclasses set ``config_model`` (their pydantic config class) and ``kind``, and override
    the hooks they need; the defaults never trigger and pass everything through unchanged.

    Args:
        config: an instance of ``config_model``, a dict of its fields, or None for defaults.

    Raises:
        ConfigError: an unknown key or an invalid value, naming processor, field and reason.
    """

    config_model: ClassVar[type[ProcessorConfig]] = ProcessorConfig
    kind: ClassVar[Kind] = "compressor"

    def __init__(self, config: C | Mapping[str, Any] | None = None) -> None:
        self.config: C = validate_config(self.config_model, config, self.processor_type())  # type: ignore[assignment]

    @classmethod
    def processor_type(cls) -> str:
        """The name it reports in events and errors, and a registry's default name for it:
        the class name (``ProcessorRegistry.register(name=...)`` adds another name in that
        registry only)."""
        return cls.__name__

    def model_name(self) -> str:
        """The summarisation model this processor calls, for state events ("" when none)."""
        return ""

    def api_key_env(self) -> str | None:
        """The environment variable its model's API key is read from (None: it needs none);
        ``ContextEngine`` reads those variables once, at start-up."""
        return None

    def guarantees_budget(self) -> bool:
        """True if a context holding this processor promises windows within its window size:
        the engine then shapes a window still over it (``assemble.fit_to_budget``), or raises
        ``BudgetExceeded`` when system messages, tools and anchors alone are over. Other
        contexts serve what they hold (spec 2.4). Default False."""
        return False

    # --- add ---------------------------------------------------------------------------

    def trigger_add_messages(self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any) -> bool:
        """Whether ``on_add_messages`` should run for this batch (cheap; default False)."""
        return False

    def on_add_messages(
        self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Process a batch; returns (event or None, the batch to append)."""
        return None, messages

    # --- window ------------------------------------------------------------------------

    def trigger_get_context_window(self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any) -> bool:
        """Whether ``on_get_context_window`` should run for this window (cheap; default False)."""
        return False

    def on_get_context_window(
        self, ctx: ProcessorContext, window: ContextWindow, **kwargs: Any
    ) -> tuple[ContextEvent | None, ContextWindow]:
        """Process a window; returns (event or None, the window to serve)."""
        return None, window

    # --- active compression ------------------------------------------------------------

    def on_compress(
        self, ctx: ProcessorContext, messages: list[AnyMessage], **kwargs: Any
    ) -> tuple[ContextEvent | None, list[AnyMessage]]:
        """Compress the whole view on request; returns (event or None, the new view).

        The default follows spec 3.4: a processor with a window hook gets the whole view as
        a window (an offloader only if its window trigger agrees); any other processor runs
        its add hook with an empty batch and ``force=True`` and the view is read back.
        """
        cls = type(self)
        if cls.on_get_context_window is not ContextProcessor.on_get_context_window:
            window = ContextWindow(context_messages=messages)
            if self.kind == "offloader" and not self.trigger_get_context_window(ctx, window, **kwargs):
                return None, messages
            event, window = self.on_get_context_window(ctx, window, **kwargs)
            return event, window.context_messages
        event, _ = self.on_add_messages(ctx, [], **kwargs)
        return event, ctx.get_messages()

    # --- state -------------------------------------------------------------------------

    def save_state(self) -> dict[str, Any]:
        """JSON-ready processor state saved with the context (built-ins are stateless)."""
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what ``save_state`` returned."""
