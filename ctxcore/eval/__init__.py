"""The evaluation harness behind ``ctxcore eval``: replay conversations through a policy and
score every window it serves (protocol, anchors, budget) and the final one (QA answers,
tool-run needles, compression). Pure library: no I/O beyond reading the data file."""

from ctxcore.eval.harness import ConversationResult, EvalConfig, evaluate_conversation, evaluate_file
from ctxcore.eval.policies import POLICIES

__all__ = ["POLICIES", "ConversationResult", "EvalConfig", "evaluate_conversation", "evaluate_file"]
