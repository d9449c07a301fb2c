"""The test plan's prompts: long texts of common words, distinct per run and per prompt.

Each word is one token in common BPE vocabularies (a leading space joins it), in the
tiny test model's and in the simulated replica's tokenizer, so a prompt of ``n`` words
is close to ``n`` tokens and a divergence after ``k`` words is a divergence after about
``k`` tokens plus the chat template's head. Texts come from a 64-bit LCG seeded by the
run's seed and the prompt's number: the same (seed, number) always gives the same text,
and two prompts of one run share no leading word sequence but by a 1-in-64**n chance.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.tools.lcg import GOLDEN, MASK64, draws

WORDS = (
    "the", "cache", "block", "token", "model", "system", "user", "question",
    "document", "section", "chapter", "page", "one", "two", "three", "four",
    "five", "six", "seven", "eight", "nine", "ten", "hundred", "thousand",
    "million", "you", "are", "please", "list", "why", "how", "what",
    "when", "where", "which", "who", "rate", "hit", "miss", "cost",
    "price", "record", "window", "context", "answer", "signal", "memory", "budget",
    "river", "stone", "cloud", "field", "bright", "quiet", "simple", "exact",
    "fast", "cold", "warm", "chain", "hash", "queue", "batch", "stream",
)  # fmt: skip

# Streams: each kind of text draws from its own part of the generator's seed space.
_DIVERGENT = 1 << 40


@dataclass(frozen=True, slots=True)
class PromptMaker:
    """Prompt texts for one run (``seed``)."""

    seed: int

    def words(self, number: int, count: int) -> list[str]:
        """``count`` words of prompt ``number``."""
        picks = draws(((self.seed & MASK64) * GOLDEN + number + 1) & MASK64)
        return [WORDS[next(picks)] for _ in range(count)]

    def text(self, number: int, count: int) -> str:
        """Prompt ``number``: ``count`` words."""
        return " ".join(self.words(number, count))

    def diverging(self, number: int, count: int, shared: int) -> str:
        """``count`` words whose first ``shared`` are prompt ``number``'s and the rest not.

        The first word after the shared part always differs from the base prompt's, so the
        two token sequences part exactly there.
        """
        if not 0 <= shared <= count:
            raise ValueError("shared must be between 0 and count")
        base = self.words(number, count)
        rest = self.words(_DIVERGENT + number, count - shared)
        if rest and rest[0] == base[shared]:
            rest[0] = WORDS[(WORDS.index(rest[0]) + 1) % len(WORDS)]
        return " ".join(base[:shared] + rest)

    def with_prefix(self, prefix: int, prefix_words: int, number: int, count: int) -> str:
        """Prompt ``prefix``'s first ``prefix_words`` words, then ``count`` words of ``number``."""
        return " ".join(self.words(prefix, prefix_words) + self.words(number, count))
