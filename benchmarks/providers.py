"""The gateway's added latency on the hosted paths (same-wire and litellm) beside vLLM's.

Four upstreams on loopback answer instantly: the provider emulator (OpenAI-compatible and
Anthropic Messages, replaying the recorded fixtures of tests/providers) and one simulated
vLLM replica with instant timing. Each request goes once straight to its upstream and once
through a real ``kvgate serve`` (SQLite, journal with fsync, as deployed), one at a time;
the difference of the medians is what the gateway adds: to the whole answer (json), and
on streams to the first event and to the last byte.

    path                client speaks              upstream
    vllm                OpenAI                     kvgate sim (/v1/chat/completions)
    wire openai         OpenAI                     emulator /v1/chat/completions, over
                                                   the gateway's aiohttp path (via: auto)
    litellm openai      OpenAI                     the same, through litellm (via: litellm)
    litellm anthropic   OpenAI (gateway) /         emulator /v1/messages
                        Anthropic (direct)

    PYTHONPATH=. .venv/bin/python benchmarks/providers.py [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.factories import config_file
from tests.support.processes import (
    Proc,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
    wait_http,
)

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
]
SIM_MODEL = "kvgate/demo-llama-8b"


@dataclass(frozen=True)
class Route:
    name: str
    direct_url: str
    direct_body: dict[str, Any]
    direct_headers: dict[str, str]
    gateway_model: str


def start_emulator(tmp: Path) -> Proc:
    port = free_port()
    log = tmp / "emulator.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.providers.emulator", "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", process=process)
    return Proc(process, url, log)


async def timed(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[float, float]:
    """(seconds to the first body bytes, seconds to the last)."""
    start = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as reply:
        await reply.content.readany()
        first = time.perf_counter() - start
        await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{url} answered {reply.status}")
    return first, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Timings = list[tuple[float, float]]


async def measure(
    paths: list[Route], gateway: str, key: str, requests: int, stream: bool
) -> list[tuple[str, Timings, Timings]]:
    results = []
    auth = {"authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        for path in paths:
            extra = {"stream": True} if stream else {}
            through = {"model": path.gateway_model, "messages": MESSAGES, "max_tokens": 64, **extra}
            direct_body = {**path.direct_body, **extra}
            if stream and "/v1/chat/completions" in path.direct_url:
                direct_body["stream_options"] = {"include_usage": True}
            direct: Timings = []
            gated: Timings = []
            for _ in range(requests // 10):  # warm up both, connections and caches
                await timed(session, path.direct_url, direct_body, path.direct_headers)
                await timed(session, gateway + "/v1/chat/completions", through, auth)
            for _ in range(requests):  # interleaved, so drift hits both alike
                direct.append(
                    await timed(session, path.direct_url, direct_body, path.direct_headers)
                )
                gated.append(await timed(session, gateway + "/v1/chat/completions", through, auth))
            results.append((path.name, direct, gated))
    return results


def report(title: str, results: list[tuple[str, Timings, Timings]], *, stream: bool) -> None:
    print(f"\n{title}")
    print(
        f"{'path':<20}{'direct p50':>12}{'p99':>9}{'gateway p50':>13}{'p99':>9}"
        f"{'added p50':>11}{'p99':>9}"
        + (f"{'added p50 first event':>23}" if stream else "")
        + "  (ms)"
    )
    for name, direct, gated in results:
        last_d, last_g = [t[1] for t in direct], [t[1] for t in gated]
        d50, d99 = statistics.median(last_d) * 1e3, percentile(last_d, 0.99) * 1e3
        g50, g99 = statistics.median(last_g) * 1e3, percentile(last_g, 0.99) * 1e3
        first = statistics.median([t[0] for t in gated]) - statistics.median([t[0] for t in direct])
        print(
            f"{name:<20}{d50:>12.2f}{d99:>9.2f}{g50:>13.2f}{g99:>9.2f}"
            f"{g50 - d50:>11.2f}{g99 - d99:>9.2f}" + (f"{first * 1e3:>23.2f}" if stream else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        env = gateway_env(
            f"sqlite:///{tmp / 'kvgate.db'}", tmp / "journal", BENCH_ANTHROPIC_KEY="sk-ant-bench"
        )
        kvgate("db", "upgrade", env=env)
        kvgate("prices", "sync", env=env)
        kvgate("tenants", "create", "bench", env=env)
        key = kvgate("keys", "create", "--tenant", "bench", env=env).stdout.strip().splitlines()[-1]
        for model in ("openai-cached", "anthropic-cache-read"):
            kvgate(
                "prices",
                "add",
                "--model",
                model,
                "--effective-from",
                "2025-01-01",
                "--backdate",
                "--input",
                "3",
                "--cache-read",
                "0.3",
                "--cache-write",
                "3.75",
                "--output",
                "15",
                env=env,
            )
        sim = start_sim(tmp, extra=("--prefill-tokens-per-s", "0", "--decode-tokens-per-s", "0"))
        emulator = start_emulator(tmp)
        config = config_file(
            tmp / "kvgate.yaml",
            [
                {"name": SIM_MODEL, "replicas": [sim.url]},
                *(
                    {
                        "name": f"gpt-{via}",
                        "backend": "litellm",
                        "litellm_model": "openai/openai-cached",
                        "api_base": emulator.url + "/v1",
                        "price_model": "openai-cached",
                        "via": via,
                    }
                    for via in ("auto", "litellm")
                ),
                {
                    "name": "claude",
                    "backend": "litellm",
                    "litellm_model": "anthropic/anthropic-cache-read",
                    "api_base": emulator.url,
                    "api_key_env": "BENCH_ANTHROPIC_KEY",
                    "price_model": "anthropic-cache-read",
                },
            ],
        )
        gateway = start_gateway(tmp, config, env)
        chat = {"messages": MESSAGES, "max_tokens": 64}
        paths = [
            Route(
                "vllm",
                sim.url + "/v1/chat/completions",
                {"model": SIM_MODEL, **chat},
                {},
                SIM_MODEL,
            ),
            *(
                Route(
                    name,
                    emulator.url + "/v1/chat/completions",
                    {"model": "openai-cached", **chat},
                    {"authorization": "Bearer x"},
                    f"gpt-{via}",
                )
                for name, via in (("wire openai", "auto"), ("litellm openai", "litellm"))
            ),
            Route(
                "litellm anthropic",
                emulator.url + "/v1/messages",
                {
                    "model": "anthropic-cache-read",
                    "max_tokens": 64,
                    "system": "You are terse.",
                    "messages": MESSAGES[1:],
                },
                {"x-api-key": "x", "anthropic-version": "2023-06-01"},
                "claude",
            ),
        ]
        try:
            report(
                f"non-streaming, {args.requests} requests each, concurrency 1",
                asyncio.run(measure(paths, gateway.url, key, args.requests, stream=False)),
                stream=False,
            )
            report(
                f"streaming (to the last byte), {args.requests} requests each, concurrency 1",
                asyncio.run(measure(paths, gateway.url, key, args.requests, stream=True)),
                stream=True,
            )
        finally:
            gateway.stop()
            emulator.stop()
            sim.stop()


if __name__ == "__main__":
    main()
