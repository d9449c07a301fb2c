"""Exact mode's configuration: a tokenizer directory and KV events per replica are
checked when the deployments file is read, and a model directory hashes nothing until
the replicas have said how they size and hash blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import Deployment
from gateway.routing.inputs import ChatPrompt
from gateway.routing.load import CacheConfig
from gateway.routing.prompts import PromptHasher
from gateway.routing.tokens import ChatTokenizer
from gateway.routing.vllm_blocks import BlockHashing
from tests.support.tiny_model import build_tiny_model

REPLICAS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
EVENTS = [
    {"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"},
    {"endpoint": "tcp://127.0.0.1:5567"},
]


def test_a_model_directory_and_one_event_source_per_replica_are_accepted(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m")
    deployment = Deployment(
        name="tiny",
        replicas=REPLICAS,
        tokenizer=str(model),  # type: ignore[arg-type]
        kv_events=EVENTS,
    )  # type: ignore[arg-type]
    assert [e.replay_endpoint for e in deployment.kv_events] == ["tcp://127.0.0.1:5558", None]


def test_a_directory_without_a_tokenizer_or_a_short_event_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"tokenizer\.json"):
        Deployment(name="tiny", replicas=REPLICAS, tokenizer=str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="one entry per replica"):
        Deployment(name="tiny", replicas=REPLICAS, kv_events=EVENTS[:1])  # type: ignore[arg-type]


def test_a_model_directory_hashes_once_the_replicas_gave_block_size_and_algorithm(
    tmp_path: Path,
) -> None:
    tokenizer = ChatTokenizer.load(build_tiny_model(tmp_path))
    hasher = PromptHasher(model="tiny", block_size=16, tokenizer=tokenizer, configured=False)
    chat = ChatPrompt([{"role": "user", "content": "cache block token prefix " * 30}])
    before = hasher.prompt(chat, "salt")
    assert before.hashes == [] and before.prompt_tokens > 64
    hasher.configure(CacheConfig(block_size=32, hash_algo="sha256_cbor"))
    after = hasher.prompt(chat, "salt")
    tokens = tokenizer.chat_tokens(chat)
    assert after.hashes == BlockHashing("sha256_cbor").keys(tokens, 32, "salt")
    assert (after.block_tokens, after.prompt_tokens, after.exact) == (32, len(tokens), True)


def test_a_chat_the_template_rejects_is_routed_on_load_alone(tmp_path: Path) -> None:
    tokenizer = ChatTokenizer.load(build_tiny_model(tmp_path))
    hasher = PromptHasher(model="tiny", block_size=32, tokenizer=tokenizer, configured=False)
    hasher.configure(CacheConfig(block_size=32))
    bad = hasher.prompt(ChatPrompt([{"content": "no role"}], chars=40), "s")
    # No blocks, and the load estimate from the prompt's characters (4 per token).
    assert (bad.hashes, bad.exact, bad.prompt_tokens) == ([], False, 10)
