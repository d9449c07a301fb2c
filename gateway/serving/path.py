"""The request path, for every backend: plan, call (with failover), learn, record, respond.

    Context ─▶ backend.plan (body, route or targets: once for all attempts)
            ─▶ failover: attempt 1..n ─▶ backend.send / backend.open
                 a retryable failure (nothing reached the client) is a failed record and
                 the next attempt of the same interaction
            ─▶ backend.learn (routing corrected by the reported cached tokens)
            ─▶ record (priced with the entry in force at the attempt's start; durable)
            ─▶ respond (the upstream's answer, usage billed)

Streams pass through event by event; the usage chunk and ``[DONE]`` go out only once the
stream's record is durable, so a client that saw a stream finish always has its record. A
client that leaves mid-stream gets a ``cancelled`` record with the tokens it had so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from starlette.responses import Response

from gateway.accounting.ledger import Ledger
from gateway.accounting.records import Record, Status
from gateway.errors import BudgetExceeded, KvgateError, RateLimited, UpstreamError
from gateway.serving.admission import FREE, Admission, Admitted
from gateway.serving.backend import Backend, NoUpstream, UpstreamEvents
from gateway.serving.context import NO_EXPECTATION, Attempt, Context, Expectation, Outcome
from gateway.serving.records import record_of
from gateway.serving.replies import COST_HEADERS, cost_headers
from gateway.serving.streaming import EventStream, Trailers

T = TypeVar("T")


class Serving:
    """Serves calls for every deployment through its backend; built once by the app.

    Admission (budgets, rate limits) comes first: a refused request is a ``refused``
    record at no cost; an admitted one's reservation is settled to its records' cost
    before its answer (or a stream's last event) goes out, or when it fails.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        backends: Mapping[str, Backend],
        admission: Admission | None = None,
    ) -> None:
        self.ledger = ledger
        self.admission = admission  # budgets and rate limits, when the app has them
        self.backends = dict(backends)  # deployment name -> its backend

    async def serve(self, ctx: Context) -> Response:
        """Answer one call: the steps of the request path, each a named call."""
        backend = self.backends[ctx.deployment.name]
        admitted = await self.admit(ctx)
        try:
            plan = await backend.plan(ctx)
            if ctx.call.stream:
                attempt, stream = await self.failover(ctx, backend, plan, backend.open, admitted)
                kept: list[Record] = []
                response: Response = EventStream(
                    self.relay(ctx, backend, plan, attempt, stream, admitted, kept),
                    ended=lambda: self.settle_later(admitted),
                    trailers=Trailers(COST_HEADERS, lambda: cost_headers(kept[-1]) if kept else {}),
                )
            else:
                attempt, answer = await self.failover(ctx, backend, plan, backend.send, admitted)
                if not ctx.call.endpoint.billed:  # counting tokens: nothing generated, billed
                    await self.settle(admitted)
                    response = answer.reply(None)
                else:
                    expectation = backend.learn(plan, attempt, answer.outcome)
                    record = await self.keep(ctx, attempt, answer.outcome, expectation, admitted)
                    await self.settle(admitted)
                    response = answer.reply(record)
        except BaseException as error:
            # Released: only what is on record is charged (in a task if this one was
            # cancelled, where awaiting is no longer safe).
            if isinstance(error, asyncio.CancelledError):
                self.settle_later(admitted)
            else:
                await self.settle(admitted)
            if isinstance(error, KvgateError):
                error.headers.update(admitted.headers)
            raise
        if admitted.fields:  # names no reply sets (x-ratelimit-*), lower case: appended
            response.raw_headers.extend(admitted.fields)
        return response

    async def admit(self, ctx: Context) -> Admitted:
        """Budgets and rate limits (none configured: free); a refusal is on record."""
        if self.admission is None:
            return FREE
        try:
            return await self.admission.admit(ctx)
        except (BudgetExceeded, RateLimited) as refusal:
            attempt = Attempt(
                request_id=ctx.request_id,
                number=1,
                upstream="",
                bills_as=ctx.deployment.bills_as,
                policy="",
            )
            await self.keep(ctx, attempt, Outcome.refused(refusal.message))
            raise

    async def settle(self, admitted: Admitted) -> None:
        """The request's holds turned into what its records cost."""
        if self.admission is not None:
            await self.admission.settle(admitted)

    def settle_later(self, admitted: Admitted) -> None:
        """``settle`` where it cannot be awaited (once settled, nothing more happens)."""
        if self.admission is not None:
            self.admission.settle_later(admitted)

    async def failover(
        self,
        ctx: Context,
        backend: Backend,
        plan: Any,
        call: Callable[[Context, Any, Attempt], Awaitable[T]],
        admitted: Admitted = FREE,
    ) -> tuple[Attempt, T]:
        """Attempts until one answers; every failed one is on record.

        A non-streamed attempt is released once it answered; a stream's when it ends.
        """
        number = 0
        while True:
            number += 1
            try:
                attempt = backend.start(ctx, plan, number)
            except NoUpstream as none:
                # Nothing could take it (all replicas down): a failed attempt all the same.
                await self.keep(
                    ctx, none.attempt, Outcome.failed(none.error.message), admitted=admitted
                )
                raise none.error from None
            try:
                result = await call(ctx, plan, attempt)
            except asyncio.CancelledError:
                # The client went (gateway/api/inference.py's _left), or the gateway is
                # stopping: the call is closed, which stops the replica's work, and the
                # attempt is on record (kept from a task: awaiting is no longer safe here).
                backend.release(attempt)
                if ctx.call.endpoint.billed:
                    record = record_of(
                        self.ledger, ctx, attempt, Outcome.left(ctx.call.prompt_chars)
                    )
                    self.ledger.keep_later(record)
                    admitted.add(record)
                raise
            except KvgateError as error:
                backend.release(attempt)
                await self.keep(ctx, attempt, Outcome.failed(error.message), admitted=admitted)
                if not error.retryable:
                    raise
                if not backend.can_retry(plan, attempt):
                    raise backend.exhausted(error) from error
                continue
            if not ctx.call.stream:
                backend.release(attempt)
            return attempt, result

    async def relay(
        self,
        ctx: Context,
        backend: Backend,
        plan: Any,
        attempt: Attempt,
        stream: UpstreamEvents,
        admitted: Admitted = FREE,
        kept: list[Record] | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Pass a stream through; record it (onto ``kept``, for its trailers); then its usage
        chunk and ``[DONE]``."""
        error: UpstreamError | None = None
        started = False
        try:
            async for data in stream.events():
                if not started and stream.first_token_at is not None:
                    started = True
                    backend.first_token(attempt)
                yield data
        except UpstreamError as exc:
            error = exc
        except BaseException:
            # The client went away: the upstream call is closed below, the tokens so far kept.
            outcome = replace(
                stream.outcome(ended=False, error="client disconnected"), status=Status.CANCELLED
            )
            expectation = backend.learn(plan, attempt, outcome)
            record = record_of(self.ledger, ctx, attempt, outcome, expectation)
            self.ledger.keep_later(record)
            admitted.add(record)
            if self.admission is not None:
                self.admission.settle_later(admitted)
            raise
        finally:
            await stream.close()
            backend.release(attempt)
        outcome = stream.outcome(ended=error is None, error=error.message if error else None)
        expectation = backend.learn(plan, attempt, outcome)
        record = await self.keep(ctx, attempt, outcome, expectation, admitted)
        if kept is not None:
            kept.append(record)
        await self.settle(admitted)
        if error is not None:
            yield stream.error_event(error)
            return
        yield stream.ending(record, with_usage=ctx.call.client_wants_usage)

    async def keep(
        self,
        ctx: Context,
        attempt: Attempt,
        outcome: Outcome,
        expectation: Expectation = NO_EXPECTATION,
        admitted: Admitted = FREE,
    ) -> Record:
        """Price and keep the attempt's record (durable before the answer's last byte);
        its cost counts against the request's budgets."""
        record = record_of(self.ledger, ctx, attempt, outcome, expectation)
        if not ctx.call.endpoint.billed:
            return record  # counting tokens, answered or failed: never on record
        # Counted before it is awaited: a client leaving while the record is made durable
        # cancels this task after the journal may already hold it, and its cost must still
        # reach the budget (an unrecordable record is charged all the same: never under).
        admitted.add(record)  # nothing, for a request that holds nothing
        await self.ledger.keep(record)
        return record
