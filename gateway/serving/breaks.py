"""Prefix breakers on the request path: each vLLM request against its interaction's previous.

    plan   arrive: the interaction's previous request (if this worker knows it) is taken,
           and this one kept in its place (its block hashes, the router's prompt tokens)
    learn  measure: the break between the two chains (`gateway.routing.breaks`), with the
           prompt tokens the replica reported; the kept entry gets them too, and the other
           workers of the gateway are told (peers link), so a next turn landing there finds it

Memory is bounded: per deployment and worker, the ``size`` interactions seen last (an LRU),
each its chain as 8 bytes per block (a 8,000-token prompt in 16-token blocks: 4 KB). A
request without an interaction id of its own (its id is its request id) has no predecessor
and takes no entry. For tenants that opted in to break context the prompt itself is kept
too, under a budget of ``capture_chars`` characters per deployment and worker, oldest first
out; the text either side of a divergence is rendered only when a break is found.

Cost on the request path: a dict look-up and move at plan, a bisection of the two chains at
learn (benchmarks/breaks.py).
"""

from __future__ import annotations

import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.routing.breaks import PrefixBreak, measure
from gateway.routing.inputs import (
    ChatPrompt,
    PromptInput,
    PromptTokenizer,
    TextPrompt,
    content_text,
)
from gateway.routing.prompts import Prompt
from gateway.usage import Usage, UsageSource

log = logging.getLogger("kvgate.breaks")

DEFAULT_SIZE = 4096
DEFAULT_CAPTURE_CHARS = 16 * 1024 * 1024
CONTEXT_CHARS = 48  # each side of the divergence

Render = Callable[[PromptInput], str | None]


class TurnSender(Protocol):
    """Where a request's chain goes for the other workers (the peers link)."""

    def turn(
        self, deployment: str, key: str, hashes: Sequence[int], prompt_tokens: int, block: int
    ) -> None:
        """Send it on; never awaited, never raises."""
        ...


@dataclass(slots=True)
class Turn:
    """What is kept of an interaction's latest request."""

    hashes: array[int]
    block_tokens: int
    prompt_tokens: int  # the replica's count once reported; the router's until then
    source: PromptInput | None = None  # the prompt, for tenants that capture break context


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request's place in its interaction: the previous request, and its own entry."""

    key: str
    previous: Turn | None
    current: Turn
    exact: bool  # the chains are token blocks (else text chunks, scaled at measure)
    estimated_tokens: int  # the router's count of this prompt


def interaction_key(tenant_id: str, interaction_id: str) -> str:
    """Interaction ids are the clients' own: the same id of two tenants is two interactions."""
    return f"{tenant_id}\x1f{interaction_id}"


class BreakWatch:
    """One deployment's interactions, as far as this worker has seen them."""

    def __init__(
        self,
        deployment: str,
        *,
        size: int = DEFAULT_SIZE,
        capture_chars: int = DEFAULT_CAPTURE_CHARS,
        render: Render | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("the break LRU holds at least one interaction")
        self.deployment = deployment
        self.size = size
        self.capture_chars = capture_chars
        self.render = render or readable
        self.peers: TurnSender | None = None
        self._turns: OrderedDict[str, Turn] = OrderedDict()
        self._captured: OrderedDict[str, int] = OrderedDict()  # key -> characters kept
        self._captured_chars = 0

    def __len__(self) -> int:
        return len(self._turns)

    def arrive(self, key: str, prompt: Prompt, source: PromptInput | None = None) -> Arrival | None:
        """Take the interaction's previous request and keep this one in its place; ``source``
        (the prompt) only for tenants that capture break context."""
        if not prompt.hashes:
            return None  # nothing hashed (a model directory not configured yet)
        turns = self._turns
        previous = turns.pop(key, None)
        current = Turn(array("Q", prompt.hashes), prompt.block_tokens, prompt.prompt_tokens)
        turns[key] = current
        if len(turns) > self.size:
            evicted, _ = turns.popitem(last=False)
            self._forget_source(evicted)
        if source is not None:
            self._keep_source(key, current, source)
        elif previous is not None and previous.source is not None:
            self._forget_source(key)
        return Arrival(key, previous, current, prompt.exact, prompt.prompt_tokens)

    def measure(self, arrival: Arrival | None, usage: Usage) -> PrefixBreak | None:
        """The request's break against its predecessor, now that the replica counted its
        prompt; None without a predecessor, without reported usage, or without a break."""
        if arrival is None or usage.source is not UsageSource.REPORTED:
            return None
        current, previous = arrival.current, arrival.previous
        reported = usage.prompt_tokens
        current.prompt_tokens = reported
        if self.peers is not None:
            self.peers.turn(
                self.deployment, arrival.key, current.hashes, reported, current.block_tokens
            )
        if previous is None or previous.block_tokens != current.block_tokens:
            return None
        found = measure(
            previous.hashes,
            current.hashes,
            block_tokens=current.block_tokens,
            previous_tokens=previous.prompt_tokens,
            current_tokens=reported,
            scale=None if arrival.exact else (reported, arrival.estimated_tokens),
        )
        if found is None or previous.source is None or current.source is None:
            return found
        context = self.context(previous.source, current.source)
        if context is None:
            return found
        return PrefixBreak(found.break_tokens, found.lost_tokens, found.early, context)

    def from_peer(
        self, key: str, hashes: Sequence[int], prompt_tokens: int, block_tokens: int
    ) -> None:
        """Another worker served the interaction's latest request: it is the predecessor now."""
        turns = self._turns
        turns.pop(key, None)
        self._forget_source(key)
        turns[key] = Turn(array("Q", hashes), block_tokens, prompt_tokens)
        if len(turns) > self.size:
            evicted, _ = turns.popitem(last=False)
            self._forget_source(evicted)

    def context(self, previous: PromptInput, current: PromptInput) -> str | None:
        """The text either side of the first character where the two prompts differ (JSON)."""
        try:
            before, after = self.render(previous), self.render(current)
        except (KeyError, TypeError, ValueError) as exc:
            log.debug("break context not rendered: %s", exc)
            return None
        if before is None or after is None:
            return None
        offset = common_prefix(before, after)
        if offset == min(len(before), len(after)) and len(before) == len(after):
            return None  # the same text: the difference is in what no rendering shows
        return orjson.dumps(
            {
                "offset": offset,
                "before": before[max(0, offset - CONTEXT_CHARS) : offset],
                "previous": before[offset : offset + CONTEXT_CHARS],
                "current": after[offset : offset + CONTEXT_CHARS],
            }
        ).decode()

    def _keep_source(self, key: str, turn: Turn, source: PromptInput) -> None:
        self._forget_source(key)
        chars = max(source.chars, 1)
        if chars > self.capture_chars:
            return
        turn.source = source
        self._captured[key] = chars
        self._captured_chars += chars
        while self._captured_chars > self.capture_chars:
            oldest, size = self._captured.popitem(last=False)
            self._captured_chars -= size
            kept = self._turns.get(oldest)
            if kept is not None:
                kept.source = None

    def _forget_source(self, key: str) -> None:
        size = self._captured.pop(key, None)
        if size is not None:
            self._captured_chars -= size
            kept = self._turns.get(key)
            if kept is not None:
                kept.source = None


def common_prefix(a: str, b: str) -> int:
    """Characters at the start of both strings that are the same (slices compared in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def readable(source: PromptInput) -> str | None:
    """A prompt as a person reads it: tools, then each message's role and text."""
    if isinstance(source, TextPrompt):
        prompt = source.prompt
        if isinstance(prompt, str):
            return prompt
        if all(isinstance(part, str) for part in prompt):
            return "".join(prompt)
        return None  # token ids: no text to show
    chat: ChatPrompt = source
    parts: list[str] = []
    if chat.tools:
        parts.append("tools: " + orjson.dumps(list(chat.tools)).decode() + "\n")
    for message in chat.messages:
        text = content_text(message.get("content"), _part_text, "\n")
        parts.append(f"{message.get('role', '')}: {text}\n")
        calls = message.get("tool_calls")
        if calls:
            parts.append(orjson.dumps(calls).decode() + "\n")
    return "".join(parts)


def _part_text(part: Any) -> str:
    return str(part.get("text", "")) if isinstance(part, Mapping) else str(part)


def renderer(tokenizer: PromptTokenizer | None) -> Render:
    """How a deployment's prompts are shown: as its replicas render them where the router
    has their template (so a date the template writes shows), else ``readable``."""
    render_chat = getattr(tokenizer, "render", None)
    if tokenizer is not None and render_chat is None:
        from gateway.routing import sim_tokenizer

        if isinstance(tokenizer, sim_tokenizer.SimTokenizer):

            def render_chat(chat: ChatPrompt) -> str:
                return sim_tokenizer.render_chat(
                    chat.messages, add_generation_prompt=chat.add_generation_prompt
                )

    if render_chat is None:
        return readable
    chat_render: Callable[[ChatPrompt], str] = render_chat

    def render(source: PromptInput) -> str | None:
        return chat_render(source) if isinstance(source, ChatPrompt) else readable(source)

    return render
