"""A request's tokens in the four disjoint classes priced differently.

One value shape for every place that counts them: a request's usage
(``gateway.usage.Usage``), the sums of a set of attempts (``gateway.db.sums.Sums``) and a
provider's bill (``gateway.invoices.shapes.Tokens``) each extend it with what is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenClasses:
    """Uncached, cache-read, cache-write and output tokens: disjoint, priced differently."""

    uncached_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every class: uncached, cache read and cache write."""
        return self.uncached_tokens + self.cache_read_tokens + self.cache_write_tokens
