"""``ExtractiveModel``: the offline, deterministic summariser (the embedded default).

It never reads the prompt's wording: it works from the ``OutputContract`` the compressor
passes beside the prompt. Candidates come from ``extract``, the choice within the token
target from ``Selection``; here chosen lines are routed to the contract's sections or
blocks and rendered, never over the target. Same input, same output; no endpoint, no key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Final

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.summarize.extractive.extract import Candidates, extract
from ctxcore.summarize.extractive.features import classify_title
from ctxcore.summarize.extractive.items import Item
from ctxcore.summarize.extractive.rules import ALL_RULES, Rules
from ctxcore.summarize.extractive.select import (
    MIN_FILL_TOKENS,
    Budgeter,
    Selection,
    render_lines,
    splitters,
    spoken,
)
from ctxcore.summarize.model import Completion, ContractBlock, OutputContract, Usage
from ctxcore.tokens import TiktokenCounter, TokenCounter

__all__ = ["ExtractiveModel"]

# Passes that spend what printing a speaker's sentences on one line saved.
_REFILLS: Final = 3

_ROUTES: Final = MappingProxyType(
    {
        "request": ("request", "constraint", "work"),
        "constraint": ("constraint", "request", "work", "decision"),
        "tool": ("work", "file"),
        "file": ("file", "paths", "work"),
        "paths": ("paths", "file"),
        "error": ("error", "decision", "pending"),
        "decision": ("decision", "work"),
        "pending": ("pending", "work"),
        "work": ("work",),
        "fact": ("decision",),
        "chat": ("decision",),
        "other": (),
    }
)


def _route(sections: Sequence[str]) -> Callable[[Item], int]:
    """Section index of an item: the section it sat under in an earlier summary when the
    contract has that section too, else the first section its kind prefers."""
    kinds = [classify_title(s) for s in sections]
    critical = next((i for i, k in enumerate(kinds) if k == "critical"), len(sections) - 1)
    table: dict[str, int] = {}
    for category, preferred in _ROUTES.items():
        target = next((kinds.index(p) for p in preferred if p in kinds), critical)
        table[category] = target
    by_title = {title.casefold(): i for i, title in enumerate(sections)}

    def route(item: Item) -> int:
        same = by_title.get(item.section.casefold()) if item.section else None
        return same if same is not None else table.get(item.category, critical)

    return route


def _render_sections(sections: Sequence[str], chosen: Sequence[Item]) -> str:
    """One ``## <title>`` per section in order, its lines under it (each line once in
    the whole text), ``(none)`` under an empty one."""
    route = _route(sections)
    grouped: list[list[Item]] = [[] for _ in sections]
    for item in chosen:
        grouped[route(item)].append(item)
    parts: list[str] = []
    seen: set[str] = set()
    for title, items in zip(sections, grouped, strict=True):
        parts.append(f"## {title}\n")
        lines = render_lines(items, seen)
        parts.extend(lines or ["(none)\n"])
    return "".join(parts)


class ExtractiveModel:
    """A deterministic offline ``ModelClient`` that summarises by extraction.

    It reads the ``OutputContract`` (never the prompt text) and answers in the format the
    contract asks for: a ``<state_snapshot>`` with one ``## <section>`` per contract
    section, or ``{"blocks": [{"block_id", "summary"}]}`` with exactly the contract's block
    ids. Every output stays within its token target as measured by ``counter`` (default
    ``TiktokenCounter()``) and within ``max_tokens``. Without a contract it returns a head
    and tail excerpt of the last user message. ``rules`` is every rule unless an ablation
    bench turns some off (``extractive.rules``).
    """

    def __init__(
        self, counter: TokenCounter | None = None, *, name: str = "extractive", rules: Rules = ALL_RULES
    ) -> None:
        self.counter: TokenCounter = counter if counter is not None else TiktokenCounter()
        self._name = name
        self.rules = rules
        self._budget = Budgeter(self.counter)

    @property
    def name(self) -> str:
        """``extractive`` unless another name was given."""
        return self._name

    def __repr__(self) -> str:
        return f"ExtractiveModel(name={self._name!r})"

    def complete(
        self,
        messages: Sequence[AnyMessage],
        *,
        max_tokens: int,
        contract: OutputContract | None = None,
    ) -> Completion:
        """Summarise ``contract``'s sources (or excerpt the last user message without one)."""
        if max_tokens < 1:
            raise ConfigError(f"ExtractiveModel.complete: max_tokens must be >= 1, got {max_tokens}")
        if contract is None:
            text = self._excerpt(messages, max_tokens)
        elif contract.kind == "state_snapshot":
            text = self._snapshot(contract, min(contract.target_tokens, max_tokens))
        else:
            text = self._blocks(contract, max_tokens)
        input_tokens = self.counter.count_messages(messages)
        output_tokens = self.count(text)
        return Completion(
            text,
            Usage(input_tokens, output_tokens, input_tokens + output_tokens, calls=1, model=self._name),
            finish_reason="stop",  # it always writes the whole answer
        )

    def count(self, text: str) -> int:
        """Tokens of ``text`` with this model's counter."""
        return self.counter.count_text(text)

    # --- formats -------------------------------------------------------------------------

    def _excerpt(self, messages: Sequence[AnyMessage], max_tokens: int) -> str:
        last = next((m for m in reversed(messages) if isinstance(m, UserMessage)), None)
        if last is None:
            return ""
        return self._budget.fit(last.text, max_tokens, head_tail=True)

    def _snapshot(self, contract: OutputContract, budget: int) -> str:
        sections = contract.sections or ["Critical Context"]
        skeleton = self._render_snapshot(sections, [])
        available = budget - self.count(skeleton)
        if available < MIN_FILL_TOKENS:
            return self._budget.fit(skeleton, budget, head_tail=False)
        found = extract(
            contract.source,
            context=contract.context,
            with_paths="paths" in {classify_title(s) for s in sections},
            rules=self.rules,
        )
        chosen = self._choose(found, available, budget, lambda c: self._render_snapshot(sections, c))
        while True:
            text = self._render_snapshot(sections, chosen)
            if self.count(text) <= budget or not chosen:
                return text if self.count(text) <= budget else self._budget.fit(text, budget, head_tail=False)
            # Token counts of joined lines can exceed the sum of their parts by a token
            # or two; drop the weakest line and try again.
            chosen = _without_weakest(chosen)

    @staticmethod
    def _render_snapshot(sections: Sequence[str], chosen: Sequence[Item]) -> str:
        return f"<state_snapshot>\n{_render_sections(sections, chosen)}</state_snapshot>"

    def _blocks(self, contract: OutputContract, max_tokens: int) -> str:
        blocks = contract.blocks
        sections = contract.sections
        skeleton = self._render_blocks(blocks, [_render_sections(sections, []).rstrip("\n") for _ in blocks])
        available = max(max_tokens - self.count(skeleton), 0)
        targets = [b.target_tokens for b in blocks]
        total = sum(targets)
        if total > available:
            targets = [t * available // total for t in targets]
        candidates = [
            extract(
                b.source,
                context=contract.context,
                with_paths=False,
                rules=self.rules,
            )
            for b in blocks
        ]
        summaries = [
            self._fill(found, target, sections) for found, target in zip(candidates, targets, strict=True)
        ]
        for _ in range(50):
            text = self._render_blocks(blocks, summaries)
            if self.count(text) <= max_tokens:
                return text
            # JSON escaping (quotes, newlines) costs tokens the per-block targets did not
            # see; shave the longest summary and re-check.
            longest = max(range(len(summaries)), key=lambda i: len(summaries[i]))
            targets[longest] = int(targets[longest] * 0.85)
            summaries[longest] = self._fill(candidates[longest], targets[longest], sections)
        return skeleton

    def _fill(self, found: Candidates, target: int, sections: Sequence[str]) -> str:
        """The best candidates within ``target`` tokens: lines, or ``sections`` with lines."""
        if not sections:
            if target < MIN_FILL_TOKENS:
                return ""
            chosen = self._choose(found, target, target, lambda c: "".join(render_lines(c)).rstrip("\n"))
            while True:
                text = "".join(render_lines(chosen)).rstrip("\n")
                if self.count(text) <= target or not chosen:
                    return text if self.count(text) <= target else ""
                chosen = _without_weakest(chosen)
        skeleton = _render_sections(sections, []).rstrip("\n")
        available = target - self.count(skeleton)
        if available < MIN_FILL_TOKENS:
            # Headings alone say nothing: no summary rather than an empty one.
            return ""
        chosen = self._choose(found, available, target, lambda c: _render_sections(sections, c).rstrip("\n"))
        while True:
            text = _render_sections(sections, chosen).rstrip("\n")
            if self.count(text) <= target or not chosen:
                return text
            chosen = _without_weakest(chosen)

    def _choose(
        self, found: Candidates, available: int, limit: int, render: Callable[[Sequence[Item]], str]
    ) -> list[Item]:
        """The lines chosen within ``available`` tokens, then within what ``render``'s text
        leaves of ``limit``.

        Selection prices every line alone, tag and label included; printed, a speaker's
        sentences in a row share one line and the text comes out shorter. What that saves
        is chosen again from the lines not taken, until nothing more fits; the last pass
        fills the rest with a shortened line.
        """
        selection = Selection(found.idf, found.covered, self._budget)
        if not any(spoken(it) for it in found.items):
            # No line can share another's: the text costs what the lines were priced.
            return selection.run(found.items, available)
        chosen = selection.run(found.items, available, fill=False)
        passes = 0
        while True:
            spare = limit - self.count(render(chosen))
            if spare < MIN_FILL_TOKENS:
                return chosen
            last = passes >= _REFILLS
            taken = {it.key for it in chosen}
            rest = [it for it in found.items if it.key not in taken]
            # A line that would split a speaker's run costs more than its price: it had its
            # chance in the first pass.
            split = splitters(chosen, rest)
            covered = set(selection.covered)
            more = selection.run([it for it in rest if id(it) not in split], spare, fill=last)
            grown = sorted([*chosen, *more], key=lambda it: it.order)
            if more and self.count(render(grown)) > limit:
                # A line placed inside a speaker's run splits it in two, and both halves pay
                # tag and label: the pass cost more than it was priced. Keep what fit.
                selection.covered = covered
                if last:
                    return chosen
                passes = _REFILLS
                continue
            chosen = grown
            if last:
                return chosen
            # When nothing more fits whole, only the last pass's shortened line may.
            passes = passes + 1 if more else _REFILLS

    @staticmethod
    def _render_blocks(blocks: Sequence[ContractBlock], summaries: Sequence[str]) -> str:
        payload = {
            "blocks": [{"block_id": b.block_id, "summary": s} for b, s in zip(blocks, summaries, strict=True)]
        }
        return json.dumps(payload, ensure_ascii=False)


def _without_weakest(chosen: Sequence[Item]) -> list[Item]:
    weakest = min(chosen, key=lambda it: (it.must, it.weight, it.order))
    return [it for it in chosen if it is not weakest]
