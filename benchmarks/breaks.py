"""Time what prefix breakers add to each vLLM request: arrive at plan, measure at learn.

8,000-token prompts (the sim tokenizer's tokens, 16-token blocks: 500 blocks, exact mode,
hashed as the gateway hashes them) from 32 interactions in flight at once on one event loop
(c=32): each task plans (arrive), yields to the others as an upstream call would, then
learns (measure). The LRU is full (4,096 interactions of 8,000 tokens) before timing, so
every arrival also evicts. Three workloads:

- extend   each turn resends the last and appends (no break: the common case)
- break    each turn's system prompt changes in its first block (a break every turn)
- context  like break, for a tenant that keeps break context (renders both prompts)

Prints the added time per request (median, p99 over requests, and the mean from the wall
clock over all of them), beside the hashing the router does anyway for the same prompt.

    PYTHONPATH=. .venv/bin/python benchmarks/breaks.py
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence

from gateway.routing.inputs import ChatPrompt
from gateway.routing.prompts import Prompt, PromptHasher
from gateway.routing.sim_tokenizer import SimTokenizer
from gateway.serving.breaks import BreakWatch, interaction_key, renderer
from gateway.usage import Usage

CONCURRENCY = 32
TURNS = 60  # per interaction, timed
PROMPT_TOKENS = 8_000
LRU = 4096
WORDS = [f"w{n}" for n in range(4000)]


def chat(interaction: int, turn: int, *, broken: bool) -> list[dict[str, str]]:
    """About PROMPT_TOKENS sim tokens: a system prompt, then words; one word more per turn."""
    head = f"T{turn} " if broken else ""
    body = " ".join(WORDS[(interaction * 7 + i) % len(WORDS)] for i in range(PROMPT_TOKENS - 8))
    return [
        {"role": "system", "content": head + "You are the benchmark's assistant."},
        {"role": "user", "content": body + " " + " ".join(["more"] * turn)},
    ]


def prompts(broken: bool) -> list[list[tuple[Prompt, ChatPrompt]]]:
    """Per interaction, its turns' prompts, hashed once up front (the router's work)."""
    hasher = PromptHasher(model="m", block_size=16, tokenizer=SimTokenizer())
    out = []
    for interaction in range(CONCURRENCY):
        turns = []
        for turn in range(TURNS):
            messages = chat(interaction, turn, broken=broken)
            source = ChatPrompt(messages=messages, chars=sum(len(m["content"]) for m in messages))
            turns.append((hasher.prompt(source, "salt"), source))
        out.append(turns)
    return out


async def run(watch: BreakWatch, work: Sequence[Sequence[tuple[Prompt, ChatPrompt]]],
              capture: bool) -> list[int]:  # fmt: skip
    samples: list[int] = []

    async def interaction(number: int) -> None:
        key = interaction_key("tenant", f"chat-{number}")
        for prompt, source in work[number]:
            usage = Usage(uncached_tokens=prompt.prompt_tokens, output_tokens=8)
            started = time.perf_counter_ns()
            arrival = watch.arrive(key, prompt, source if capture else None)
            spent = time.perf_counter_ns() - started
            await asyncio.sleep(0)  # the upstream call: the other 31 run meanwhile
            started = time.perf_counter_ns()
            watch.measure(arrival, usage)
            samples.append(spent + time.perf_counter_ns() - started)

    await asyncio.gather(*(interaction(n) for n in range(CONCURRENCY)))
    return samples


def fill(watch: BreakWatch, prompt: Prompt) -> None:
    """A full LRU: every arrival from now on evicts the oldest interaction."""
    for n in range(LRU):
        watch.arrive(interaction_key("other", str(n)), prompt)


def main() -> None:
    load = os.getloadavg()[0]
    started = time.perf_counter()
    sum(range(30_000_000))
    spent = time.perf_counter() - started
    print(f"machine: load average {load:.2f}; sum(range(3e7)) in {spent:.2f} s")
    extend, broken = prompts(False), prompts(True)
    hasher = PromptHasher(model="m", block_size=16, tokenizer=SimTokenizer())
    source = extend[0][0][1]
    hash_runs = []
    for _ in range(50):
        t = time.perf_counter_ns()
        hasher.prompt(source, "salt")
        hash_runs.append(time.perf_counter_ns() - t)
    blocks = len(extend[0][0][0].hashes)
    print(f"prompt: {extend[0][0][0].prompt_tokens} tokens, {blocks} blocks of 16")
    print(
        f"router's tokenize + hash of it (for scale): median {sorted(hash_runs)[25] / 1e6:.2f} ms"
    )
    print(f"{'workload':<10} {'requests':>8} {'median':>10} {'p99':>10} {'mean':>10}")
    for name, work, capture in (
        ("extend", extend, False),
        ("break", broken, False),
        ("context", broken, True),
    ):
        watch = BreakWatch("m", size=LRU, render=renderer(SimTokenizer()))
        fill(watch, extend[0][0][0])
        samples = asyncio.run(run(watch, work, capture))
        ordered = sorted(samples)
        median = ordered[len(ordered) // 2] / 1000
        p99 = ordered[int(len(ordered) * 0.99)] / 1000
        mean = sum(samples) / len(samples) / 1000
        print(f"{name:<10} {len(samples):>8} {median:>8.1f} µs {p99:>8.1f} µs {mean:>8.1f} µs")


if __name__ == "__main__":
    main()
