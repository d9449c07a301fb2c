"""Time the routing hot path for one long prompt: block hashing, index match, choose().

A 32,000-token prompt (~128,000 characters of chat, text mode, 64-character chunks) over
16 replicas whose index holds 2,000 chunks each; one replica holds three quarters of the
prompt, the others only its first chunks, so the index walk is as long as it gets in
practice. Prints median and p99 per stage and for the whole path, over many runs; last,
the gateway's own `Fleet` (route + place + finish: hashing, the ceiling, the shared
placement code with its views and the index's record of the placement), as built for
text mode, and for exact mode with tiers: the same holdings announced by KV events, the
long match held in host memory (its fetch priced block by block), and each placement
predicted on route.

    PYTHONPATH=. .venv/bin/python benchmarks/routing_choose.py
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable

from gateway.routing.blocks import DEFAULT_CHUNK_CHARS, render_chat, root_hash, text_block_hashes
from gateway.routing.fleet import Fleet
from gateway.routing.fleet_config import FleetConfig
from gateway.routing.index import ApproximateIndex
from gateway.routing.inputs import ChatPrompt
from gateway.routing.policy import ReplicaView, RouteRequest, choose

REPLICAS = 16
PROMPT_CHARS = 128_000
RUNS = 2_000
WARMUP = 100


def prompt() -> list[dict[str, str]]:
    """A long conversation: a system prompt and turns of random words, ~128,000 chars."""
    rng = random.Random(3)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(5000)]
    messages = [{"role": "system", "content": "You are a careful assistant. " * 40}]
    size = len(messages[0]["content"])
    turn = 0
    while size < PROMPT_CHARS:
        text = " ".join(rng.choices(words, k=800))
        messages.append({"role": "user" if turn % 2 == 0 else "assistant", "content": text})
        size += len(text)
        turn += 1
    return messages


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] / 1000


def timed(label: str, fn: Callable[[], object]) -> None:
    for _ in range(WARMUP):
        fn()
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    print(f"| {label} | {percentile(samples, 50):,.1f} | {percentile(samples, 99):,.1f} |")


def main() -> None:
    messages = prompt()
    root = root_hash("llama-3.1-8b", "tenant-salt")
    text = render_chat(messages)
    hashes = text_block_hashes(text, chunk_chars=DEFAULT_CHUNK_CHARS, root=root)
    names = [f"replica-{i}" for i in range(REPLICAS)]
    index = ApproximateIndex(capacity_blocks=4_000)
    rng = random.Random(5)
    for i, name in enumerate(names):
        index.record(name, [rng.getrandbits(64) for _ in range(2_000)])
        # Every replica has the system prompt; replica 3 has three quarters of this prompt.
        index.record(name, hashes[: len(hashes) * 3 // 4] if i == 3 else hashes[:30])
    loads = [(rng.randint(0, 8), rng.randint(0, 40_000), rng.randint(0, 30)) for _ in names]
    prompt_tokens = len(text) // 4

    def route() -> int:
        chain = text_block_hashes(render_chat(messages), chunk_chars=DEFAULT_CHUNK_CHARS, root=root)
        found = index.match_all(chain)
        views = [
            ReplicaView(name, found.get(name, 0), in_flight, queued, running)
            for name, (in_flight, queued, running) in zip(names, loads, strict=True)
        ]
        request = RouteRequest(
            seq=1, key=7, interaction=7, prompt_tokens=prompt_tokens, block_tokens=16
        )
        return choose("kv-aware", request, views)

    views = [
        ReplicaView(name, index.match(name, hashes), *load)
        for name, load in zip(names, loads, strict=True)
    ]
    request = RouteRequest(
        seq=1, key=7, interaction=7, prompt_tokens=prompt_tokens, block_tokens=16
    )
    print(
        f"prompt: {len(text):,} characters, {len(hashes):,} blocks of {DEFAULT_CHUNK_CHARS} "
        f"characters, ~{prompt_tokens:,} tokens; {REPLICAS} replicas; {RUNS:,} runs\n"
    )
    print("| stage | median (µs) | p99 (µs) |")
    print("| --- | --- | --- |")
    timed("render_chat", lambda: render_chat(messages))
    timed(
        "text_block_hashes",
        lambda: text_block_hashes(text, chunk_chars=DEFAULT_CHUNK_CHARS, root=root),
    )
    timed("index.match_all", lambda: index.match_all(hashes))
    for policy in ("kv-aware", "least-loaded", "session", "round-robin"):
        timed(f"choose({policy})", lambda p=policy: choose(p, request, views))
    timed("whole path (render + hash + match + views + choose)", route)
    fleet = gateway_fleet(messages)

    def place() -> str:
        routed = fleet.route(
            ChatPrompt(messages), cache_salt="tenant-salt", request_id="r", interaction_id="i"
        )
        placement = fleet.place(routed)
        fleet.finish(placement)
        return placement.replica.name

    timed("the gateway's Fleet: route + place + finish", place)
    tiered = gateway_fleet(messages, exact=True)

    def place_tiered() -> str:
        routed = tiered.route(
            ChatPrompt(messages), cache_salt="tenant-salt", request_id="r", interaction_id="i"
        )
        placement = tiered.place(routed)
        tiered.finish(placement)
        return placement.replica.name

    timed("the Fleet, exact mode, the long match in host memory", place_tiered)
    print(
        f"\nchosen: {names[route()]}; by the Fleet: {place()}; exact and tiered: {place_tiered()}"
    )


def gateway_fleet(messages: list[dict[str, str]], *, exact: bool = False) -> Fleet:
    """The live fleet over the same 16 replicas, its index filled the same way: learned
    (text mode), or announced by KV events with replica 3's long match in host memory."""
    urls = tuple(f"http://10.0.0.{i}:8000" for i in range(REPLICAS))
    config = FleetConfig(
        name="m", replicas=urls, upstream_model="llama-3.1-8b", capacity_blocks=4_000
    )
    fleet = Fleet(config)
    hashes = fleet.route(
        ChatPrompt(messages), cache_salt="tenant-salt", request_id="r", interaction_id="i"
    ).prompt.hashes
    rng = random.Random(5)
    for i, url in enumerate(urls):
        other = [rng.getrandbits(64) for _ in range(2_000)]
        held = hashes[: len(hashes) * 3 // 4] if i == 3 else hashes[:30]
        if exact:
            fleet.index.set_fresh(url, True)
            fleet.index.block_stored(url, other, medium="GPU")
            fleet.index.block_stored(url, held, medium="CPU" if i == 3 else "GPU")
        else:
            fleet.index.record(url, other)
            fleet.index.record(url, held)
    return fleet


if __name__ == "__main__":
    main()
