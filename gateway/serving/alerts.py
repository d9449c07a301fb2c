"""Budget alerts: one webhook per budget, threshold and period, sent off the request path.

A threshold crossed is claimed in the database first (``budget_alerts``' key), so exactly
one gateway process sends it, however many saw the spend cross; then POSTed as JSON with
``X-Kvgate-Signature: hex(HMAC-SHA256(server secret, body))``, retried with back-off, and
the delivery status recorded. Each is also a log line and ``kvgate_budget_alerts_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from decimal import Decimal
from typing import Any

import aiohttp
import orjson

from gateway.budgets import Budget, reset_text
from gateway.db import spend
from gateway.db.session import DatabaseError, SessionFactory
from gateway.metrics import Metrics

log = logging.getLogger("kvgate.alerts")
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # waits between the attempts: six in all
TIMEOUT_S = 10.0
ONE = Decimal(1)


def signature(secret: str, body: bytes) -> str:
    """The X-Kvgate-Signature of a webhook body."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def payload(budget: Budget, charge: spend.Charge, threshold: Decimal, spent: Decimal) -> bytes:
    """The webhook's JSON: the budget, its spend and limit, the threshold and the period."""
    _, end = budget.bounds(charge.period_start)
    document: dict[str, Any] = {
        "type": "budget.threshold_crossed",
        "budget": {
            "id": budget.id,
            "scope": str(budget.scope),
            "period": str(budget.period),
            "timezone": budget.timezone,
        },
        "threshold": str(threshold),
        "spend": str(spent),
        "limit": str(budget.limit),
        "period": {
            "kind": str(budget.period),
            "start": charge.period_start.isoformat().replace("+00:00", "Z"),
            "resets": reset_text(end),
        },
        "interaction": charge.subject or None,
    }
    return orjson.dumps(document)


class Alerts:
    """Claims and delivers budget alerts in background tasks."""

    def __init__(
        self,
        *,
        sessions: SessionFactory,
        http: aiohttp.ClientSession,
        secret: str,
        metrics: Metrics | None = None,
        backoff_s: tuple[float, ...] = BACKOFF_S,
    ) -> None:
        self.sessions = sessions
        self.http = http
        self.secret = secret
        self.metrics = metrics
        self.backoff_s = backoff_s
        self._tasks: set[asyncio.Task[None]] = set()

    def crossed(
        self, budget: Budget, charge: spend.Charge, threshold: Decimal, spent: Decimal
    ) -> None:
        """A spend reached ``threshold`` of the limit: alert, once, in the background."""
        task = asyncio.ensure_future(self._alert(budget, charge, threshold, spent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def exhausted(self, budget: Budget, charge: spend.Charge, spent: Decimal) -> None:
        """A budget refused a request: its 100 % alert, if it has one and it is not sent."""
        for threshold in budget.alert_at:
            if threshold == ONE:
                self.crossed(budget, charge, threshold, spent)

    async def _alert(
        self, budget: Budget, charge: spend.Charge, threshold: Decimal, spent: Decimal
    ) -> None:
        status = "pending" if budget.webhook else "no_webhook"
        try:
            mine = await asyncio.to_thread(self._claim, charge, threshold, spent, status)
        except DatabaseError:
            log.exception("budget %s: alert at %s could not be claimed", budget.id, threshold)
            return
        if not mine:
            return
        log.warning(
            "budget %s on %s crossed %s%% of its %s %s limit: spent %s%s",
            budget.id,
            budget.scope,
            threshold * 100,
            budget.period,
            f"{budget.limit.normalize():f}",
            spent,
            f" (interaction {charge.subject})" if charge.subject else "",
        )
        if budget.webhook is None:
            self._count("no_webhook")
            return
        body = payload(budget, charge, threshold, spent)
        headers = {
            "content-type": "application/json",
            "x-kvgate-signature": signature(self.secret, body),
        }
        error: str | None = None
        attempts = 0
        for wait in (*self.backoff_s, None):
            attempts += 1
            error = await self._post(budget.webhook, body, headers)
            if error is None or wait is None:
                break
            await asyncio.sleep(wait)
        outcome = "delivered" if error is None else "failed"
        if error is not None:
            log.error("budget %s: alert at %s not delivered: %s", budget.id, threshold, error)
        self._count(outcome)
        try:
            await asyncio.to_thread(self._mark, charge, threshold, outcome, attempts, error)
        except DatabaseError:
            log.exception("budget %s: alert delivery status not recorded", budget.id)

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        """None once the webhook answered 2xx; else what went wrong."""
        try:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
            async with self.http.post(url, data=body, headers=headers, timeout=timeout) as reply:
                await reply.read()
                return None if 200 <= reply.status < 300 else f"HTTP {reply.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def _claim(self, charge: spend.Charge, threshold: Decimal, spent: Decimal, status: str) -> bool:
        with self.sessions() as session, session.begin():
            return spend.claim_alert(session, charge, threshold, spent, status)

    def _mark(
        self,
        charge: spend.Charge,
        threshold: Decimal,
        status: str,
        attempts: int,
        error: str | None,
    ) -> None:
        with self.sessions() as session, session.begin():
            spend.mark_alert(
                session, charge, threshold, status=status, attempts=attempts, error=error
            )

    def _count(self, status: str) -> None:
        if self.metrics is not None:
            self.metrics.budget_alerts.labels(status).inc()

    async def stop(self) -> None:
        """Cancel deliveries still under way (their alerts stay recorded as pending)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
