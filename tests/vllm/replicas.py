"""Helpers for tests that look at the replicas themselves: their counters, their tokens,
and their KV event streams."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

import zmq

from gateway.routing.kv_wire import END_SEQ, read_seq, seq_bytes
from gateway.routing.load import parse_metrics
from gateway.routing.vllm_blocks import BlockHashing
from tests.support.vllm import BLOCK_SIZE, SERVED_NAME

_VOCABULARY = (
    "cache block token prefix model replica gateway router tenant salt hash chain queue "
    "batch decode prefill stream chunk usage price cost ledger record window context "
    "prompt answer signal vector matrix kernel memory latency budget invoice statement "
    "rate hit miss evict reuse warm cold fast steady exact simple quiet bright river "
    "stone cloud field orbit harbor lantern meadow summit thread anchor beacon"
)


def text(seed: int, words: int) -> str:
    """Deterministic prose over words both tokenizers know: about one token a word."""
    vocabulary = _VOCABULARY.split()
    step = seed % 5 + 1
    return " ".join(vocabulary[(seed * 7 + i * step) % len(vocabulary)] for i in range(words))


def prefix_cache_hits(urls: Sequence[str]) -> int:
    """Σ vllm:prefix_cache_hits_total over the replicas (tokens served from cache)."""
    total = 0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
            total += parse_metrics(reply.read().decode(), model=SERVED_NAME).prefix_cache_hits
    return total


def replica_tokens(
    url: str, messages: list[dict[str, Any]] | None = None, *, prompt: str | None = None
) -> list[int]:
    """The prompt tokens the replica itself computes for a chat or a prompt (/tokenize)."""
    request_body: dict[str, Any] = {"model": SERVED_NAME}
    if messages is not None:
        request_body["messages"] = messages
    else:
        request_body["prompt"] = prompt
    body = json.dumps(request_body).encode()
    request = urllib.request.Request(
        url + "/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return list(json.loads(reply.read())["tokens"])


def block_keys(tokens: Sequence[int], salt: str | None = None) -> list[int]:
    """The blocks of ``tokens`` as the replica's KV events name them."""
    return BlockHashing().keys(tokens, BLOCK_SIZE, salt)


def replay_all(replay_endpoint: str, timeout_ms: int = 5000) -> list[tuple[int, bytes]]:
    """Every KV event batch the replica still buffers, asked of its replay socket."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    batches: list[tuple[int, bytes]] = []
    try:
        dealer.send_multipart((b"", seq_bytes(0)))
        while True:
            if not dealer.poll(timeout_ms):
                raise AssertionError(f"no replay answer from {replay_endpoint}")
            _, _, raw_seq, payload = dealer.recv_multipart()
            if raw_seq == END_SEQ:
                return batches
            batches.append((read_seq(raw_seq), payload))
    finally:
        dealer.close(linger=0)
        context.term()


def published(replay_endpoint: str) -> int:
    """How many KV event batches the replica has published."""
    batches = replay_all(replay_endpoint)
    return batches[-1][0] + 1 if batches else 0


def gateway_metric(gateway_url: str, name: str, model: str, replica_url: str) -> float | None:
    """One per-replica gauge from the gateway's /metrics."""
    with urllib.request.urlopen(gateway_url + "/metrics", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    wanted = f'{name}{{model="{model}",replica="{replica_url}"}} '
    for line in lines:
        if line.startswith(wanted):
            return float(line[len(wanted) :])
    return None


def settle(
    gateway_url: str, model: str, replicas: Sequence[tuple[str, str]], timeout_s: float = 15.0
) -> None:
    """Wait until the gateway has applied every KV event batch its replicas published.

    ``replicas`` are (url, replay endpoint) pairs. A prediction made before then would
    race the previous request's events, which is timing, not the router's model.
    """
    deadline = time.monotonic() + timeout_s
    for url, replay in replicas:
        target = published(replay)
        while gateway_metric(gateway_url, "kvgate_replica_kv_events_applied", model, url) != target:
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not apply {url}'s {target} batches")
            time.sleep(0.02)
