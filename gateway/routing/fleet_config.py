"""A fleet's configuration: plain values, built once at start from the deployments file.

Routing takes this, never the settings or the deployments file themselves; whoever
builds it (the app) turns its own configuration into one, and a value routing refuses
raises `FleetConfigError` with a message that says which and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gateway.routing.policy import DEFAULT_MAX_NUM_SEQS, DEFAULT_TUNABLES, POLICIES, Tunables
from gateway.routing.predicted import DEFAULT_PREDICTION_TTL_S
from gateway.routing.tiers import DEFAULT_TIER_WEIGHTS, TierWeights


class FleetConfigError(ValueError):
    """A fleet configuration that routing cannot use."""


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """Where one replica publishes: its PUB endpoint, replay endpoint and topic."""

    replica: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """The replicas behind one model name, and how requests are routed to them."""

    name: str  # the model name clients use: scope of the ceiling, key of peer messages
    replicas: tuple[str, ...]  # base URLs, in the deployment's order
    upstream_model: str | None = None  # the model name the replicas know, if not ``name``
    policy: str = "kv-aware"
    tunables: Tunables = DEFAULT_TUNABLES
    block_size: int = 16  # the replicas' KV block size, until they say otherwise
    capacity_blocks: int = 2048  # each replica's prefix cache, in blocks: the index's bound
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # sequences a replica runs at once
    # None: text mode; "kvgate-sim" or a model directory: token mode (prompts.py).
    tokenizer: str | None = None
    kv_events: tuple[KvEventSource, ...] = ()  # one per replica, or none
    hash_seed: str | None = None  # the replicas' PYTHONHASHSEED, if they set one
    # Lower tiers each replica keeps evicted blocks in (approximate mode mirrors them;
    # in exact mode the KV events name each block's tier): host memory, then disk.
    cpu_blocks: int = 0
    disk_blocks: int = 0
    tier_weights: TierWeights = DEFAULT_TIER_WEIGHTS  # what a hit in each tier saves
    # How long a placement on a replica followed by KV events is believed before they
    # announce it (predict on route).
    prediction_ttl_s: float = DEFAULT_PREDICTION_TTL_S

    def __post_init__(self) -> None:
        if not self.replicas:
            raise FleetConfigError(f"model {self.name!r}: needs at least one replica")
        if self.policy not in POLICIES:
            raise FleetConfigError(
                f"model {self.name!r}: policy must be one of {', '.join(POLICIES)}, "
                f"not {self.policy!r}"
            )
        for what, value in (
            ("block_size", self.block_size),
            ("capacity_blocks", self.capacity_blocks),
            ("max_num_seqs", self.max_num_seqs),
        ):
            if value < 1:
                raise FleetConfigError(f"model {self.name!r}: {what} must be at least 1")
        if self.cpu_blocks < 0 or self.disk_blocks < 0:
            raise FleetConfigError(f"model {self.name!r}: cpu_blocks and disk_blocks must be >= 0")
        if self.disk_blocks and not self.cpu_blocks:
            raise FleetConfigError(
                f"model {self.name!r}: disk_blocks needs cpu_blocks (the disk keeps what "
                "host memory evicts)"
            )
        if self.prediction_ttl_s <= 0:
            raise FleetConfigError(f"model {self.name!r}: prediction_ttl_s must be positive")
        if self.kv_events and [e.replica for e in self.kv_events] != list(self.replicas):
            raise FleetConfigError(
                f"model {self.name!r}: kv_events needs one entry per replica, in their order"
            )

    @property
    def served_name(self) -> str:
        """The model name the replicas know."""
        return self.upstream_model or self.name

    @property
    def lower_blocks(self) -> tuple[int, ...]:
        """The lower tiers' capacities per replica, host memory first."""
        return tuple(b for b in (self.cpu_blocks, self.disk_blocks) if b)


def _refuse_unknown(kind: type[Any], values: Mapping[str, float], *, model: str, what: str) -> None:
    """Refuse a name that is not one of the dataclass ``kind``'s fields, saying which are."""
    known = [f.name for f in fields(kind)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise FleetConfigError(
            f"model {model!r}: unknown {what} {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(known)}"
        )


def tunables(values: Mapping[str, float], *, model: str) -> Tunables:
    """kv-aware's tunables from a deployment's mapping; a name or value refused is said."""
    _refuse_unknown(Tunables, values, model=model, what="tunable")
    try:
        return Tunables(**values)  # type: ignore[arg-type]  # names checked above
    except ValueError as exc:
        raise FleetConfigError(f"model {model!r}: tunables: {exc}") from None


def tier_weights(values: Mapping[str, float], *, model: str) -> TierWeights:
    """Tier weights from a deployment's mapping (``cpu``, ``storage``); defaults for the
    rest; a name or value refused is said."""
    _refuse_unknown(TierWeights, values, model=model, what="tier weight")
    try:
        return TierWeights(**values)  # names checked above
    except ValueError as exc:
        raise FleetConfigError(f"model {model!r}: {exc}") from None
