"""Replicas of one deployment: health, in-flight load, and the choice of one per request."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from gateway.config import Deployment
from gateway.errors import UpstreamUnavailable


@dataclass(slots=True)
class Replica:
    url: str
    in_flight: int = 0
    down_until: float = 0.0
    failures: int = 0

    def available(self, now: float) -> bool:
        return self.down_until <= now


class Fleet:
    """The replicas behind one model name."""

    def __init__(self, deployment: Deployment, *, cooldown_s: float = 5.0) -> None:
        self.deployment = deployment
        self.cooldown_s = cooldown_s
        self.replicas = [Replica(url) for url in deployment.replica_urls]
        self._sequence = itertools.count()

    def choose(self, *, exclude: frozenset[str] = frozenset()) -> Replica:
        """The next available replica in round-robin order."""
        now = time.monotonic()
        candidates = [r for r in self.replicas if r.url not in exclude and r.available(now)]
        if not candidates:
            raise UpstreamUnavailable(
                f"no healthy replica for model {self.deployment.name!r}; retry shortly"
            )
        return candidates[next(self._sequence) % len(candidates)]

    def has_alternative(self, tried: set[str]) -> bool:
        """Whether an available replica remains that this request has not tried."""
        now = time.monotonic()
        return any(r.url not in tried and r.available(now) for r in self.replicas)

    def mark_down(self, replica: Replica) -> None:
        """Take a replica out after a connect failure; it is retried after the cool-down."""
        replica.failures += 1
        replica.down_until = time.monotonic() + self.cooldown_s

    def mark_up(self, replica: Replica) -> None:
        replica.failures = 0
        replica.down_until = 0.0
