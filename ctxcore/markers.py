"""Every tag and marker ctxcore writes into message text, in one place.

Internal user-role messages start with one of these, which is how they are told apart
from real user messages (``turns.is_real_user``).
"""

from __future__ import annotations

# Forked-generation memory blocks (spec section 6).
MEMORY_BLOCK_CURRENT = "<memory_block_current>"
MEMORY_BLOCK_DIALOGUE = "<memory_block_dialogue>"
MEMORY_BLOCK_ROUND = "<memory_block_round>"
MEMORY_BLOCK_SESSION = "<memory_block_session>"
RECOVERED_CONTEXT = "<recovered_context>"
SYSTEM_REMINDER = "<system-reminder>"

# Legacy-generation memory blocks and state re-injection.
ROUND_LEVEL_MEMORY_BLOCK = "[ROUND_LEVEL_MEMORY_BLOCK]"
DIALOGUE_MEMORY_BLOCK = "[DIALOGUE_MEMORY_BLOCK]"
CURRENT_ROUND_MEMORY_BLOCK = "[CURRENT_ROUND_MEMORY_BLOCK]"
STATE_REINJECTION = "[STATE_REINJECTION]"
FULL_COMPACT_STATE = "[FULL_COMPACT_STATE]"

# ctxcore's own: the fast-path fallback's note for tail steps left out of a served window.
ELIDED_STEPS = "[CTXCORE_ELIDED_STEPS]"
# The user-role message auto-recall puts at the end of a window (never logged).
RECALLED_CONTEXT = "[CTXCORE_RECALLED_CONTEXT]"
# A block whose whole range is archived for recall says so on a line of its own (spec 6).
COMPRESSION_RECALL_PREFIX = "[[COMPRESSION_RECALL:"

# Offload and truncation markers.
OFFLOAD_PREFIX = "[[OFFLOAD:"
TRUNCATED = "...[TRUNCATED]..."
CLEARED_TOOL_RESULT = "[Old tool result content cleared]"

INTERNAL_USER_PREFIXES: tuple[str, ...] = (
    SYSTEM_REMINDER,
    MEMORY_BLOCK_CURRENT,
    MEMORY_BLOCK_DIALOGUE,
    MEMORY_BLOCK_ROUND,
    MEMORY_BLOCK_SESSION,
    RECOVERED_CONTEXT,
    STATE_REINJECTION,
    ROUND_LEVEL_MEMORY_BLOCK,
    DIALOGUE_MEMORY_BLOCK,
    CURRENT_ROUND_MEMORY_BLOCK,
    FULL_COMPACT_STATE,
    ELIDED_STEPS,
    RECALLED_CONTEXT,
)
