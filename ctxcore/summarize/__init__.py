"""Summarisation: the model seam, the offline extractive model and the call executor.

``ModelClient`` is anything with ``complete(messages, *, max_tokens, contract)``:
``OpenAIChatModel`` for an OpenAI-compatible endpoint, ``ExtractiveModel`` offline.
Compressors pass an ``OutputContract`` beside the prompt and run calls through a
``CompressionExecutor`` (classification, retries, overflow shrinking, diagnostics).
"""

from ctxcore.summarize.errors import ModelCallError, classify_error, is_context_overflow_error
from ctxcore.summarize.executor import CompressionExecutor
from ctxcore.summarize.extractive import ExtractiveModel
from ctxcore.summarize.model import Completion, ContractBlock, ModelClient, OutputContract, Usage
from ctxcore.summarize.openai_chat import OpenAIChatModel
from ctxcore.summarize.redact import redact

__all__ = [
    "Completion",
    "CompressionExecutor",
    "ContractBlock",
    "ExtractiveModel",
    "ModelCallError",
    "ModelClient",
    "OpenAIChatModel",
    "OutputContract",
    "Usage",
    "classify_error",
    "is_context_overflow_error",
    "redact",
]
