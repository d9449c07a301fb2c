"""Failed sign-ins, counted per client for the whole dashboard server.

One ``Throttle`` serves every browser session of the Streamlit process, so a client that
opens new sessions (or new websockets) is still the same client. A client is its address,
as the server saw it (``kvgate dashboard`` lets uvicorn believe X-Forwarded-For only from
``KVGATE_DASHBOARD_TRUSTED_PROXIES``); an IPv6 client is its /64, the block one host
usually holds. Time is passed in (monotonic seconds).

The rule: ``max_failures`` failures in a row from a client lock it for ``lockout_s``;
each failure after that (a guess once the lock has run out) locks it again for twice as
long, up to ``MAX_LOCKOUT_S``. While locked, a guess is not even compared: the correct
password is refused too, so guessing faster gains nothing. A success forgets the client;
so does a day without failures.
"""

from __future__ import annotations

import ipaddress
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_LOCKOUT_S = 3600.0
FORGET_S = 86_400.0
# Bounds the memory an attacker with many addresses can make the server hold (about
# 150 bytes each); past it the client whose last failure is oldest is forgotten first.
MAX_CLIENTS = 100_000


@dataclass(frozen=True, slots=True)
class Verdict:
    """One sign-in attempt's outcome: signed in, or not and locked for how long."""

    accepted: bool
    # Seconds until this client may try again (0: it may try now).
    locked_for_s: float
    # False: the client was locked, so the guess was not looked at.
    compared: bool = True


@dataclass(slots=True)
class _Failures:
    count: int
    last_at: float
    locked_until: float


def client_of(address: str | None) -> str:
    """The throttled unit for a peer address: the address, or an IPv6 address's /64."""
    if not isinstance(address, str):
        return "local"  # Streamlit reports loopback peers as no address
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Throttle:
    """Failed sign-ins per client; every check and its count happen under one lock."""

    def __init__(
        self, *, max_failures: int, lockout_s: float, max_clients: int = MAX_CLIENTS
    ) -> None:
        self.max_failures = max_failures
        self.lockout_s = lockout_s
        self.max_clients = max_clients
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, _Failures] = OrderedDict()

    def attempt(self, client: str, check: Callable[[], bool], *, now: float) -> Verdict:
        """Run ``check`` (the password comparison) unless ``client`` is locked; count it."""
        with self._lock:
            failures = self._current(client, now)
            if failures is not None and failures.locked_until > now:
                return Verdict(False, failures.locked_until - now, compared=False)
            if check():
                self._clients.pop(client, None)
                return Verdict(True, 0.0)
            failures = failures or _Failures(0, now, now)
            failures.count += 1
            failures.last_at = now
            beyond = failures.count - self.max_failures
            if beyond >= 0:
                lock = min(self.lockout_s * 2.0**beyond, MAX_LOCKOUT_S)
                failures.locked_until = now + lock
            self._clients[client] = failures
            self._clients.move_to_end(client)
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
            return Verdict(False, max(failures.locked_until - now, 0.0))

    def locked_for(self, client: str, *, now: float) -> float:
        """Seconds until ``client`` may try again (0: now)."""
        with self._lock:
            failures = self._current(client, now)
            return 0.0 if failures is None else max(failures.locked_until - now, 0.0)

    def _current(self, client: str, now: float) -> _Failures | None:
        failures = self._clients.get(client)
        if failures is not None and now - failures.last_at > FORGET_S:
            del self._clients[client]
            return None
        return failures
