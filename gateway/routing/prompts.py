"""A request's prompt as the router sees it: chained block hashes and a token estimate.

Two modes, chosen per deployment:
- text (default): the rendered chat cut into fixed-size character chunks, prefix-preserving
  but approximate (block boundaries do not fall where the replica's tokenizer puts them);
- ``kvgate-sim``: the simulated replica's own tokenizer and chat template, so blocks are
  the replica's blocks exactly (how tests and the demo get exact predictions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.calls import Call, Endpoint
from gateway.routing.blocks import render_chat, root_hash, text_block_hashes, token_block_hashes

SIM_TOKENIZER = "kvgate-sim"
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Prompt:
    hashes: list[int]
    prompt_tokens: int  # exact in token mode, estimated in text mode
    block_tokens: int
    exact: bool


class PromptHasher:
    """Turns a call into its block hashes under the tenant's salted root."""

    def __init__(self, *, model: str, block_size: int, tokenizer: str | None) -> None:
        if tokenizer not in (None, SIM_TOKENIZER):
            raise ValueError(f"unknown tokenizer {tokenizer!r}; supported: {SIM_TOKENIZER}")
        self.model = model
        self.block_size = block_size
        self.exact = tokenizer == SIM_TOKENIZER
        self.chunk_chars = block_size * CHARS_PER_TOKEN

    def prompt(self, call: Call, cache_salt: str) -> Prompt:
        root = root_hash(self.model, cache_salt)
        if self.exact:
            tokens = _sim_tokens(call)
            return Prompt(token_block_hashes(tokens, block_tokens=self.block_size, root=root),
                          len(tokens), self.block_size, exact=True)
        text = _text(call)
        return Prompt(text_block_hashes(text, chunk_chars=self.chunk_chars, root=root),
                      max(1, len(text) // CHARS_PER_TOKEN), self.block_size, exact=False)

    def tokens(self, prompt: Prompt, blocks: int, reported_prompt_tokens: int) -> int:
        """Cached tokens that ``blocks`` leading blocks stand for, as vLLM would report them.

        vLLM always computes the prompt's last token, so at most (prompt - 1) // block_size
        full blocks count; in text mode blocks are scaled to the reported prompt length.
        """
        if reported_prompt_tokens <= 0 or not prompt.hashes:
            return 0
        if not prompt.exact:
            # A text chunk stands for about one block of the estimated prompt length.
            blocks = blocks * reported_prompt_tokens // max(prompt.prompt_tokens, 1)
        usable = (reported_prompt_tokens - 1) // self.block_size
        return min(blocks, usable) * self.block_size

    def reported_blocks(self, prompt: Prompt, cached_tokens: int, reported_prompt_tokens: int) -> int:
        """Leading blocks of ``prompt.hashes`` that the replica reported as cached."""
        if not prompt.hashes or reported_prompt_tokens <= 0:
            return 0
        blocks = cached_tokens // self.block_size
        if not prompt.exact:
            blocks = blocks * prompt.prompt_tokens // reported_prompt_tokens
        return min(blocks, len(prompt.hashes))


def _text(call: Call) -> str:
    if call.endpoint is Endpoint.CHAT:
        return render_chat(call.body["messages"])
    prompt: Any = call.body["prompt"]
    if isinstance(prompt, str):
        return prompt
    return " ".join(str(p) for p in prompt)


def _sim_tokens(call: Call) -> list[int]:
    from gateway.sim import tokenizer

    if call.endpoint is Endpoint.CHAT:
        return tokenizer.encode(tokenizer.render_chat(call.body["messages"]))
    prompt: Any = call.body["prompt"]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if prompt and isinstance(prompt[0], int):
        return list(prompt)
    return tokenizer.encode("".join(prompt))
