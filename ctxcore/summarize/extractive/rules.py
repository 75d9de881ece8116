"""The extractive summariser's rules, each one switchable for an ablation.

The product always runs every rule (``ALL_RULES``, ``ExtractiveModel``'s default); the
ablation bench (``bench/rule_ablation.py``) turns one off at a time and scores the
next-step references with and without it on both development halves: a rule stays only
while it pays there (bench/README, "Every rule pays").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from ctxcore.errors import ConfigError

__all__ = ["ALL_RULES", "Rules", "names", "without"]


@dataclass(frozen=True)
class Rules:
    """Which rules apply (every one by default).

    Content rules: ``commands_whole`` (a shell command up to 1,000 characters, never cut at
    320; a text or an argument vector, printed without the flags a harness adds beside it),
    ``lists_joined`` (bare list items joined to their sentence), ``bare_joined`` (a
    line of bare names or numbers is no candidate alone: joined to the line it belongs to in
    its message, dropped when it has none; a call's line and an earlier summary's lines are
    taken as they are), ``output_errors`` (a tool output's error lines beyond its first
    line; kept for the eval's last-exception check, bench/README issue 33c),
    ``script_lines`` (each code line a call writes, a script the agent writes, competes as a
    line of the agent's own: a shell command's heredoc bodies, an editor's ``file_text`` or
    ``new_str``), ``json_fields`` (a tool result that is one
    JSON document competes field by field, each top-level field or array item a line of
    compact JSON, a field too long for one line by its records under their paths, instead of
    as its first 200 characters). Weights:
    ``category_priors`` (a prior per kind of line, else one flat prior), ``summary_bonus``
    (an earlier summary's line +1, its request +3), ``question_weight`` (a dialogue question
    half a statement's weight; moves no next-step reference, kept for LoCoMo's c_hit goal,
    bench/README issue 33d). Rules measured and
    removed for not paying on both halves (bench/README, issue 33): the first and newest
    failure lines, the files written and the files looked at, the line features, the
    discount of lines the context holds, the files' reserved share, a tool output's path or
    date lines, fenced code left out, and (issue 33c) the newest call kept whatever
    competes, each further line of one message worth less (0.6 per line) and later lines
    worth more (2.0 over the span), and (issue 33d) a short system note's (a session's date
    line) +2, each numbered line of a code listing a tool printed competing with its
    number, and each further sentence of one dialogue turn worth less (0.6 per sentence).
    """

    commands_whole: bool = True
    lists_joined: bool = True
    bare_joined: bool = True
    output_errors: bool = True
    script_lines: bool = True
    json_fields: bool = True
    category_priors: bool = True
    summary_bonus: bool = True
    question_weight: bool = True


ALL_RULES: Final = Rules()


def names() -> list[str]:
    """Every rule's name, in declaration order."""
    return [f.name for f in dataclasses.fields(Rules)]


def without(*off: str) -> Rules:
    """Every rule but ``off`` (names of ``Rules`` fields)."""
    known = set(names())
    unknown = [name for name in off if name not in known]
    if unknown:
        raise ConfigError(f"unknown extractive rule {', '.join(unknown)}; rules: {', '.join(sorted(known))}")
    return dataclasses.replace(ALL_RULES, **{name: False for name in off})
