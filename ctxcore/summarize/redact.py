"""Secret redaction for everything ctxcore writes outside the conversation (dumps, debug logs).

Every pattern is linear: bounded character classes and no nested quantifiers, so a
100 kB tool output is scanned in milliseconds. PEM blocks are cut with ``str.find``
rather than a lazy ``[\\s\\S]*?`` that would rescan the rest of the text per BEGIN line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ctxcore.messages import AnyMessage, AssistantMessage

__all__ = ["REDACTED", "URL_PLACEHOLDER", "redact", "redact_messages", "redact_value", "scrub"]

REDACTED: Final = "[REDACTED]"

# (quick substring test, pattern, replacement). The substring test skips the regex
# entirely on the common text that cannot contain the secret.
_TOKEN_PATTERNS: Final = (
    # OpenAI / Anthropic style keys: sk-..., sk-proj-..., sk-ant-api03-...
    ("sk-", re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), REDACTED),
    # AWS access key ids.
    ("A", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    # GitHub tokens (classic and fine-grained).
    ("gh", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    ("github_pat_", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    # Slack tokens.
    ("xox", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), REDACTED),
    # JSON Web Tokens: three base64url segments, the first two starting with '{"'.
    ("eyJ", re.compile(r"\beyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}"), REDACTED),
)
# With an Authorization header name any token is a secret; a bare "Bearer" must be
# followed by something token-like (long, unbroken) so prose such as "bearer bonds" survives.
_BEARER: Final = re.compile(
    r"(?i:(\bauthorization\b[\"']?\s{0,5}[:=]\s{0,5}[\"']?)(bearer\s{1,5}))[A-Za-z0-9._~+/=\-]{8,}"
    r"|(\bBearer\s{1,5})[A-Za-z0-9._~+/=\-]{20,}"
)
_SECRET_ASSIGNMENT: Final = re.compile(
    r"(?i:(\b(?:[A-Za-z0-9]{0,40}_)?(?:password|passwd|secret|client_secret|secret_key|api_key|apikey|api-key|access_token"
    r"|refresh_token|auth_token|private_key|aws_secret_access_key)[\"']?\s{0,5}[:=]\s{0,5}))"
    r"(\"[^\"\n]{1,512}\"|'[^'\n]{1,512}'|[^\s\"',;&}\])]{1,512})"
)
_SECRET_KEYS: Final = re.compile(
    r"(?i)^(?:\w{0,40}_)?(?:password|passwd|secret|client_secret|secret_key|api_key|apikey|api-key|access_token"
    r"|refresh_token|auth_token|private_key|aws_secret_access_key|authorization)$"
)
_PEM_BEGIN: Final = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----")
_PEM_END: Final = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----")
_PEM_TAIL: Final = re.compile(r"[A-Za-z0-9+/=\s:,\-]*")


def _bearer(match: re.Match[str]) -> str:
    if match.group(2) is not None:
        return match.group(1) + match.group(2) + REDACTED
    return match.group(3) + REDACTED


def _assignment(match: re.Match[str]) -> str:
    value = match.group(2)
    quote = value[0] if value[0] in "\"'" else ""
    return f"{match.group(1)}{quote}{REDACTED}{quote}"


def _redact_pem(text: str) -> str:
    out: list[str] = []
    pos = 0
    while True:
        begin = _PEM_BEGIN.search(text, pos)
        if begin is None:
            break
        out.append(text[pos : begin.start()])
        end = _PEM_END.search(text, begin.end())
        if end is None:
            # A cut-off key (e.g. a truncated tool output) is still a secret: drop the
            # base64 body that follows. No END anywhere later means no later block ends either.
            tail = _PEM_TAIL.match(text, begin.end())
            pos = tail.end() if tail else begin.end()
        else:
            pos = end.end()
        out.append(REDACTED)
    out.append(text[pos:])
    return "".join(out)


def redact(text: str) -> str:
    """``text`` with API keys, tokens, passwords and private keys replaced by ``[REDACTED]``.

    Covers OpenAI/Anthropic ``sk-`` keys, AWS access key ids, GitHub and Slack tokens,
    bearer tokens, ``password=...`` style assignments (plain, quoted or JSON), PEM private
    key blocks and JWTs. Ordinary prose is returned unchanged.
    """
    if not text:
        return text
    if "PRIVATE KEY-----" in text:
        text = _redact_pem(text)
    for probe, pattern, replacement in _TOKEN_PATTERNS:
        if probe in text:
            text = pattern.sub(replacement, text)
    lowered = text.casefold()
    if "bearer" in lowered:
        text = _BEARER.sub(_bearer, text)
    if any(k in lowered for k in ("pass", "secret", "key", "token")):
        text = _SECRET_ASSIGNMENT.sub(_assignment, text)
    return text


URL_PLACEHOLDER: Final = "[url]"
# A URL up to whitespace, a quote or a closing bracket: linear, like the patterns above.
_URL: Final = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]{1,15}://[^\s'\"<>)\]]{1,2048}")
# Shorter values are too likely to occur in ordinary text to be replaced wherever they occur.
_MIN_SECRET_CHARS: Final = 6


def scrub(text: str, secrets: Sequence[str] = (), *, urls: bool = False) -> str:
    """``redact(text)`` after replacing each of ``secrets`` (the deployment's own keys,
    whatever their shape; values under 6 characters are ignored) by ``[REDACTED]``; with
    ``urls`` every URL becomes ``[url]`` too (an internal endpoint is nobody else's business)."""
    for secret in secrets:
        if len(secret) >= _MIN_SECRET_CHARS and secret in text:
            text = text.replace(secret, REDACTED)
    text = redact(text)
    if urls and "://" in text:
        text = _URL.sub(URL_PLACEHOLDER, text)
    return text


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value with every string redacted and secret-named keys blanked.

    Redacting the structure (not its JSON text) keeps the output valid JSON and catches
    ``{"password": "x"}`` even though the key and value are separate strings.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and _SECRET_KEYS.match(k) and v else redact_value(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def redact_messages(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """Copies of ``messages`` with their text parts and tool-call arguments redacted.

    Used at the model-call seam so secrets pasted into a conversation are not sent to the
    summarisation endpoint; messages without a secret are returned as they are.
    """
    out: list[AnyMessage] = []
    for message in messages:
        update: dict[str, Any] = {}
        content = message.content
        if isinstance(content, str):
            cleaned = redact(content)
            if cleaned != content:
                update["content"] = cleaned
        elif isinstance(content, list):
            parts = [redact_value(p) if isinstance(p, str) else _redact_part(p) for p in content]
            if parts != content:
                update["content"] = parts
        if isinstance(message, AssistantMessage) and message.tool_calls:
            calls = [c.model_copy(update={"arguments": redact(c.arguments)}) for c in message.tool_calls]
            if calls != message.tool_calls:
                update["tool_calls"] = calls
        out.append(message.model_copy(update=update) if update else message)
    return out


def _redact_part(part: dict[str, Any]) -> dict[str, Any]:
    # Only the text of a part: image URLs and other fields are passed as they are.
    text = part.get("text")
    if isinstance(text, str):
        return {**part, "text": redact(text)}
    return part
