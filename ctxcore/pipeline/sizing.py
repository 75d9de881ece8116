"""What views, messages and new summaries cost: the counts targets and planning size by.

Counts are of one list, as a request is counted (per-item sums would add a reply priming
each), and as a window serves them: tool results over the configured cap count at the cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ctxcore.messages import AnyMessage, ToolMessage, message_text
from ctxcore.pipeline.models import PipelineConfig
from ctxcore.pipeline.view import View, block_message, log_id
from ctxcore.render import head_tail
from ctxcore.state.models import SummaryBlock
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.summarize.sections import skeleton
from ctxcore.tokens import TokenCounter
from ctxcore.turns import newest_step_start

__all__ = [
    "ViewSizes",
    "as_served",
    "blocks_over_cap",
    "header_tokens",
    "held_tokens",
    "item_tokens",
    "message_tokens",
    "room_for",
    "section_tokens",
    "served_of",
    "served_tokens",
    "summary_cap",
    "unservable_tokens",
]

Item = SummaryBlock | AnyMessage


@dataclass(frozen=True)
class ViewSizes:
    """A conversation's view against its target, in tokens (as a window serves it).

    ``held_tokens`` is what no stage may summarise (anchors and the newest step);
    ``last_id`` the log's last id.
    """

    view_tokens: int
    target_tokens: int
    budget_tokens: int
    held_tokens: int
    last_id: str | None

    @property
    def over_target(self) -> bool:
        """True when the view is over its compaction target."""
        return self.view_tokens > self.target_tokens

    @property
    def held_by_newest_step(self) -> bool:
        """True when what may not be summarised alone is over the target: no stage can help."""
        return self.held_tokens > self.target_tokens


def message_tokens(counter: TokenCounter, messages: Sequence[AnyMessage]) -> int:
    """Tokens of ``messages`` (0 for none)."""
    return counter.count_messages(list(messages)) if messages else 0


def served_tokens(view: View, config: PipelineConfig, counter: TokenCounter) -> int:
    """What the view costs as a window serves it: tail tool results over
    ``config.result_cap_tokens`` count at the cap (the served window caps them)."""
    return view.tokens(counter) - _cap_excess(view.tail, config, counter)


def served_of(messages: Sequence[AnyMessage], config: PipelineConfig, counter: TokenCounter) -> int:
    """What ``messages`` cost in a served window (one list; results counted at the cap)."""
    return message_tokens(counter, messages) - _cap_excess(messages, config, counter)


def as_served(
    messages: Sequence[AnyMessage], config: PipelineConfig, counter: TokenCounter
) -> list[AnyMessage]:
    """``messages`` with each tool result over ``config.ceiling_tokens`` (the window's budget)
    cut to its head and tail at it: what the summariser is sent of what it replaces. No window
    ever served more of such a result (the newest-step cap cut it to the room), and its whole
    text stays in the log and the offload store, one reload away. Sent whole, each 150k-
    character test log of the grown development runs cost a call 37k input tokens. Cut at
    the result cap instead (a quarter of the budget), tau-bench's next-step references fell
    0.646 -> 0.636 at lag 0 and 0.571 -> 0.554 at lag 5: at half of a short run's tokens the
    cap is a few hundred tokens, below the records the agent quotes next."""
    limit = config.ceiling_tokens
    if limit is None:
        return list(messages)
    out: list[AnyMessage] = []
    for message in messages:
        tokens = message_tokens(counter, [message]) if isinstance(message, ToolMessage) else 0
        if tokens > limit:
            text = message_text(message)
            keep = len(text) * limit // tokens
            message = message.model_copy(
                update={"content": head_tail(text, keep, 0.5, config.truncated_marker)}
            )
        out.append(message)
    return out


def _cap_excess(messages: Sequence[AnyMessage], config: PipelineConfig, counter: TokenCounter) -> int:
    """The tokens of tool results over ``config.result_cap_tokens`` that a window never serves."""
    cap = config.result_cap_tokens
    return 0 if cap is None else _excess_over_cap(messages, cap, cap, counter)


def _excess_over_cap(
    messages: Sequence[AnyMessage], cap: int, larger_than: int, counter: TokenCounter
) -> int:
    """What the tool results of ``messages`` larger than ``larger_than`` tokens hold beyond ``cap``."""
    total = 0
    for message in messages:
        if isinstance(message, ToolMessage):
            tokens = message_tokens(counter, [message])
            if tokens > larger_than:
                total += tokens - cap
    return total


def unservable_tokens(
    messages: Sequence[AnyMessage], room: int, cap: int | None, counter: TokenCounter
) -> int:
    """What a compaction trigger sheds of ``messages``: each tool result before the newest
    step larger than the whole ``room`` counts at the ``cap`` (``state.budget.
    result_cap_tokens``; None: nothing shed). No compaction can make room for such a result
    (the window cuts it to the cap), while one that fits the room is served whole once the
    history around it is summarised, and a newest output gets the room the older messages
    held (counted at the cap there too, tau-bench lost 0.646 -> 0.636). Counted whole, a
    37k-token log asked for a compaction on every window it stayed in the tail, each run to
    shave a few tokens off the target."""
    if cap is None:
        return 0
    return _excess_over_cap(messages[: newest_step_start(messages)], cap, room, counter)


def held_tokens(view: View, config: PipelineConfig, counter: TokenCounter) -> int:
    """What no stage may summarise, as served: the anchors (pinned and in the tail) and the
    newest step (even the most aggressive stage leaves it verbatim: the model acts on it)."""
    tail = list(view.tail)
    start = newest_step_start(tail)
    anchors = view.anchor_id_set()
    kept = [*view.pinned, *(m for m in tail[:start] if log_id(m) in anchors), *tail[start:]]
    return served_of(kept, config, counter)


def summary_cap(view: View, config: PipelineConfig) -> int | None:
    """The most tokens the view's summary blocks together may take, or None for no cap.

    Only an agent's run is capped (a tool result in its tail): what it acts on next is its
    newest steps, verbatim. In a dialogue the newest turns are no more useful than what was
    said long ago, so summaries there may fill the target. The cap is ``summary_share`` of the
    target, at least ``summary_floor_tokens`` (at most the target).
    """
    if config.summary_share >= 1 or not any(isinstance(m, ToolMessage) for m in view.tail):
        return None
    share = int(config.target_tokens * config.summary_share)
    return max(share, min(config.summary_floor_tokens, config.target_tokens))


def blocks_over_cap(view: View, config: PipelineConfig, counter: TokenCounter) -> bool:
    """Two or more summary blocks together over their cap (``summary_cap``)."""
    cap = summary_cap(view, config)
    return (
        cap is not None
        and len(view.blocks) >= 2
        and sum(message_tokens(counter, b.messages) for b in view.blocks) > cap
    )


def room_for(
    view: View,
    config: PipelineConfig,
    counter: TokenCounter,
    source_tokens: int,
    n_blocks: int,
    replaced_blocks: int = 0,
) -> int:
    """The tokens new summaries of ``source_tokens`` may take together.

    Summaries may use the room left under the target, so a pass lands near the target
    instead of far below it (less detail lost), but in an agent's run all blocks together
    stay within their cap so the tail keeps the rest. Each new block's header (its headings
    included) is paid out of the room, and the headings' size once more per block as a
    margin: targets add the headings to each summary's share, and a view landing a few
    tokens over its target would escalate to a further pass. It may be below a pass's floor
    (or negative): the pass then cannot reach the target alone.
    """
    room = config.target_tokens - (served_tokens(view, config, counter) - source_tokens)
    cap = summary_cap(view, config)
    if cap is not None:
        all_blocks = sum(message_tokens(counter, b.messages) for b in view.blocks)
        room = min(room, cap - (all_blocks - replaced_blocks))
    return room - (header_tokens(counter, config) + section_tokens(counter)) * n_blocks


def header_tokens(counter: TokenCounter, config: PipelineConfig) -> int:
    """Tokens a block message costs beyond its summary's lines (its sections' headings included)."""
    probe = block_message(
        skeleton(BLOCK_SECTIONS),
        block_id="L1-000000000000-000000000000",
        first_id="000000000000",
        last_id="000000000000",
        level=1,
        scope="completed_react",
        marker=config.compression_marker,
    )
    return message_tokens(counter, [probe])


def item_tokens(counter: TokenCounter, items: Sequence[Item], config: PipelineConfig) -> int:
    """What the items' messages cost in a served window, counted as one list: a request's
    reply priming is paid once, not once per item (per-item sums overstated a merge's source,
    and so its room, by a few tokens per message), and results count at the cap."""
    messages: list[AnyMessage] = []
    for item in items:
        messages.extend(item.messages if isinstance(item, SummaryBlock) else [item])
    return served_of(messages, config, counter)


def section_tokens(counter: TokenCounter) -> int:
    """What a summary's section headings cost (with "(none)" under each)."""
    return counter.count_text(skeleton(BLOCK_SECTIONS))
