"""Admission: budgets and rate limits, checked before a request reaches any upstream.

    admit ─▶ the rules that match the caller (held in memory, current within a second)
          ─▶ none: admitted at no cost (no database round trip)
          ─▶ else one transaction: count the request in each rate limit's minute, reserve
             its largest possible cost on each budget counter; all or nothing
             ─▶ refused: 429 (rate) or 402 (budget), the caller records a refused attempt
    settle ─▶ the request's records' costs replace the reservation (one transaction),
              tokens added to the minute; thresholds crossed are alerts (off the path)

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record
from gateway.budgets import Budget, RateLimit, Rules, ScopeKind, crossed, reset_text
from gateway.config import Deployment, ProviderDeployment
from gateway.db import spend
from gateway.db.session import DatabaseError, SessionFactory
from gateway.errors import BudgetExceeded, RateLimited, SpendUnavailable
from gateway.metrics import Metrics
from gateway.mirror import Mirror
from gateway.serving.alerts import Alerts
from gateway.serving.calls import Endpoint
from gateway.serving.context import Context
from gateway.serving.leases import Leases
from pricing.book import Price
from pricing.cost import money

log = logging.getLogger("kvgate.admission")
MINUTE = timedelta(minutes=1)
ZERO = Decimal(0)


def now() -> datetime:
    """The time now, in UTC."""
    return datetime.now(UTC)


@dataclass(slots=True)
class Admitted:
    """One admitted request's hold on its budgets and limits, settled once at its end."""

    request_id: str = ""
    charges: tuple[spend.Charge, ...] = ()  # reserved in the database (interaction budgets)
    leased: tuple[spend.Charge, ...] = ()  # taken from this worker's slices
    limits: tuple[RateLimit, ...] = ()
    window: datetime | None = None
    headers: dict[str, str] = field(default_factory=dict)
    cost: Decimal = Decimal(0)
    tokens: int = 0
    settled: bool = False

    @property
    def holds(self) -> bool:
        """Whether it holds anything to settle: budget charges, leased slices or rate limits."""
        return bool(self.charges or self.leased or self.limits)

    def add(self, record: Record) -> None:
        """Count one of the request's records (every attempt's)."""
        if not self.holds:
            return
        self.cost += record.cost.total
        self.tokens += record.usage.prompt_tokens + record.usage.output_tokens


FREE = Admitted()  # a request no rule applies to: nothing to settle


def _rates(price: Price) -> tuple[Decimal, Decimal]:
    """The dearest prompt and output rates of any of the entry's rate sets."""
    sets = [price.base, *(r for _, r in price.tiers)]
    if price.long_context is not None:
        sets.append(price.long_context.rates)
    prompt = max(
        max(r.input, r.cache_read, r.cache_write or ZERO, r.cache_write_1h or ZERO) for r in sets
    )
    return prompt, max(r.output for r in sets)


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


def prompt_bound(ctx: Context) -> int:
    """At most this many prompt tokens: the body's bytes (or four per character)."""
    return ctx.call.body_bytes or 4 * ctx.call.prompt_chars + 1024


def largest_cost(ledger: Ledger, ctx: Context, at: datetime) -> Decimal:
    """The most the request can be recorded at, with the prices in force at ``at``."""
    deployment = ctx.deployment
    if isinstance(deployment, ProviderDeployment):
        models = {t.bills_as for t in deployment.targets}
    else:
        assert isinstance(deployment, Deployment)
        models = {deployment.bills_as}
    prompt, output = prompt_bound(ctx), output_cap(ctx)
    if ctx.call.endpoint is Endpoint.COMPLETIONS and ctx.call.body.get("echo"):
        output += prompt
    worst = Decimal(0)
    for model in models:
        price = ledger.book.price_for(model, at=at)
        if price is not None:
            prompt_rate, output_rate = _rates(price)
            worst = max(worst, money(prompt, prompt_rate) + money(output, output_rate))
    return worst


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


# Each kind of x-ratelimit-* header: a window's cap per minute (None: no cap) and its count.
_RATE_KINDS: tuple[
    tuple[str, Callable[[spend.Window], int | None], Callable[[spend.Window], int]], ...
] = (
    ("requests", lambda w: w.limit.requests_per_minute, lambda w: w.requests),
    ("tokens", lambda w: w.limit.tokens_per_minute, lambda w: w.tokens),
)


def rate_headers(windows: list[spend.Window], window: datetime, at: datetime) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers, for the tightest limit of each kind."""
    reset = f"{max((window + MINUTE - at).total_seconds(), 0.0):.3f}s"
    headers: dict[str, str] = {}
    for kind, cap, used in _RATE_KINDS:
        room = [(limit - used(w), limit) for w in windows if (limit := cap(w)) is not None]
        if room:
            left, limit = min(room, key=lambda p: p[0])
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(left, 0))
            headers[f"x-ratelimit-reset-{kind}"] = reset
    return headers


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
        # Tenant and key budgets: slices held here (no database round trip per request);
        # interaction budgets (each its own small counter) and rate limits: exact per request.
        self.leases = (
            Leases(sessions=sessions, hold_ttl=self.hold_ttl, clock=clock, crossed=self._flushed)
            if leases
            else None
        )
        self.live: set[str] = set()  # requests holding reservations here: renewed
        self.ledger = ledger
        self.rules = Rules()
        self.metrics = metrics
        self.alerts = alerts
        self.clock = clock  # injectable: periods turn over when the clock says
        self._background: set[asyncio.Task[None]] = set()
        budgets.follow(lambda value: self._install(budgets=value))
        limits.follow(lambda value: self._install(limits=value))

    def _install(self, **changed: Any) -> None:
        from dataclasses import replace

        self.rules = replace(self.rules, **changed)

    def _budgets(self, ctx: Context) -> tuple[Budget, ...]:
        principal, call = ctx.principal, ctx.call
        return self.rules.budgets_for(
            principal.tenant_id, principal.api_key_id, call.end_user, call.tags
        )

    def charges(
        self, ctx: Context, budgets: tuple[Budget, ...], at: datetime
    ) -> tuple[tuple[spend.Charge, Budget], ...]:
        """What the request would charge each of the budgets that match it, now."""
        if not budgets:
            return ()
        amount = largest_cost(self.ledger, ctx, at)
        found = []
        for budget in budgets:
            subject = ctx.interaction_id if budget.scope.kind is ScopeKind.INTERACTION else ""
            start, _ = budget.bounds(at)
            found.append((spend.Charge(budget.id, subject, start, budget.limit, amount), budget))
        return tuple(found)

    async def admit(self, ctx: Context) -> Admitted:
        """Count and reserve, or refuse with 429 / 402 (BudgetExceeded, RateLimited)."""
        principal = ctx.principal
        if not ctx.call.endpoint.billed:
            return FREE  # counting tokens costs nothing and generates nothing
        if principal.tenant_id not in self.rules.governed:
            return FREE  # no budget or limit names this tenant
        limits = self.rules.limits_for(principal.tenant_id, principal.api_key_id)
        budgets = self._budgets(ctx)
        if not limits and not budgets:
            return FREE
        at = self.clock()
        charged = self.charges(ctx, budgets, at)
        window = _minute(at)
        leased: tuple[spend.Charge, ...] = ()
        if self.leases is not None:
            leased = tuple(c for c, b in charged if b.scope.kind is not ScopeKind.INTERACTION)
        exact = [c for c, _ in charged if c not in leased]
        windows: list[spend.Window] = []
        try:
            short = await self.leases.take(leased) if self.leases and leased else None
            if short is None and (exact or limits):
                windows, short = await asyncio.to_thread(
                    self._take, exact, limits, window, ctx.request_id, at
                )
                refused = short is not None or any(not w.admitted for w in windows)
                if refused and self.leases is not None:
                    self.leases.give_back(leased)
        except DatabaseError as exc:
            raise SpendUnavailable(
                f"budgets and rate limits apply and cannot be checked now ({type(exc).__name__})"
            ) from exc
        headers = rate_headers(windows, window, at)
        if any(not w.admitted for w in windows):
            self._refused("rate_limit")
            retry = max(int((window + MINUTE - at).total_seconds() + 0.999), 1)
            used = [w for w in windows if not w.admitted]
            raise RateLimited(
                f"rate limit of {used[0].limit.scope} reached for this minute; retry in {retry} s",
                headers={**headers, "retry-after": str(retry)},
            )
        if short is not None:
            self._refused("budget")
            budget = next(b for c, b in charged if c.key == short.key)
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
        if exact:
            self.live.add(ctx.request_id)
        return Admitted(
            request_id=ctx.request_id,
            charges=tuple(exact),
            leased=leased,
            limits=limits,
            window=window,
            headers=headers,
        )

    def _take(
        self,
        charges: list[spend.Charge],
        limits: tuple[RateLimit, ...],
        window: datetime,
        holder: str,
        at: datetime,
    ) -> tuple[list[spend.Window], spend.Charge | None]:
        with self.sessions() as session, session.begin():
            windows = spend.count_request(session, limits, window)
            if any(not w.admitted for w in windows):
                session.rollback()
                return windows, None
            expires = at + self.hold_ttl
            short = spend.reserve(session, charges, holder=holder, expires_at=expires)
            if short is not None:
                session.rollback()
                # The windows stand uncounted: the request never ran.
                windows = [spend.Window(w.limit, w.requests - 1, w.tokens, True) for w in windows]
            return windows, short

    def _spent_now(self, charge: spend.Charge) -> Decimal:
        with self.sessions() as session:
            return spend.counter(session, charge.budget_id, charge.period_start, charge.subject)[0]

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.spend_refusals.labels(reason).inc()

    async def settle(self, admitted: Admitted) -> None:
        """Replace the request's reservations by its records' cost (once; never raises)."""
        if admitted.settled or not admitted.holds:
            return
        admitted.settled = True
        self.live.discard(admitted.request_id)
        if self.leases is not None and admitted.leased:
            self.leases.settle(admitted.leased, admitted.cost)
        if not admitted.charges and not admitted.limits:
            return
        try:
            after = await asyncio.to_thread(self._settle, admitted)
        except DatabaseError:
            log.exception("budget settlement failed: its holds return after their TTL")
            return
        for charge, spent in after:
            if charge.amount < admitted.cost:
                log.warning(
                    "a request cost %s, above the %s reserved for it on budget %s",
                    admitted.cost,
                    charge.amount,
                    charge.budget_id,
                )
            self._flushed(charge, spent - admitted.cost, spent)

    def _flushed(self, charge: spend.Charge, before: Decimal, after: Decimal) -> None:
        """A counter's spend moved from ``before`` to ``after``: the thresholds it crossed."""
        budget = next((b for b in self.rules.budgets if b.id == charge.budget_id), None)
        if budget is not None and self.alerts is not None:
            for threshold in crossed(budget.alert_at, budget.limit, before, after):
                self.alerts.crossed(budget, charge, threshold, after)

    async def close(self) -> None:
        """Give this worker's slices back to their budgets (the gateway is stopping)."""
        if self.leases is not None:
            await self.leases.close()

    async def flush(self) -> None:
        """Sync this worker's budget slices (spend flushed, topped up, idle ones returned)."""
        if self.leases is not None:
            await self.leases.tick({b.id for b in self.rules.budgets})

    def _settle(self, admitted: Admitted) -> list[tuple[spend.Charge, Decimal]]:
        # Rows are locked in admission's order (rate windows, then counters): no deadlock.
        with self.sessions() as session, session.begin():
            if admitted.window is not None:
                ids = [r.id for r in admitted.limits]
                spend.count_tokens(session, ids, admitted.window, admitted.tokens)
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
