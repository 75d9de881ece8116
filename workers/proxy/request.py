"""What the proxy reads off a request before it touches the log: the upstream API keys
(once, at start-up), the window's budget from the model's window and the reply's reserve,
and the split of ``messages`` into system/developer messages (never logged) and the rest."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ctxcore.config import ProxySettings, Settings
from ctxcore.contract import check_message
from ctxcore.errors import ConfigError, InvalidMessageError
from ctxcore.messages import AnyMessage, SystemMessage, from_openai
from ctxcore.window import known_context_window
from workers.proxy.errors import ProxyError

__all__ = ["api_keys", "request_budget", "split_messages"]


def api_keys(settings: Settings) -> dict[str, str]:
    """Each configured ``upstream_api_key_env``'s value, read once (at start-up)."""
    names = {
        s.upstream_api_key_env
        for s in [settings.proxy, *(t.proxy for t in settings.tenants.values() if t.proxy)]
    }
    keys: dict[str, str] = {}
    for name in sorted(n for n in names if n):
        value = os.environ.get(name)
        if not value:
            raise ConfigError(
                f"proxy.upstream_api_key_env names {name!r}, which is not set; export it or unset the setting"
            )
        keys[name] = value
    return keys


def request_budget(proxy: ProxySettings, scope: str, model: str, body: Mapping[str, Any]) -> int:
    window = known_context_window(model, proxy.context_window_tokens)
    if window is None:
        raise ProxyError(
            400,
            f"no context window known for model {model!r}: set {scope}.context_window_tokens[{model!r}]",
            "unknown_model_window",
            param="model",
        )
    reserve = proxy.default_reserve_tokens
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ProxyError(400, f"{name} must be a positive integer", "invalid_value", param=name)
            if value >= window:
                raise ProxyError(
                    400,
                    f"{name} ({value}) is at or over the window of {model!r} ({window} tokens): nothing is left for the messages",
                    "invalid_value",
                    param=name,
                )
            reserve = value
            break
    if window - reserve <= 0:
        raise ProxyError(
            400,
            f"{scope}.default_reserve_tokens ({reserve}) leaves no budget in the window of {model!r} ({window})",
            "invalid_value",
            param="max_tokens",
        )
    return window - reserve


def split_messages(
    raw: list[Any],
) -> tuple[list[dict[str, Any]], list[SystemMessage], list[AnyMessage], list[int]]:
    """System/developer messages (raw, and parsed for counting) apart from the rest."""
    system_raw: list[dict[str, Any]] = []
    system: list[SystemMessage] = []
    rest: list[Any] = []
    indices: list[int] = []
    for i, message in enumerate(raw):
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            try:
                parsed = from_openai([{**message, "role": "system"}])[0]
                check_message(i, parsed, stored=False)
            except InvalidMessageError as exc:
                raise ProxyError(
                    400, f"message {i}: {exc.detail}", exc.field, param=f"messages[{i}]"
                ) from None
            system_raw.append(message)
            # from_openai returns AnyMessage; the role forced to "system" makes it a SystemMessage.
            system.append(parsed)  # type: ignore[arg-type]
        else:
            rest.append(message)
            indices.append(i)
    try:
        parsed_rest = from_openai(rest)
    except InvalidMessageError as exc:
        at = indices[exc.index] if exc.index >= 0 else -1
        raise ProxyError(
            400, f"message {at}: field {exc.field!r}: {exc.detail}", exc.field, param=f"messages[{at}]"
        ) from None
    return system_raw, system, parsed_rest, indices
