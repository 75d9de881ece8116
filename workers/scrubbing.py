"""What must never leave a process: the deployment's own keys, and the exceptions that may
carry them.

``deployment_secrets`` lists the values to look for (the summarisers' and the proxy's API
keys, read from the environment variables the settings name, and the passwords of the
store and broker URLs). ``scrub_exception`` redacts an exception in place, down its chain
of causes, before Celery stores it (result backend), sends it (``task-failed`` and
``task-retried`` events, which Flower shows) or logs it: the text of a provider error that
echoes the ``Authorization`` it received is then ``[REDACTED]`` there as in ``last_error``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

from celery.exceptions import Retry

from ctxcore.config import Settings
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.redact import scrub
from workers.failures import StageFailedError

__all__ = ["deployment_secrets", "scrub_exception"]

E = TypeVar("E", bound=BaseException)


def deployment_secrets(settings: Settings, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secret values of this deployment that a message may echo (see the module docstring)."""
    env = os.environ if environ is None else environ
    names: set[str] = {settings.model.api_key_env}
    if settings.proxy.upstream_api_key_env:
        names.add(settings.proxy.upstream_api_key_env)
    for tenant in settings.tenants.values():
        if tenant.model is not None:
            names.add(tenant.model.api_key_env)
        if tenant.proxy is not None and tenant.proxy.upstream_api_key_env:
            names.add(tenant.proxy.upstream_api_key_env)
    values = {env[name] for name in names if env.get(name)}
    for url in (settings.redis.url, settings.worker.broker_url, settings.database.url):
        password = urlsplit(url).password if url else None
        if password:
            values.add(password)
    # Longest first: a key that contains another is replaced whole.
    return tuple(sorted(values, key=len, reverse=True))


def scrub_exception(exc: E, secrets: Sequence[str]) -> E:
    """``exc`` with every string argument (and a model error's ``message``) of it and of its
    causes and contexts redacted in place, URLs included; returns ``exc``.

    In place, so the class and attributes callers classify by stay, and Celery formats its
    traceback text from the redacted chain. A ``Retry`` is scrubbed through the error it carries.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.args = tuple(scrub(a, secrets, urls=True) if isinstance(a, str) else a for a in current.args)
        if isinstance(current, ModelCallError | StageFailedError):
            current.message = scrub(current.message, secrets, urls=True)
        if isinstance(current, Retry):
            pending.append(current.exc if isinstance(current.exc, BaseException) else None)
            if isinstance(current.message, str):
                current.message = scrub(current.message, secrets, urls=True)
        pending.extend((current.__cause__, current.__context__))
    return exc
