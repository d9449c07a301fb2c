"""A provider's bill against kvgate's records, per UTC day × model.

Which records: those whose upstream is the provider's hosted API, as litellm names it:
``openai/<model>`` or ``anthropic/<model>``, or a bare model id of the provider's family
(``gpt-…``, ``chatgpt-…``, ``o1…``/``o3…``/``o4…``, ``text-embedding-…``, ``ft:…`` for
OpenAI; ``claude…`` for Anthropic). A vLLM replica's upstream is its URL: never a bill's.

Which model: kvgate's name is the model id it sent (the upstream without its provider
prefix). A provider id is folded into a recorded model when it is that model, or that
model with a snapshot date after it (``gpt-4o-mini-2024-07-18`` → ``gpt-4o-mini``,
``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``), or the snapshot of a
``…-latest`` alias (``claude-3-5-haiku-20241022`` → ``claude-3-5-haiku-latest``); an exact
match wins. A provider id kvgate never recorded keeps its own name, with kvgate's side zero.

Variance is kvgate - provider: positive where kvgate recorded more than was billed; its
percentage is of the provider's figure (none where the provider counted zero).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal

from gateway.invoices.shapes import ZERO, Bill, Tokens

PREFIXES = {"openai": "openai/", "anthropic": "anthropic/"}
FAMILIES = {
    "openai": ("gpt-", "chatgpt-", "o1", "o3", "o4", "text-embedding-", "ft:"),
    "anthropic": ("claude",),
}
SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})")  # OpenAI's and Anthropic's dates
LATEST = "-latest"
HUNDREDTH = Decimal("0.01")


@dataclass(frozen=True, slots=True)
class Recorded:
    """What kvgate recorded of the attempts started on one UTC day on one upstream."""

    day: date
    upstream: str
    requests: int
    tokens: Tokens
    cost: Decimal


@dataclass(frozen=True, slots=True)
class Side:
    """One side's figures for a day × model; None: the file held no such report."""

    requests: int | None
    tokens: Tokens | None
    cost: Decimal | None


@dataclass(frozen=True, slots=True)
class Variance:
    """kvgate - provider, and that as a percentage of the provider's (None: it was zero)."""

    absolute: int | Decimal
    percent: Decimal | None


def variance(mine: int | Decimal, theirs: int | Decimal | None) -> Variance | None:
    """kvgate's figure against the provider's; None where the provider has no figure."""
    if theirs is None:
        return None
    difference = mine - theirs
    if theirs == 0:
        return Variance(difference, None)
    percent = (Decimal(difference) * 100 / Decimal(theirs)).quantize(HUNDREDTH, ROUND_HALF_EVEN)
    return Variance(difference, percent)


@dataclass(frozen=True, slots=True)
class Compared:
    """One UTC day × model: kvgate's records against the provider's bill."""

    day: date
    model: str
    provider_models: tuple[str, ...]  # the provider's ids folded into ``model``
    kvgate: Side
    provider: Side

    def token_variance(self) -> dict[str, Variance | None]:
        """Per token class, kvgate's tokens against the provider's."""
        mine = (self.kvgate.tokens or Tokens()).as_dict()
        theirs = None if self.provider.tokens is None else self.provider.tokens.as_dict()
        return {
            name: variance(count, None if theirs is None else theirs[name])
            for name, count in mine.items()
        }

    def cost_variance(self) -> Variance | None:
        """kvgate's recorded cost against the provider's charge."""
        return variance(self.kvgate.cost or ZERO, self.provider.cost)

    def apart(self) -> bool:
        """Whether any token class or the cost differs at all."""
        found = [*self.token_variance().values(), self.cost_variance()]
        return any(v is not None and v.absolute != 0 for v in found)


def provider_model(provider: str, upstream: str) -> str | None:
    """The model id a record sent to ``provider``'s hosted API; None: not sent there."""
    if "://" in upstream:
        return None  # a vLLM replica (or another server) by its URL
    prefix = PREFIXES[provider]
    if upstream.startswith(prefix):
        return upstream[len(prefix) :]
    if "/" not in upstream and upstream.startswith(FAMILIES[provider]):
        return upstream
    return None


def folded(model_id: str, recorded: Iterable[str]) -> str:
    """The recorded model a provider's id is billed under (see the module's docstring)."""
    names = set(recorded)
    if model_id in names:
        return model_id
    for name in sorted(names, key=lambda n: (-len(n), n)):
        base = name.removesuffix(LATEST)
        if model_id.startswith(base) and SNAPSHOT.fullmatch(model_id[len(base) :]):
            return name
    return model_id


def compare(
    bill: Bill,
    recorded: Iterable[Recorded],
    *,
    since: date | None = None,
    until: date | None = None,
) -> list[Compared]:
    """Every day × model either side has in [since, until] (both days included), by day
    then model; a side without the day × model shows zero."""

    def inside(day: date) -> bool:
        return (since is None or day >= since) and (until is None or day <= until)

    mine: dict[tuple[date, str], tuple[int, Tokens, Decimal]] = {}
    for r in recorded:
        model = provider_model(bill.provider, r.upstream)
        if model is None or not inside(r.day):
            continue
        requests, tokens, cost = mine.get((r.day, model), (0, Tokens(), ZERO))
        mine[(r.day, model)] = (requests + r.requests, tokens + r.tokens, cost + r.cost)
    names = {model for _, model in mine}
    theirs: dict[tuple[date, str], tuple[int, Tokens, Decimal, set[str]]] = {}
    for line in bill.lines:
        if not inside(line.day):
            continue
        key = (line.day, folded(line.model, names))
        requests, tokens, cost, ids = theirs.get(key, (0, Tokens(), ZERO, set()))
        theirs[key] = (requests + line.requests, tokens + line.tokens, cost + line.cost, ids)
        ids.add(line.model)
    out = []
    for key in sorted(mine.keys() | theirs.keys()):
        requests, tokens, cost = mine.get(key, (0, Tokens(), ZERO))
        billed_requests, billed_tokens, billed_cost, ids = theirs.get(
            key, (0, Tokens(), ZERO, set())
        )
        out.append(
            Compared(
                key[0],
                key[1],
                tuple(sorted(ids)),
                Side(requests, tokens, cost),
                Side(
                    billed_requests if bill.has_usage and bill.counts_requests else None,
                    billed_tokens if bill.has_usage else None,
                    billed_cost if bill.has_costs else None,
                ),
            )
        )
    return out
