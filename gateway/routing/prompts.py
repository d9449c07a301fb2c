"""A request's prompt as the router sees it: chained block hashes and a token count.

Three modes, chosen per deployment:
- text (no tokenizer): the rendered chat cut into fixed-size character chunks,
  prefix-preserving but approximate (block boundaries do not fall where the replica's
  tokenizer puts them);
- ``kvgate-sim``: the simulated replica's own tokenizer and chat template (injected by the
  app from `gateway.routing.sim_tokenizer`), so blocks are the replica's blocks exactly (how
  tests and the demo get exact predictions);
- a model directory: the model's tokenizer and chat template applied as vLLM applies them
  (`gateway.routing.tokens`), so blocks are a real replica's blocks.

In both token modes a block is named as vLLM names it (`gateway.routing.vllm_blocks`:
sha256 chained from NONE_HASH, the salt in the first block's extra keys), the very names
the replicas' KV events carry; the block size and hash algorithm are the replicas' own,
read from their /metrics (`configure`). A model directory hashes nothing until then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.routing.blocks import render_chat, root_hash, text_block_hashes
from gateway.routing.inputs import ChatPrompt, PromptInput, PromptTokenizer, TextPrompt
from gateway.routing.load import CacheConfig
from gateway.routing.token_ids import TokenIds
from gateway.routing.vllm_blocks import BlockHashing

log = logging.getLogger("kvgate.prompts")

# The deployments file's name for the simulated replica's tokenizer (gateway/tools/sim).
SIM_TOKENIZER = "kvgate-sim"
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt's blocks: what the index is asked about and told of."""

    hashes: Sequence[int]
    prompt_tokens: int  # exact in token mode, estimated in text mode
    block_tokens: int  # tokens one block stands for
    exact: bool  # blocks are the replicas' own blocks (token mode)


class PromptHasher:
    """Turns a prompt into its block hashes under the tenant's salted root.

    With a tokenizer (token mode) the blocks are the replicas' own; ``configured`` says
    whether the block size and hash algorithm are known already, or are to be read from
    the replicas first (`configure`). Without one (text mode) blocks are text chunks.
    """

    def __init__(
        self,
        *,
        model: str,
        block_size: int,
        tokenizer: PromptTokenizer | None = None,
        hash_seed: str | None = None,
        configured: bool = True,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.tokenizer = tokenizer
        self.exact = tokenizer is not None
        self.chunk_chars = block_size * CHARS_PER_TOKEN
        self.hash_seed = hash_seed
        self.hashing = BlockHashing("sha256", hash_seed)
        self.configured = configured or tokenizer is None

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

    def prompt(self, source: PromptInput, cache_salt: str) -> Prompt:
        """The prompt's blocks, salted with the tenant's cache salt."""
        tokenizer = self.tokenizer
        if tokenizer is not None:
            try:
                tokens = (
                    tokenizer.chat_tokens(source)
                    if isinstance(source, ChatPrompt)
                    else tokenizer.completion_tokens(source)
                )
            except (KeyError, TypeError, ValueError):
                # The replica will refuse it with its own error; route it on load alone.
                estimate = max(1, source.chars // CHARS_PER_TOKEN)
                return Prompt([], estimate, self.block_size, exact=False)
            hashes = (
                self.hashing.keys(tokens, self.block_size, cache_salt) if self.configured else []
            )
            return Prompt(hashes, len(tokens), self.block_size, exact=True)
        root = root_hash(self.model, cache_salt)
        text = _text(source)
        return Prompt(
            text_block_hashes(text, chunk_chars=self.chunk_chars, root=root),
            max(1, len(text) // CHARS_PER_TOKEN),
            self.block_size,
            exact=False,
        )


def _text(source: PromptInput) -> str:
    if isinstance(source, ChatPrompt):
        return render_chat(source.messages)
    prompt: TextPrompt = source
    if isinstance(prompt.prompt, str):
        return prompt.prompt
    if isinstance(prompt.prompt, TokenIds):
        return prompt.prompt.text()  # the same text, without a string per id
    return " ".join(str(p) for p in prompt.prompt)
