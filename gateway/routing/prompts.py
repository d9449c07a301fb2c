"""A request's prompt as the router sees it: chained block hashes and a token estimate.

Three modes, chosen per deployment:
- text (default): the rendered chat cut into fixed-size character chunks, prefix-preserving
  but approximate (block boundaries do not fall where the replica's tokenizer puts them);
- ``kvgate-sim``: the simulated replica's own tokenizer and chat template, so blocks are
  the replica's blocks exactly (how tests and the demo get exact predictions);
- a model directory: the model's tokenizer and chat template applied as vLLM applies them
  (`gateway.routing.tokens`), so blocks are a real replica's blocks.

In both token modes a block is named as vLLM names it (`gateway.routing.vllm_blocks`:
sha256 chained from NONE_HASH, the salt in the first block's extra keys), the very names
the replicas' KV events carry; the block size and hash algorithm are the replicas' own,
read from their /metrics (`configure`). A model directory hashes nothing until then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import jinja2

from gateway.api.calls import Call, Endpoint
from gateway.routing.blocks import render_chat, root_hash, text_block_hashes
from gateway.routing.load import CacheConfig
from gateway.routing.tokens import ChatTokenizer, TokenizerError
from gateway.routing.vllm_blocks import BlockHashing

log = logging.getLogger("kvgate.prompts")

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

    def __init__(
        self, *, model: str, block_size: int, tokenizer: str | None, hash_seed: str | None = None
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.exact = tokenizer is not None
        self.chunk_chars = block_size * CHARS_PER_TOKEN
        self.hash_seed = hash_seed
        self.hashing = BlockHashing("sha256", hash_seed)
        # A model's tokenizer: blocks are hashed once the replicas told their block size.
        self.tokenizer = (
            None if tokenizer in (None, SIM_TOKENIZER) else ChatTokenizer.load(tokenizer)
        )
        self.configured = self.tokenizer is None

    def configure(self, cache: CacheConfig) -> None:
        """Take a replica's block size and hash algorithm (token modes only)."""
        if not self.exact:
            return
        if cache.hash_algo != self.hashing.algo:
            self.hashing = BlockHashing(cache.hash_algo, self.hash_seed)
        if cache.block_size != self.block_size or not self.configured:
            log.info(
                "%s: replicas hash blocks of %d tokens with %s",
                self.model,
                cache.block_size,
                cache.hash_algo,
            )
        self.block_size = cache.block_size
        self.configured = True

    def prompt(self, call: Call, cache_salt: str) -> Prompt:
        if self.exact:
            try:
                tokens = (
                    _sim_tokens(call)
                    if self.tokenizer is None
                    else _model_tokens(self.tokenizer, call)
                )
            except (TokenizerError, jinja2.TemplateError, KeyError, TypeError, ValueError):
                # The replica will refuse it with its own error; route it on load alone.
                return Prompt(
                    [], max(1, call.prompt_chars // CHARS_PER_TOKEN), self.block_size, exact=False
                )
            hashes = (
                self.hashing.keys(tokens, self.block_size, cache_salt) if self.configured else []
            )
            return Prompt(hashes, len(tokens), self.block_size, exact=True)
        root = root_hash(self.model, cache_salt)
        text = _text(call)
        return Prompt(
            text_block_hashes(text, chunk_chars=self.chunk_chars, root=root),
            max(1, len(text) // CHARS_PER_TOKEN),
            self.block_size,
            exact=False,
        )

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
        usable = (reported_prompt_tokens - 1) // prompt.block_tokens
        return min(blocks, usable) * prompt.block_tokens

    def reported_blocks(
        self, prompt: Prompt, cached_tokens: int, reported_prompt_tokens: int
    ) -> int:
        """Leading blocks of ``prompt.hashes`` that the replica reported as cached."""
        if not prompt.hashes or reported_prompt_tokens <= 0:
            return 0
        blocks = cached_tokens // prompt.block_tokens
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


def _model_tokens(tokenizer: ChatTokenizer, call: Call) -> list[int]:
    if call.endpoint is Endpoint.CHAT:
        return tokenizer.chat_tokens(call.body)
    return tokenizer.prompt_tokens(call.body)


def _sim_tokens(call: Call) -> list[int]:
    from gateway.tools.sim import tokenizer

    if call.endpoint is Endpoint.CHAT:
        return tokenizer.encode(tokenizer.render_chat(call.body["messages"]))
    prompt: Any = call.body["prompt"]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if prompt and isinstance(prompt[0], int):
        return list(prompt)
    return tokenizer.encode("".join(prompt))
