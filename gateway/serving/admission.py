"""Admission: budgets and rate limits, checked before a request reaches any upstream.

    admit ─▶ the rules that match the caller (held in memory, current within a second)
          ─▶ none: admitted at no cost (no database round trip)
          ─▶ else, from this worker's leases (no database round trip in the steady state):
             count the request in each rate limit's minute (``rates.py``), then reserve
             its largest possible cost on each tenant and key budget; interaction budgets
             (a small counter each) in one transaction; all or nothing
             ─▶ refused: 429 (rate) or 402 (budget), the caller records a refused attempt
    settle ─▶ the request's records' costs replace the reservations and its tokens are
              added to the minutes (in the leases; interaction budgets: one transaction);
              thresholds crossed are alerts (off the path)

The reservation is the request's prompt bounded by its body's size in bytes (a byte-level
tokenizer makes at most a token per byte) at the dearest prompt rate in force, plus its
output cap (``max_tokens``, ``max_output_tokens`` on Responses; else the deployment's
``default_max_tokens``, then sent upstream) at the output rate: a request can never be
recorded at more, so settled spend never passes a limit. A request that does not fit is
refused, never shortened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record
from gateway.budgets import (
    EPOCH,
    FOREVER,
    Budget,
    RateLimit,
    Rules,
    ScopeKind,
    crossed,
    reset_text,
)
from gateway.config import Deployment, ProviderDeployment
from gateway.db import spend
from gateway.db.session import DatabaseError, SessionFactory
from gateway.db.spend import UNITS_PER_NANO, to_units
from gateway.errors import BudgetExceeded, RateLimited, SpendUnavailable
from gateway.metrics import Metrics
from gateway.mirror import Mirror
from gateway.serving.alerts import Alerts
from gateway.serving.calls import Endpoint
from gateway.serving.context import Context
from gateway.serving.leases import Leases
from gateway.serving.rates import (
    COUNT,
    MINUTE,
    Minutes,
    Rated,
    admitted_fields,
    by_name,
    rate_headers,
    retry_after,
    windows,
)
from pricing.book import PriceBook
from pricing.cost import NANO_TOKENS, money, nano_rate

log = logging.getLogger("kvgate.admission")
ZERO = Decimal(0)
INTERACTION = ScopeKind.INTERACTION


# The time now, in UTC (a partial: no Python frame of its own per request).
now: Callable[[], datetime] = partial(datetime.now, UTC)


@dataclass(slots=True)
class Admitted:
    """One admitted request's hold on its budgets and limits, settled once at its end."""

    request_id: str = ""
    charges: tuple[spend.Charge, ...] = ()  # reserved in the database (interaction budgets)
    leased: tuple[spend.Charge, ...] = ()  # taken from this worker's slices
    tokens_of: tuple[spend.Charge, ...] = ()  # the minutes its tokens are added to
    # its x-ratelimit-* headers, as the reply's raw header fields (``admitted_fields``)
    fields: Sequence[tuple[bytes, bytes]] = ()
    cost: Decimal = Decimal(0)
    tokens: int = 0
    settled: bool = False

    @property
    def holds(self) -> bool:
        """Whether it holds anything to settle: budget charges, slices or token minutes."""
        return bool(self.charges or self.leased or self.tokens_of)

    @property
    def headers(self) -> dict[str, str]:
        """Its x-ratelimit-* headers, by name (a refusal after admission carries them)."""
        return by_name(self.fields)

    def add(self, record: Record) -> None:
        """Count one of the request's records (every attempt's)."""
        if not (self.charges or self.leased or self.tokens_of):  # holds, written out
            return
        self.cost += record.cost.total
        self.tokens += record.usage.prompt_tokens + record.usage.output_tokens


FREE = Admitted()  # a request no rule applies to: nothing to settle

# Who a request is, as the rules see it: tenant, key, end user and tags.
Caller = tuple[str, str, str | None, tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Plan:
    """What the rules ask of one caller from ``since`` until ``until`` (the minute, and
    each of its budgets' periods): made once, so that each request only prices itself and
    takes its charges from the slices. Valid while the rules are the same object."""

    rules: Rules
    since: datetime
    until: datetime
    governed: bool = False  # False: no rule matches the caller (free)
    limits: tuple[RateLimit, ...] = ()
    rate: Rated = field(default_factory=lambda: Rated((), (), FOREVER))
    budgets: tuple[Budget, ...] = ()
    # from slices: budget, period start, limit in lease units
    leased: tuple[tuple[Budget, datetime, int], ...] = ()
    exact: tuple[tuple[Budget, datetime], ...] = ()  # in the database, per request


# Each endpoint's output cap, by the name its wire gives it (the first found binds).
OUTPUT_CAPS = {
    Endpoint.CHAT: ("max_completion_tokens", "max_tokens"),
    Endpoint.COMPLETIONS: ("max_tokens",),
    Endpoint.RESPONSES: ("max_output_tokens",),
    Endpoint.MESSAGES: ("max_tokens",),  # required on Anthropic's wire
}


def output_cap(ctx: Context) -> int:
    """The request's output cap; the deployment's default, set in the body under the
    endpoint's own name, if it had none. Embeddings generate nothing."""
    names = OUTPUT_CAPS.get(ctx.call.endpoint)
    if names is None:
        return 0
    body = ctx.call.body
    for name in names:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    cap = ctx.deployment.default_max_tokens
    body[names[-1]] = cap
    return cap


_BILLED: dict[int, tuple[Deployment | ProviderDeployment, frozenset[str]]] = {}


def billed_models(deployment: Deployment | ProviderDeployment) -> frozenset[str]:
    """The models a deployment's requests can be billed as (found once per deployment)."""
    known = _BILLED.get(id(deployment))
    if known is not None and known[0] is deployment:
        return known[1]
    if isinstance(deployment, ProviderDeployment):
        models = frozenset(t.bills_as for t in deployment.targets)
    else:
        models = frozenset({deployment.bills_as})
    if len(_BILLED) > 10_000:  # deployments reloaded many times: start again
        _BILLED.clear()
    _BILLED[id(deployment)] = (deployment, models)
    return models


# A deployment's dearest rates: as priced (prompt, output) and, where ``money_nanos`` is
# exact for them, as nano-dollar fractions (prompt numerator, denominator, output's).
NanoRates = tuple[tuple[int, int, int, int], ...] | None
# Each deployment's dearest rates, while the prices in force last: (deployment, book,
# since, until, the rates, the rates in nano-dollars).
_RATES: dict[
    int,
    tuple[object, PriceBook, datetime, datetime, tuple[tuple[Decimal, Decimal], ...], NanoRates],
] = {}


def dearest_rates(
    book: PriceBook, deployment: Deployment | ProviderDeployment, at: datetime
) -> tuple[tuple[Decimal, Decimal], ...]:
    """The dearest prompt and output rates of each model the deployment bills as, in force
    at ``at`` (looked up again only when the book is replaced or a dated price begins)."""
    return _dearest(book, deployment, at)[4]


def _dearest(
    book: PriceBook, deployment: Deployment | ProviderDeployment, at: datetime
) -> tuple[object, PriceBook, datetime, datetime, tuple[tuple[Decimal, Decimal], ...], NanoRates]:
    """``dearest_rates``' cache entry (the rates in nano-dollars with them)."""
    known = _RATES.get(id(deployment))
    if (
        known is not None
        and known[0] is deployment
        and known[1] is book
        and known[2] <= at < known[3]
    ):
        return known
    since, until = EPOCH, FOREVER
    rates = []
    for model in sorted(billed_models(deployment)):
        price, after = book.in_force(model, at=at)
        if after is not None:
            until = min(until, after)
        if price is not None:
            since = max(since, price.effective_from)
            rates.append(price.dearest)
    if len(_RATES) > 10_000:  # deployments reloaded many times: start again
        _RATES.clear()
    known = _RATES[id(deployment)] = (
        deployment,
        book,
        since,
        until,
        tuple(rates),
        nano_rates(rates),
    )
    return known


def nano_rates(rates: Sequence[tuple[Decimal, Decimal]]) -> NanoRates:
    """(prompt, output) rates as nano-dollar fractions (``nano_rate``); None if any is not
    exact in ints (``largest_units`` then prices with ``money``)."""
    nanos = []
    for prompt_rate, output_rate in rates:
        prompt_nanos, output_nanos = nano_rate(prompt_rate), nano_rate(output_rate)
        if prompt_nanos is None or output_nanos is None:
            return None
        nanos.append((*prompt_nanos, *output_nanos))
    return tuple(nanos)


def largest_cost(ledger: Ledger, ctx: Context, at: datetime) -> Decimal:
    """The most the request can be recorded at, with the prices in force at ``at``."""
    # At most this many prompt tokens: the body's bytes (or four per character).
    prompt = ctx.call.body_bytes or 4 * ctx.call.prompt_chars + 1024
    output = output_cap(ctx)
    if ctx.call.endpoint is Endpoint.COMPLETIONS and ctx.call.body.get("echo"):
        output += prompt
    return _worst(prompt, output, dearest_rates(ledger.book, ctx.deployment, at))


def _worst(prompt: int, output: int, rates: tuple[tuple[Decimal, Decimal], ...]) -> Decimal:
    worst = ZERO
    for prompt_rate, output_rate in rates:
        cost = money(prompt, prompt_rate) + money(output, output_rate)
        if cost > worst:
            worst = cost
    return worst


def largest_units(ledger: Ledger, ctx: Context, at: datetime) -> int:
    """``largest_cost`` in lease units, in ints (``money_nanos``, written out) where that
    is exact, which every real price and request is; else ``largest_cost``'s, converted."""
    call = ctx.call
    prompt = call.body_bytes or 4 * call.prompt_chars + 1024
    output = output_cap(ctx)
    if call.endpoint is Endpoint.COMPLETIONS and call.body.get("echo"):
        output += prompt
    known = _dearest(ledger.book, ctx.deployment, at)
    rates = known[5]
    if rates is None or not (
        -NANO_TOKENS < prompt < NANO_TOKENS and -NANO_TOKENS < output < NANO_TOKENS
    ):
        return to_units(_worst(prompt, output, known[4]))
    worst = 0
    for prompt_m, prompt_d, output_m, output_d in rates:
        # money_nanos(prompt) + money_nanos(output), written out: half-even to the nano
        cost = prompt * prompt_m
        if prompt_d != 1:
            cost, rest = divmod(cost, prompt_d)
            if rest * 2 > prompt_d or (rest * 2 == prompt_d and cost & 1):
                cost += 1
        nanos = output * output_m
        if output_d != 1:
            nanos, rest = divmod(nanos, output_d)
            if rest * 2 > output_d or (rest * 2 == output_d and nanos & 1):
                nanos += 1
        cost += nanos
        if cost > worst:
            worst = cost
    return worst * UNITS_PER_NANO


class Admission:
    """Admits requests against the budgets and rate limits every gateway shares."""

    def __init__(
        self,
        *,
        sessions: SessionFactory,
        ledger: Ledger,
        budgets: Mirror[tuple[Budget, ...]],
        limits: Mirror[tuple[RateLimit, ...]],
        metrics: Metrics | None = None,
        alerts: Alerts | None = None,
        clock: Callable[[], datetime] = now,
        hold_ttl_s: float = 60.0,
        leases: bool = True,
    ) -> None:
        self.sessions = sessions
        self.hold_ttl = timedelta(seconds=hold_ttl_s)
        # Rate limits and tenant and key budgets: slices held here (no database round trip
        # per request); interaction budgets (each its own small counter): exact per request,
        # as are all budgets without ``leases``.
        self.leases = Leases(
            sessions=sessions, hold_ttl=self.hold_ttl, clock=clock, crossed=self._flushed
        )
        self.lease_budgets = leases
        self.live: set[str] = set()  # requests holding reservations here: renewed
        self.ledger = ledger
        self.rules = Rules()
        self.metrics = metrics
        self.alerts = alerts
        self.clock = clock  # injectable: periods turn over when the clock says
        self.minutes = Minutes()
        # Each budget's current period, while it lasts: (start, end, the budget as it was).
        self._periods: dict[str, tuple[datetime, datetime, Budget]] = {}
        self._plans: dict[Caller, Plan] = {}  # each caller's, while it lasts
        self._background: set[asyncio.Task[None]] = set()
        budgets.follow(lambda value: self._install(budgets=value))
        limits.follow(lambda value: self._install(limits=value))

    def _install(self, **changed: Any) -> None:
        from dataclasses import replace

        self.rules = replace(self.rules, **changed)
        self._plans = {}
        if "budgets" in changed:
            self._periods = {}

    def _plan(self, caller: Caller, at: datetime) -> Plan:
        """The caller's plan at ``at``: the limits and budgets that match it, and each
        budget's period (its zone arithmetic once per period)."""
        if len(self._plans) > 10_000:  # callers come and go: the cache stays small
            self._plans.clear()
        rules = self.rules
        limits = rules.limits_for(caller[0], caller[1])
        budgets = rules.budgets_for(*caller)
        if not limits and not budgets:
            plan = self._plans[caller] = Plan(rules, EPOCH, FOREVER)
            return plan
        window = self.minutes.minute(at)
        since, until = window, window + MINUTE
        leased: list[tuple[Budget, datetime, int]] = []
        exact: list[tuple[Budget, datetime]] = []
        for budget in budgets:
            start, end = self._period(budget, at)
            since, until = max(since, start), min(until, end)
            slices = self.lease_budgets and budget.scope.kind is not INTERACTION
            if slices:
                leased.append((budget, start, to_units(budget.limit)))
            else:
                exact.append((budget, start))
        plan = self._plans[caller] = Plan(
            rules,
            since,
            until,
            governed=True,
            limits=limits,
            rate=self.minutes.rated(limits, window),
            budgets=budgets,
            leased=tuple(leased),
            exact=tuple(exact),
        )
        return plan

    def _period(self, budget: Budget, at: datetime) -> tuple[datetime, datetime]:
        """The budget's period ``at`` falls in (zone arithmetic once per period)."""
        known = self._periods.get(budget.id)
        if known is None or known[2] is not budget or not known[0] <= at < known[1]:
            start, end = budget.bounds(at)
            known = self._periods[budget.id] = (start, end, budget)
        return known[0], known[1]

    async def admit(self, ctx: Context) -> Admitted:
        """Count and reserve, or refuse with 429 / 402 (BudgetExceeded, RateLimited)."""
        principal, call = ctx.principal, ctx.call
        if not call.endpoint.billed:
            return FREE  # counting tokens costs nothing and generates nothing
        if principal.tenant_id not in self.rules.governed:
            return FREE  # no budget or limit names this tenant
        caller = (principal.tenant_id, principal.api_key_id, call.end_user, call.tags)
        plan = self._plans.get(caller)
        if plan is not None and not plan.governed and plan.rules is self.rules:
            return FREE  # none of the tenant's rules matches this caller
        at = self.clock()
        if plan is None or plan.rules is not self.rules or not plan.since <= at < plan.until:
            plan = self._plan(caller, at)
            if not plan.governed:
                return FREE
        rate = plan.rate
        # In lease units; each charge makes its Decimal amount only if asked (not here).
        units = largest_units(self.ledger, ctx, at) if plan.budgets else 0
        leased = tuple(
            [
                spend.Charge(budget.id, "", start, budget.limit, None, None, units, cap)
                for budget, start, cap in plan.leased
            ]
        )
        # The steady state; a request counts in its minutes once admitted (tokens: recorded).
        if not plan.exact and self.leases.take_now(rate.all + leased, rate.requests):
            return Admitted(
                request_id=ctx.request_id,
                leased=leased,
                tokens_of=rate.tokens,
                fields=admitted_fields(self.leases, rate, at),
            )
        exact = [
            spend.Charge(
                budget.id,
                ctx.interaction_id if budget.scope.kind is INTERACTION else "",
                start,
                budget.limit,
                None,
                None,
                units,
            )
            for budget, start in plan.exact
        ]
        try:
            short, budget_short = await self._take(rate, leased, exact, ctx.request_id, at)
        except DatabaseError as exc:
            raise SpendUnavailable(
                f"budgets and rate limits apply and cannot be checked now ({type(exc).__name__})"
            ) from exc
        if short is None:
            fields = admitted_fields(self.leases, rate, at)
        else:
            window = rate.end - MINUTE
            found = windows(self.leases, plan.limits, window, short)
            headers = rate_headers(found, window, at)
            self._refused("rate_limit")
            retry = retry_after(window, at)
            scope = next(w.limit.scope for w in found if not w.admitted)
            raise RateLimited(
                f"rate limit of {scope} reached for this minute; retry in {retry} s",
                headers={**headers, "retry-after": str(retry)},
            )
        if budget_short is not None:
            await self._exhausted(plan.budgets, budget_short, at, by_name(fields))
        if exact:
            self.live.add(ctx.request_id)
        return Admitted(
            request_id=ctx.request_id,
            charges=tuple(exact),
            leased=leased,
            tokens_of=rate.tokens,
            fields=fields,
        )

    async def _take(
        self,
        rate: Rated,
        leased: tuple[spend.Charge, ...],
        exact: list[spend.Charge],
        holder: str,
        at: datetime,
    ) -> tuple[spend.Charge | None, spend.Charge | None]:
        """Count the request in its minutes, then reserve on its budgets, all or nothing:
        (the rate counter that refused it, the budget counter that refused it)."""
        short = await self.leases.take(rate.all) if rate.all else None
        if short is not None:
            return short, None
        taken: tuple[spend.Charge, ...] = ()
        done = False
        try:
            short = await self.leases.take(leased) if leased else None
            taken = leased if short is None else ()
            if short is None and exact:
                short = await asyncio.to_thread(self._reserve, exact, holder, at)
            done = True
        finally:
            if short is not None or not done:  # refused, or an error on the way
                self.leases.give_back((*rate.all, *taken))
        if short is None:  # a request counts in its minutes once admitted (tokens: recorded)
            self.leases.settle_units(rate.requests, COUNT)
        return None, short

    def _reserve(
        self, charges: list[spend.Charge], holder: str, at: datetime
    ) -> spend.Charge | None:
        with self.sessions() as session, session.begin():
            short = spend.reserve(session, charges, holder=holder, expires_at=at + self.hold_ttl)
            if short is not None:
                session.rollback()
            return short

    async def _exhausted(
        self,
        budgets: tuple[Budget, ...],
        short: spend.Charge,
        at: datetime,
        headers: dict[str, str],
    ) -> None:
        """Refuse with 402 (BudgetExceeded); the 100 % alert, if this exhausted it."""
        self._refused("budget")
        budget = next(b for b in budgets if b.id == short.budget_id)
        _, end = budget.bounds(at)
        if self.alerts is not None:  # exhausted: the 100 % alert, if not sent yet
            spent = await asyncio.to_thread(self._spent_now, short)
            # Only when the spend itself leaves no room for this request: a refusal
            # while other workers' slices hold the rest is not the budget running out.
            if budget.limit - spent <= short.amount:
                self.alerts.exhausted(budget, short, spent)
        raise BudgetExceeded(
            f"budget {budget.id} on {budget.scope} ({budget.period}) cannot cover this "
            f"request: limit {budget.limit.normalize():f}; it resets {reset_text(end)}",
            headers=headers,
        )

    def _spent_now(self, charge: spend.Charge) -> Decimal:
        with self.sessions() as session:
            return spend.counter(session, charge.budget_id, charge.period_start, charge.subject)[0]

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.spend_refusals.labels(reason).inc()

    async def settle(self, admitted: Admitted) -> None:
        """Replace the request's reservations by its records' cost, add its tokens to its
        minutes (once; never raises)."""
        if admitted.settled or not (admitted.charges or admitted.leased or admitted.tokens_of):
            return  # settled, or holds nothing (``holds``, written out)
        admitted.settled = True
        if admitted.charges:  # only those are live (renewed by ``tick``)
            self.live.discard(admitted.request_id)
        cost = admitted.cost
        units = to_units(cost)
        for charge in (*admitted.leased, *admitted.charges):
            if charge.units < units:  # charge.amount < cost, in ints
                log.warning(
                    "a request cost %s, above the %s reserved for it on budget %s",
                    cost,
                    charge.amount,
                    charge.budget_id,
                )
        self.leases.settle_units(admitted.leased, units)
        self.leases.settle_units(admitted.tokens_of, admitted.tokens * COUNT)  # units(tokens)
        if not admitted.charges:
            return
        try:
            after = await asyncio.to_thread(self._settle, admitted)
        except DatabaseError:
            log.exception("budget settlement failed: its holds return after their TTL")
            return
        for charge, spent in after:
            self._flushed(charge, spent - cost, spent)

    def _flushed(self, charge: spend.Charge, before: Decimal, after: Decimal) -> None:
        """A counter's spend moved from ``before`` to ``after``: the thresholds it crossed."""
        budget = next((b for b in self.rules.budgets if b.id == charge.budget_id), None)
        if budget is not None and self.alerts is not None:
            for threshold in crossed(budget.alert_at, budget.limit, before, after):
                self.alerts.crossed(budget, charge, threshold, after)

    async def close(self) -> None:
        """Give this worker's slices back to their counters (the gateway is stopping)."""
        await self.leases.close()

    async def flush(self) -> None:
        """Sync this worker's slices (spend flushed, topped up, idle ones returned)."""
        counters = {b.id for b in self.rules.budgets}
        for limit in self.rules.limits:
            counters.update(spend.window_counters(limit.id))
        await self.leases.tick(counters)

    def _settle(self, admitted: Admitted) -> list[tuple[spend.Charge, Decimal]]:
        with self.sessions() as session, session.begin():
            return spend.settle(
                session, admitted.charges, admitted.cost, holder=admitted.request_id
            )

    async def tick(self) -> None:
        """Renew the holds of the requests running here; return those of dead gateways."""
        await asyncio.to_thread(self._tick, tuple(self.live), self.clock())

    def _tick(self, live: tuple[str, ...], at: datetime) -> None:
        with self.sessions() as session, session.begin():
            spend.renew(session, live, at + self.hold_ttl)
            swept = spend.sweep(session, at)
        if swept:
            log.warning("returned %d budget hold(s) of requests whose gateway went away", swept)

    def settle_later(self, admitted: Admitted) -> None:
        """``settle`` from a cancelled task, where awaiting is no longer possible."""
        if admitted.settled or not admitted.holds:
            return
        task = asyncio.ensure_future(self.settle(admitted))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
