"""uvicorn's httptools protocol with limits on what a client holds before it is served.

Everything here happens before authentication, so it is what an anonymous client can
make the gateway hold. uvicorn bounds none of it: a connection that never finishes its
request head is kept forever, the head may grow without end (httptools buffers it), and
a body shorter than its Content-Length waits forever. Per connection:

- a request head must be complete within ``header_timeout_s`` of the connection (or, on
  a kept-alive connection, of its first byte), and within ``max_header_bytes``: past the
  time a 408, past the size a 431 (a connection that sent nothing is closed silently);
- a body must be complete within ``body_timeout_s`` of its head: past it, a 408, and
  the handler reading it sees the client gone;
- past ``max_connections`` open connections a new one is answered a 503 (OpenAI's error
  shape, ``retry-after``) as soon as its first bytes arrive, and closed: it is never
  parsed, never reaches the app, and holds its descriptor for a moment only.

Every answer here is written straight to the socket and ends the connection: the answer
and a FIN, then what the client still sends is dropped until it closes (``LINGER_S`` at
most), so that a reset never drops the answer in flight. Deadlines that pass together (a
client that opened its connections all at once) are cut a few at a turn of the loop
(``Reaper``): one turn cutting thousands would stall every request in flight. The cost
on the hot path is one timer per connection (armed when it opens, cancelled when it
closes) and, per request, two comparisons and a clock read: a request that arrives in
one read, as almost all do, arms no timer of its own.

A client that goes away while its request is being answered is told to the app: a
handler that wants to know puts a callable in its scope under ``LEAVING`` (the vLLM path
does, to stop the replica's work on a whole answer nobody will read), and the connection's
loss calls it. Nothing is watched otherwise: no task, no timer per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from gateway.errors import error_body
from gateway.server.trailers import TRAILERS, TrailingCycle

log = logging.getLogger("kvgate.connections")

# The scope key of what to call when the client goes before its answer is complete (the
# same key as gateway/serving/streaming.py's LEAVING: the handlers set it; named in the
# scope's extensions so that they know this server calls it).
LEAVING = "kvgate.leaving"
GONE = "kvgate.gone"  # set in the scope when its client went (before LEAVING is called)
TALLY_WINDOW_S = 10.0
REFUSED_LINGER_S = 1.0  # how long an over-the-cap connection may take to send its first bytes

# What the parser is waiting for on a connection.
_HEAD, _BODY, _IDLE, _CUT = 0, 1, 2, 3
# A cut connection's answer goes out with a FIN, and what the client still sends is read
# and dropped for this long: closing over unread bytes resets the connection, and a reset
# drops the answer in flight (nginx's "lingering close"); a client that keeps sending past
# LINGER_BYTES is closed on at once (it is flooding, not finishing a request).
LINGER_S = 2.0
LINGER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may hold before it is served (KVGATE_* settings)."""

    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_connections: int


def _answer(status: str, message: str, code: str, type_: str, *extra: bytes) -> bytes:
    """A whole HTTP response that closes the connection, with an OpenAI-style error body."""
    body = error_body(message, type_, code=code)
    head = [
        b"HTTP/1.1 " + status.encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
        *extra,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Answers:
    """The responses written straight to a socket, rendered once for the limits."""

    def __init__(self, limits: Limits) -> None:
        invalid = "invalid_request_error"
        self.header_timeout = _answer(
            "408 Request Timeout",
            f"the request head was not received within {limits.header_timeout_s:g} s",
            "request_timeout",
            invalid,
        )
        self.body_timeout = _answer(
            "408 Request Timeout",
            f"the request body was not received within {limits.body_timeout_s:g} s",
            "request_timeout",
            invalid,
        )
        self.header_too_large = _answer(
            "431 Request Header Fields Too Large",
            f"the request head exceeds {limits.max_header_bytes} bytes",
            "request_header_fields_too_large",
            invalid,
        )
        self.over_capacity = _answer(
            "503 Service Unavailable",
            f"the gateway has {limits.max_connections} connections open, its limit; retry shortly",
            "too_many_connections",
            "service_unavailable",
            b"retry-after: 1",
        )


class Tally:
    """Connections cut, by reason: logged once per window, not once per connection."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._scheduled = False

    def add(self, loop: asyncio.AbstractEventLoop, reason: str) -> None:
        """Count a connection cut for ``reason``; the first of a window schedules its flush."""
        self.counts[reason] += 1
        if not self._scheduled:
            self._scheduled = True
            loop.call_later(TALLY_WINDOW_S, self.flush)

    def flush(self) -> None:
        """Log what was cut since the last flush."""
        self._scheduled = False
        if self.counts:
            said = ", ".join(f"{n} {reason}" for reason, n in sorted(self.counts.items()))
            log.warning("connections cut in the last %g s: %s", TALLY_WINDOW_S, said)
            self.counts.clear()


# Connections past their deadline are cut CUTS_PER_TURN every REAP_PAUSE_S (800 a second),
# or, with more waiting, a share of them (1/REAP_SHARE: a backlog halves within about 1.4
# s, whatever its size). A cut, with the client's next connection that follows it, costs
# the loop 0.1-0.2 ms: a wave of 2,000 then takes a fifth of the loop's time for about 3 s
# instead of all of it for half a second.
CUTS_PER_TURN = 4
REAP_SHARE = 400
REAP_PAUSE_S = 0.005


class Reaper:
    """Connections whose deadline has passed, cut a few at a time (see CUTS_PER_TURN)."""

    def __init__(self) -> None:
        self._waiting: deque[GuardedProtocol] = deque()
        self._scheduled = False

    def add(self, loop: asyncio.AbstractEventLoop, protocol: GuardedProtocol) -> None:
        """Have ``protocol`` look at its deadline again, and act on it, at the next turn."""
        self._waiting.append(protocol)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._turn, loop)

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = self._waiting
        for _ in range(max(CUTS_PER_TURN, len(waiting) // REAP_SHARE)):
            if not waiting:
                break
            waiting.popleft()._reap()
        if waiting:
            loop.call_later(REAP_PAUSE_S, self._turn, loop)
        else:
            self._scheduled = False


class _Stop(Exception):
    """Raised from a parser callback to stop parsing a connection already answered."""


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with header and body deadlines, a head size limit and a
    connection cap (see the module docstring). ``config`` carries ``limits``,
    ``answers`` and ``tally`` (gateway.server.GatewayConfig)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits: Limits = config.limits  # type: ignore[attr-defined]
        self.answers: Answers = config.answers  # type: ignore[attr-defined]
        self.tally: Tally = config.tally  # type: ignore[attr-defined]
        self.reaper: Reaper = config.reaper  # type: ignore[attr-defined]
        self._phase = _HEAD
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._head_bytes = 0  # received while the current head is incomplete
        self._chunk = 0  # size of the read being parsed
        self._answered = False  # we wrote the last word on this connection
        self._refusing = False
        self._rechecked = False  # an idle deadline looked again after one more poll

    # -- connection -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Serve a new connection, timing its head; over the cap, refuse it instead."""
        if len(self.connections) >= self.limits.max_connections:
            self._refusing = True
            self.transport = transport
            self._timer = self.loop.call_later(REFUSED_LINGER_S, self._close_refused)
            return
        super().connection_made(transport)
        self._deadline = self.loop.time() + self.limits.header_timeout_s
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        """Cancel the deadline timer; a served connection's loss goes on to uvicorn, and to
        the handler of an answer still under way that asked to know (``LEAVING``)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._refusing:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.scope[GONE] = True  # type: ignore[literal-required]
            leaving: Callable[[], None] | None = cycle.scope.get(LEAVING)  # type: ignore[assignment]
            if leaving is not None:
                leaving()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser (a refused connection is answered instead); a head too large is cut."""
        if self._refusing:
            self._refuse()
            return
        if self._phase == _CUT:  # answered and half-closed: read only to be dropped
            self._head_bytes += len(data)
            if self._head_bytes > LINGER_BYTES:
                self.transport.close()
            return
        self._unset_keepalive_if_required()
        self._chunk = len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._answered:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return
        if self._phase == _HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._cut(self.answers.header_too_large, "header too large")
                return
            self._watch()
        elif self._phase == _BODY:
            self._watch()

    # -- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A head begins: measure it anew, and time it (the first from the connection)."""
        super().on_message_begin()
        self.scope["extensions"] = {TRAILERS: {}, LEAVING: {}}
        if self._phase != _HEAD:  # the first head is timed from the connection
            self._phase = _HEAD
            self._deadline = self.loop.time() + self.limits.header_timeout_s
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        """The head is whole: cut it if too large, else time the body."""
        limit = self.limits.max_header_bytes
        # Only a head that could be too large is measured (the reads so far bound it).
        if self._head_bytes + self._chunk > limit and self._head_size() > limit:
            self._cut(self.answers.header_too_large, "header too large")
            raise _Stop
        self._phase = _BODY
        self._deadline = self.loop.time() + self.limits.body_timeout_s
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The request is read: no deadline until the next head begins."""
        self._phase = _IDLE
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Serve the request with a cycle that can end a response with trailers."""
        cycle.__class__ = TrailingCycle  # the same object, one method more (trailers.py)
        super()._start_asgi_task(cycle, app)

    # -- deadlines ------------------------------------------------------------------------

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _watch(self) -> None:
        """Have the timer fire by the current deadline (one timer, moved only earlier)."""
        if self._timer is None or self._timer_at > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_at(self._deadline, self._expire)
            self._timer_at = self._deadline

    def _expire(self) -> None:
        self._timer = None
        if self._phase == _IDLE or self.transport.is_closing():
            return
        if self.loop.time() < self._deadline - 0.001:  # a later head or body: wait for it
            self._watch()
            return
        self.reaper.add(self.loop, self)

    def _reap(self) -> None:
        """Past the deadline (the reaper's turn): cut the connection, unless it has since
        finished what it was timed for or gone."""
        if self._timer is not None or self._phase in (_IDLE, _CUT) or self.transport.is_closing():
            return
        if self.loop.time() < self._deadline - 0.001:  # a new head or body since: its own
            self._watch()
            return
        if self._phase == _BODY:
            self._cut(self.answers.body_timeout, "body timeout")
        elif self._head_bytes:
            self._cut(self.answers.header_timeout, "header timeout")
        elif not self._rechecked:
            # Nothing heard yet, but the loop may have been too busy to read what has come:
            # timers run before the poll, so look once more after the next one.
            self._rechecked = True
            self._timer = self.loop.call_later(0, self._expire)
        else:  # nothing sent since the connection (or the last answer): nothing to say
            self._cut(b"", "idle timeout")

    def _cut(self, answer: bytes, reason: str) -> None:
        """Answer (unless a response has begun) and close; a handler waiting for the body
        sees the client gone."""
        self._answered = True
        self.tally.add(self.loop, reason)
        cycle = self.cycle
        # A response under way, or this request's own already sent: no second one.
        if (
            cycle is not None
            and cycle.response_started
            and (not cycle.response_complete or self._phase == _BODY)
        ):
            answer = b""
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        if answer and self.transport.can_write_eof():
            self.transport.write(answer)
            self.transport.write_eof()  # the client reads the answer, then closes: we close
            self._phase, self._head_bytes = _CUT, 0
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(LINGER_S, self.transport.close)
            return
        if answer:
            self.transport.write(answer)
        self.transport.close()

    # -- over the cap ---------------------------------------------------------------------

    def _refuse(self) -> None:
        # Answered once its request has been read, so that closing resets nothing unread.
        if not self.transport.is_closing():
            self.tally.add(self.loop, "refused over the connection cap")
            self.transport.write(self.answers.over_capacity)
            self.transport.close()

    def _close_refused(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.tally.add(self.loop, "refused over the connection cap")
            self.transport.close()
