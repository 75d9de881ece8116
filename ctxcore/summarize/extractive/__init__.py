"""The offline, deterministic summariser, by job.

``features`` (line features, section rules, error detection), ``tools`` (tool-call and
shell parsing), ``items`` (the candidate line), ``candidates`` and ``extract`` (candidate
lines of a source), ``select`` (budgeted selection) and ``model`` (``ExtractiveModel``:
routing and rendering).

It collects candidate lines from the contract's source messages: the user's own requests
and corrections verbatim, the agent's own lines (its code drafts included), tool calls
with a one-line result, the latest write of each file, errors, and the lines of earlier
summaries. It then picks lines greedily by value per token and prints them in their original order, routed to the
contract's sections or blocks, never over the token target.
"""

from ctxcore.summarize.extractive.model import ExtractiveModel

__all__ = ["ExtractiveModel"]
