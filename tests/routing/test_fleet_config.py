"""The deployments file becomes routing's plain configuration at start: names the two
agree on, values routing refuses said with the model's name, and `kvgate serve` refusing
to start on them."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from gateway import config
from gateway.config import ConfigError, Deployment, ProviderDeployment
from gateway.routing.fleet import Fleet
from gateway.routing.fleet_config import FleetConfig, FleetConfigError, KvEventSource
from gateway.routing.policy import POLICIES, Tunables
from gateway.routing.prompts import SIM_TOKENIZER
from gateway.routing.sim_tokenizer import SimTokenizer
from gateway.serving.fleets import fleet_configs, prompt_tokenizer
from tests.factories import config_file
from tests.support.processes import kvgate

URLS = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")


def deployment(**fields: object) -> Deployment:
    return Deployment.model_validate({"name": "m", "replicas": list(URLS), **fields})


def test_the_deployments_file_knows_routings_policy_and_tokenizer_names() -> None:
    assert get_args(config.Policy) == POLICIES
    assert config.SIM_TOKENIZER == SIM_TOKENIZER


def test_a_deployment_becomes_its_fleet_config() -> None:
    d = deployment(
        upstream_model="served",
        policy="least-loaded",
        tunables={"load_weight": 0.5},
        block_size=32,
        capacity_blocks=100,
        max_num_seqs=8,
        tokenizer="kvgate-sim",
        kv_events=[{"endpoint": "tcp://127.0.0.1:5557", "topic": "kv"}, {"endpoint": "tcp://h:1"}],
        hash_seed="0",
    )
    hosted = ProviderDeployment(name="hosted", backend="litellm", litellm_model="openai/gpt-4o")
    configs = fleet_configs([d, hosted])
    assert configs == {
        "m": FleetConfig(
            name="m",
            replicas=URLS,
            upstream_model="served",
            policy="least-loaded",
            tunables=Tunables(load_weight=0.5),
            block_size=32,
            capacity_blocks=100,
            max_num_seqs=8,
            tokenizer="kvgate-sim",
            kv_events=(
                KvEventSource(URLS[0], "tcp://127.0.0.1:5557", None, "kv"),
                KvEventSource(URLS[1], "tcp://h:1", None, ""),
            ),
            hash_seed="0",
        )
    }
    assert configs["m"].served_name == "served"


def test_max_num_seqs_defaults_to_vllms_and_becomes_every_replicas_capacity() -> None:
    assert deployment().max_num_seqs == FleetConfig("m", URLS).max_num_seqs == 256
    fleet = Fleet(fleet_configs([deployment(max_num_seqs=12)])["m"])
    assert [r.capacity for r in fleet.replicas] == [12, 12]


@pytest.mark.parametrize(
    ("tunables", "message"),
    [
        (
            {"load_wieght": 0.5},
            "model 'm': unknown tunable 'load_wieght'; known: load_weight, running_tokens, "
            "imbalance_factor, imbalance_floor_tokens, affinity_factor, affinity_floor_tokens",
        ),
        ({"load_weight": 2.0}, "model 'm': tunables: load_weight must be within [0, 1]"),
        ({"imbalance_factor": 0.5}, "model 'm': tunables: imbalance_factor must be at least 1"),
    ],
)
def test_tunables_routing_refuses_are_a_config_error_naming_the_model(
    tunables: dict[str, float], message: str
) -> None:
    d = deployment(tunables=tunables)  # the file's own check: a mapping of numbers
    with pytest.raises(ConfigError) as refused:
        fleet_configs([d])
    assert str(refused.value) == message


def test_the_deployments_file_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValidationError, match="'kv-aware', 'round-robin'"):
        deployment(policy="psychic")


def test_routing_refuses_what_it_cannot_use() -> None:
    with pytest.raises(FleetConfigError, match="policy must be one of"):
        FleetConfig("m", URLS, policy="psychic")
    with pytest.raises(FleetConfigError, match="max_num_seqs must be at least 1"):
        FleetConfig("m", URLS, max_num_seqs=0)
    with pytest.raises(FleetConfigError, match="one entry per replica"):
        FleetConfig("m", URLS, kv_events=(KvEventSource(URLS[1], "tcp://h:1"),))


def test_a_token_mode_fleet_needs_its_tokenizer_handed_in() -> None:
    sim = FleetConfig("m", URLS, tokenizer="kvgate-sim")
    with pytest.raises(ValueError, match="tokenizer 'kvgate-sim' configured, none given"):
        Fleet(sim)
    assert isinstance(prompt_tokenizer("kvgate-sim"), SimTokenizer)
    assert prompt_tokenizer(None) is None
    assert Fleet(sim, tokenizer=SimTokenizer()).hasher.exact


def test_serve_refuses_to_start_on_a_tunable_routing_does_not_know(tmp_path: Path) -> None:
    path = config_file(
        tmp_path / "kvgate.yaml",
        [{"name": "m", "replicas": list(URLS), "tunables": {"load_wieght": 0.5}}],
    )
    done = kvgate("serve", "--config", str(path), check=False)
    assert done.returncode == 2
    assert "error: model 'm': unknown tunable 'load_wieght'" in done.stderr
