"""The evaluation harness behind ``ctxcore eval``: replay conversations through context policies
side by side with simple baselines, and score every window they serve (protocol, anchors,
budget, probes of the raw run) and the final one (QA answers, probes, compression). Pure
library: no I/O beyond reading the data file and the optional windows file."""

from ctxcore.eval.harness import evaluate_conversation
from ctxcore.eval.policies import POLICIES
from ctxcore.eval.results import ConversationResult
from ctxcore.eval.runner import DEFAULT_BASELINE, EvalConfig, evaluate_file

__all__ = [
    "DEFAULT_BASELINE",
    "POLICIES",
    "ConversationResult",
    "EvalConfig",
    "evaluate_conversation",
    "evaluate_file",
]
