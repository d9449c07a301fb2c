"""Leases: each worker holds a slice of a shared counter and admits from it in memory.

    counter (database)   spent + reserved <= limit, reserved = every worker's slices
    lease (this worker)  held (its slice) >= used (in flight) + spent (settled, unflushed)

The counters are budgets' (money per period) and rate limits' (requests or tokens per
UTC minute, ``gateway/serving/rates.py``): one machinery. Admission takes a request's
charge from the worker's slice, with no database round trip; settlement moves it from
``used`` to what it came to. Every ``FLUSH_S`` the worker looks at its slices, off the
request path: one that runs low is topped up, one idle for ``IDLE_S`` or past its period's
end is given back, and a slice's spend is flushed into its counter once it is a quarter
(``SPEND_SHARES``) of the slice or ``SPEND_FLUSH_S`` old (a busy worker whose slices have
room flushes once a second, not ten times). Each slice's room is computed under its counter's
row lock (``gateway/db/spend.py`` ``sync_lease``), all of a tick's slices in one
transaction (a budget and a rate limit are three counters: one transaction, not three). A
slice of a period about to begin (a rate limit's next minute) is taken ``AHEAD_S`` before
it does, by a worker that used the current one within ``IDLE_S``. A request its slice
cannot cover waits for one such sync; if the counter has no room left for it, it is
refused.

The bound: what is held but unused is at most the workers' slices, each at most
``max(SHARE x limit, SLICE_REQUESTS x the largest request seen)``, for at most ``IDLE_S``
after a worker's last request; a request can be refused while other workers still hold
that much; spend never passes the limit. A worker that dies leaves its slice to be swept
after the hold TTL (and the spend it had not flushed, at most ``SPEND_FLUSH_S`` of it, or
about a quarter of its slice, is missing from the counter, not from the records).

A lease counts in integer lease units (``spend.UNITS``: 10^-11 of the prices' currency,
in which money, limits and slices are whole numbers), so that admission adds and compares
ints; amounts become ``Decimal`` only at the edges (a sync's request and result, ``total``,
``settle``'s amount, the alerts).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from gateway.db import spend
from gateway.db.session import DatabaseError, SessionFactory
from gateway.db.spend import from_units, to_units

log = logging.getLogger("kvgate.leases")
SHARE = Decimal("0.05")  # a slice is at most this share of the limit...
SLICE_REQUESTS = 8  # ...or room for this many of the largest request seen, if more
FLUSH_S = 0.1  # how often a worker looks at its slices
SPEND_FLUSH_S = 1.0  # a slice's spend is flushed at least this often...
SPEND_SHARES = 4  # ...and once it is this many-th of the slice (a quarter)
IDLE_S = 1.0  # a slice unused this long goes back to the budget
AHEAD_S = 2 * FLUSH_S  # a period about to begin: its slice taken this long before
ZERO = Decimal(0)

Key = tuple[str, str, datetime]


@dataclass(slots=True)
class Lease:
    """This worker's slice of one counter; its amounts in lease units (``spend.UNITS``)."""

    budget_id: str
    period_start: datetime
    limit: Decimal
    ends: datetime | None = None  # where known, its period's end: no slice held past it
    held: int = 0
    used: int = 0
    spent: int = 0
    counted: int = 0  # the counter's spend as of the last sync
    largest: int = 0
    last_used: float = field(default_factory=time.monotonic)
    synced_at: float = 0.0  # when its hold's expiry was last renewed
    syncing: asyncio.Event | None = None
    waiting: int = 0  # requests waiting for a sync to cover them: the slice stays known
    cap: int = field(init=False, default=0)  # the limit, in units
    share: int = field(init=False, default=0)  # SHARE x the limit, in units

    def __post_init__(self) -> None:
        self.set_limit(self.limit)

    def set_limit(self, limit: Decimal) -> None:
        """The counter's limit (and its share, in units, made once per limit)."""
        self.limit = limit
        self.cap = to_units(limit)
        self.share = to_units(limit * SHARE)

    @property
    def available(self) -> int:
        """What this slice can still admit: held, less used and spent."""
        return self.held - self.used - self.spent

    @property
    def total(self) -> int:
        """The counter's spend as this worker knows it: synced, then its own since."""
        return self.counted + self.spent + self.used

    def want(self, now: float, at: datetime) -> int:
        """The slice to hold: none once idle, or once its period has ended."""
        if now - self.last_used > IDLE_S or (self.ends is not None and at >= self.ends):
            return 0
        return max(self.share, self.largest * SLICE_REQUESTS)


def _key(charge: spend.Charge) -> Key:
    return charge.key


def _covers(lease: Lease, amount: int) -> bool:
    """Whether the slice covers an amount. A slice with nothing left covers nothing, not
    even a free request (a zero budget)."""
    available = lease.held - lease.used - lease.spent
    return available >= amount and available > 0


@dataclass(frozen=True, slots=True)
class _Pending:
    """A sync under way: its slice, the event its waiters wait on, when it began, the
    spend it flushes, and what it asks of the counter."""

    lease: Lease
    event: asyncio.Event
    at: float
    spent: int
    request: spend.LeaseSync


class Leases:
    """The slices one worker holds, and their syncs."""

    def __init__(
        self,
        *,
        sessions: SessionFactory,
        hold_ttl: timedelta,
        clock: Callable[[], datetime],
        crossed: Callable[[spend.Charge, Decimal, Decimal], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.hold_ttl = hold_ttl
        self.clock = clock
        self.crossed = crossed  # (charge, spent before, spent after): alerts
        self.token = secrets.token_hex(8)
        self.leases: dict[Key, Lease] = {}

    def _lease(self, charge: spend.Charge) -> tuple[Lease, bool]:
        """The charge's lease, and whether its limit was lowered since it was last used."""
        lease = self.leases.get(charge.key)
        if lease is None:
            lease = Lease(charge.budget_id, charge.period_start, charge.limit, charge.period_end)
            self.leases[charge.key] = lease
        lowered = charge.cap < lease.cap
        if charge.cap != lease.cap:
            lease.set_limit(charge.limit)
        else:
            lease.limit = charge.limit
        return lease, lowered

    def take_now(
        self, charges: tuple[spend.Charge, ...], counted: tuple[spend.Charge, ...] = ()
    ) -> bool:
        """Take every charge from its slice at once, if each slice is held, its limit
        unchanged and it covers the charge (the steady state); else take nothing and say so
        (``take`` then waits for what is missing). Nothing is awaited between the checks and
        the taking, so no other request sees a part of it. Those of the charges also in
        ``counted`` (a rate limit's requests: counted once admitted) are then settled at
        their own amounts, as ``settle`` would."""
        leases = self.leases
        taken: list[tuple[Lease, int]] = []
        for charge in charges:
            lease = leases.get(charge.key)
            amount = charge.units
            if lease is None or lease.cap != charge.cap:
                break
            # _covers, written out (each charge after those before it)
            available = lease.held - lease.used - lease.spent
            if available < amount or available <= 0:
                break
            lease.used += amount
            taken.append((lease, amount))
        else:
            now = time.monotonic()
            for lease, amount in taken:
                lease.last_used = now
                if amount > lease.largest:
                    lease.largest = amount
            for charge in counted:  # settle(counted, amount), written out: each just taken
                lease = leases[charge.key]
                lease.used -= charge.units
                lease.spent += charge.units
            return True
        for held, back in taken:
            held.used -= back
        return False

    async def take(self, charges: tuple[spend.Charge, ...]) -> spend.Charge | None:
        """Take every charge from its slice, or none; the first that cannot be covered."""
        if len(charges) > 1:
            charges = tuple(sorted(charges, key=_key))
        now = time.monotonic()
        taken: list[spend.Charge] = []
        try:
            for charge in charges:
                lease, lowered = self._lease(charge)
                lease.last_used = now
                amount = charge.units
                if amount > lease.largest:
                    lease.largest = amount
                if lowered or not _covers(lease, amount):  # the steady state skips this
                    lease.waiting += 1
                    try:
                        if lowered:  # what the slice holds may be past the new limit: resized
                            await self.sync(charge.key, need=amount, again=True)
                        if not _covers(lease, amount):
                            await self.sync(charge.key, need=amount)
                    finally:
                        lease.waiting -= 1
                    if not _covers(lease, amount):
                        self.give_back(tuple(taken))
                        return charge
                lease.used += amount
                taken.append(charge)
        except BaseException:  # a sync failed (or was cancelled): nothing stays taken
            self.give_back(tuple(taken))
            raise
        return None

    def give_back(self, charges: tuple[spend.Charge, ...]) -> None:
        """Return reservations that were not used (another check refused the request)."""
        for charge in charges:
            lease = self.leases.get(charge.key)
            if lease is not None:
                lease.used -= charge.units

    def settle(self, charges: tuple[spend.Charge, ...], amount: Decimal) -> None:
        """The request's reservations become what it came to (flushed by the next sync);
        a slice forgotten meanwhile (its period over, its budget deleted) takes nothing."""
        self.settle_units(charges, to_units(amount))

    def settle_units(self, charges: tuple[spend.Charge, ...], amount: int) -> None:
        """``settle``, the amount in lease units."""
        for charge in charges:
            lease = self.leases.get(charge.key)
            if lease is not None:
                lease.used -= charge.units
                lease.spent += amount
                if amount > lease.largest:
                    lease.largest = amount

    def total(self, key: Key) -> Decimal:
        """A counter's spend as this worker knows it (zero for a counter it holds none of)."""
        lease = self.leases.get(key)
        return from_units(lease.total) if lease is not None else ZERO

    async def sync(self, key: Key, *, need: int = 0, again: bool = False) -> None:
        """Flush one slice's spend and resize it (one at a time per slice); ``again``: a
        sync already under way is not enough (it began before the limit was lowered)."""
        lease = self.leases[key]
        while lease.syncing is not None:
            await lease.syncing.wait()
            if not again and (not need or lease.available >= need):
                return
        await self._run([self._begin(lease, need)])

    def _begin(self, lease: Lease, need: int) -> _Pending:
        """Mark the slice as syncing, and what its sync asks of the counter."""
        event = lease.syncing = asyncio.Event()
        now = time.monotonic()
        spent, used = lease.spent, lease.used
        want = lease.want(now, self.clock())
        want = max(want, need + used) if need else want
        target = max(want, used)
        if target < lease.held - spent:  # shrinking: at once, before the database
            lease.held = spent + target
        request = spend.LeaseSync(
            holder=f"lease:{self.token}:{int(lease.period_start.timestamp())}",
            budget_id=lease.budget_id,
            subject="",
            period_start=lease.period_start,
            limit=lease.limit,
            spent=from_units(spent),
            want=from_units(want),
            floor=from_units(used),
            expires_at=self.clock() + self.hold_ttl,
        )
        return _Pending(lease, event, now, spent, request)

    async def _run(self, pending: list[_Pending]) -> None:
        """Run the syncs in one transaction, off the loop; each applied to its slice
        whatever became of the task that awaited them (cancelled at shutdown, say): a
        committed sync is always reflected here, and never flushed twice."""
        requests = [p.request for p in pending]
        future = asyncio.ensure_future(asyncio.to_thread(self._sync, requests))

        def applied(future: asyncio.Future[list[tuple[Decimal, Decimal]]]) -> None:
            failed = future.cancelled() or future.exception() is not None
            for n, one in enumerate(pending):
                one.lease.syncing = None
                one.event.set()
                if not failed:
                    self._applied(one, *future.result()[n])

        future.add_done_callback(applied)
        await asyncio.shield(future)

    def _applied(self, one: _Pending, held: Decimal, after: Decimal) -> None:
        lease = one.lease
        lease.synced_at = one.at
        lease.spent -= one.spent
        lease.held = to_units(held)
        lease.counted = to_units(after)
        if one.spent and self.crossed is not None:
            charge = spend.Charge(lease.budget_id, "", lease.period_start, lease.limit, ZERO)
            self.crossed(charge, after - one.request.spent, after)

    def _sync(self, requests: list[spend.LeaseSync]) -> list[tuple[Decimal, Decimal]]:
        # One transaction for a tick's syncs; the counters' rows are locked in key order
        # (the tick's), as every worker's tick does, so two ticks cannot deadlock.
        with self.sessions() as session, session.begin():
            return [spend.sync_lease(session, request) for request in requests]

    def _ahead(self, now: float, at: datetime) -> None:
        """A lease for the period about to begin, beside each one in use that ends soon."""
        for lease in list(self.leases.values()):
            ends = lease.ends
            if ends is None or not at < ends <= at + timedelta(seconds=AHEAD_S):
                continue
            key = (lease.budget_id, "", ends)
            if key not in self.leases and now - lease.last_used <= IDLE_S:
                self.leases[key] = Lease(
                    lease.budget_id,
                    ends,
                    lease.limit,
                    ends + (ends - lease.period_start),
                    largest=lease.largest,
                    last_used=lease.last_used,
                )

    async def tick(self, counters: set[str]) -> None:
        """Every slice synced if its spend is due (``SPEND_FLUSH_S`` old or a
        a quarter of it), it runs low, or it went idle; slices of deleted budgets and
        limits forgotten (their counters went with them)."""
        now, at = time.monotonic(), self.clock()
        self._ahead(now, at)
        due: list[Lease] = []
        for key, lease in sorted(self.leases.items()):
            if lease.budget_id not in counters:
                del self.leases[key]
                continue
            want = lease.want(now, at)
            if lease.syncing is None and (
                self._spend_due(lease, now)
                or lease.available * 2 < want  # available < want / 2, in ints
                or lease.held > want + lease.used
                or (lease.held > 0 and now - lease.synced_at > self.hold_ttl.total_seconds() / 3)
            ):
                due.append(lease)
        if due:
            try:
                await self._run([self._begin(lease, 0) for lease in due])
            except DatabaseError:
                # One by one: a slice whose sync fails does not hold the others back.
                for lease in due:
                    if lease.syncing is not None:
                        continue
                    try:
                        await self._run([self._begin(lease, 0)])
                    except DatabaseError as exc:
                        log.warning("lease of %s not synced (%s); retrying", lease.budget_id, exc)
        for key, lease in list(self.leases.items()):
            if self._forgettable(lease):
                del self.leases[key]

    @staticmethod
    def _spend_due(lease: Lease, now: float) -> bool:
        """Whether a slice's spend is to be flushed: the counter then knows it (other
        workers' headers and refusals, the alerts) and a crash cannot lose more of it."""
        return lease.spent > 0 and (
            now - lease.synced_at >= SPEND_FLUSH_S
            or lease.spent * SPEND_SHARES >= lease.held  # spent >= held / SPEND_SHARES
        )

    def _forgettable(self, lease: Lease) -> bool:
        """Whether a slice can be forgotten: nothing held, in flight or unflushed, idle or
        over now (not as of before a sync), and no request waiting on it or its sync. A
        request that took from a slice forgotten under it would settle where the worker
        never flushes (and a new slice of the counter would overwrite its hold)."""
        return (
            lease.held == 0
            and lease.used == 0
            and lease.spent == 0
            and lease.syncing is None
            and lease.waiting == 0
            and lease.want(time.monotonic(), self.clock()) == 0
        )

    async def close(self) -> None:
        """Flush every slice and give back what is not in flight (a gateway stopping)."""
        for lease in self.leases.values():
            lease.last_used = -IDLE_S * 2  # idle: each sync gives its slice back
        for key in list(self.leases):
            try:
                # again: a sync under way (a tick's, begun before the slice went idle above)
                # would keep the slice; this one gives it back.
                await self.sync(key, again=True)
            except DatabaseError as exc:
                log.warning("lease of %s not returned (%s): swept after its TTL", key[0], exc)
