"""The fleets of the vLLM deployments: routing's configuration built from the deployments
file, and the tokenizer each names, loaded once at start.

Routing takes only plain values (`gateway.routing.fleet_config.FleetConfig`) and an
injected tokenizer; this is where the deployments file becomes those. Light to import:
``kvgate serve`` checks the deployments with it before any worker starts.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.config import SIM_TOKENIZER, ConfigError, Deployment, ProviderDeployment
from gateway.routing.fleet_config import (
    FleetConfig,
    FleetConfigError,
    KvEventSource,
    tier_weights,
    tunables,
)
from gateway.routing.inputs import PromptTokenizer


def fleet_configs(
    deployments: Iterable[Deployment | ProviderDeployment],
) -> dict[str, FleetConfig]:
    """Routing's configuration of each vLLM deployment; what routing refuses (a tunable
    it does not know, a value out of range) is a ConfigError that names the model."""
    configs = {}
    for d in deployments:
        if not isinstance(d, Deployment):
            continue
        urls = d.replica_urls
        try:
            configs[d.name] = FleetConfig(
                name=d.name,
                replicas=urls,
                upstream_model=d.upstream_model,
                policy=d.policy,
                tunables=tunables(d.tunables, model=d.name),
                block_size=d.block_size,
                capacity_blocks=d.capacity_blocks,
                max_num_seqs=d.max_num_seqs,
                tokenizer=d.tokenizer,
                kv_events=tuple(
                    KvEventSource(url, e.endpoint, e.replay_endpoint, e.topic)
                    for url, e in zip(urls, d.kv_events, strict=True)
                )
                if d.kv_events
                else (),
                hash_seed=d.hash_seed,
                cpu_blocks=d.cpu_blocks,
                disk_blocks=d.disk_blocks,
                tier_weights=tier_weights(d.tier_weights, model=d.name),
                prediction_ttl_s=d.prediction_ttl_s,
            )
        except FleetConfigError as exc:
            raise ConfigError(str(exc)) from None
    return configs


def prompt_tokenizer(spec: str | None) -> PromptTokenizer | None:
    """The tokenizer a deployment names, loaded once: none (text mode), the simulated
    replica's, or a model directory's (tokenizer.json and chat template)."""
    if spec is None:
        return None
    if spec == SIM_TOKENIZER:
        # The simulated replicas' own tokenizer (tests, the demo).
        from gateway.routing.sim_tokenizer import SimTokenizer

        return SimTokenizer()
    from gateway.routing.tokens import ChatTokenizer  # jinja2 and tokenizers: only if used

    return ChatTokenizer.load(spec)
