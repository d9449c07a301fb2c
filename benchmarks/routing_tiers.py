"""Measure what a cached block in each tier is worth: TTFT of a prompt recomputed, served
from GPU memory, loaded from host memory and loaded from disk; a tier's weight is
``1 - fetch time per block / prefill time per block`` (gateway/routing/tiers.py).

Against a real `kvgate sim` process on loopback, through the official openai client
(streamed, TTFT = the first chunk with a choice): 512-token blocks (Mooncake's), prefill 10,000
tokens/s, a host block loading in 2.7 ms and a disk block in 11 ms (64 MiB of an 8B
model's KV over PCIe 4.0 at ~24 GB/s, and from NVMe at ~6 GB/s). GPU memory holds 24
blocks, host memory 24, disk 1,000: a 20-block prompt is pushed down one tier by each
24-block filler sent after it.

With ``--vllm``, also real vLLM on the CPU (the tiny local model of tests/support):
recomputing against a prefix-cache hit, and whether its offloading connector starts.

    PYTHONPATH=. .venv/bin/python benchmarks/routing_tiers.py [--vllm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.routing.tiers import weight  # noqa: E402
from tests.support.processes import free_port, wait_http  # noqa: E402

BLOCK = 512
PROMPT_BLOCKS = 20
GPU_BLOCKS, CPU_BLOCKS, DISK_BLOCKS = 24, 24, 1000
CPU_BLOCK_MS, DISK_BLOCK_MS = 2.7, 11.0
RUNS = 7
MODEL = "kvgate/demo-llama-8b"


def words(seed: int, count: int) -> str:
    """Distinct words: one token each for the simulator's tokenizer."""
    return " ".join(f"w{seed}x{i}" for i in range(count))


def ttft(client: openai.OpenAI, model: str, prompt: str) -> tuple[float, dict[str, int]]:
    """Seconds to the first streamed token, and the cached tokens the usage reports (by
    tier where the replica says them, else as "cached")."""
    start = time.perf_counter()
    first = None
    cached: dict[str, int] = {}
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        # The first chunk that carries a choice comes once the prefill is done (the tiny
        # model's first tokens may be empty text).
        if first is None and chunk.choices:
            first = time.perf_counter() - start
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            details = chunk.usage.prompt_tokens_details.model_dump()
            cached = details.get("cached_tokens_by_source") or {
                "cached": details["cached_tokens"] or 0
            }
    assert first is not None
    return first, cached


def measure_sim() -> dict[str, float]:
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"kvgate-sim-{port}.log"
    argv = [
        sys.executable, "-m", "gateway.cli", "sim", "--port", str(port), "--model", MODEL,
        "--block-size", str(BLOCK), "--capacity-blocks", str(GPU_BLOCKS),
        "--cpu-blocks", str(CPU_BLOCKS), "--cpu-block-ms", str(CPU_BLOCK_MS),
        "--disk-blocks", str(DISK_BLOCKS), "--disk-block-ms", str(DISK_BLOCK_MS),
        "--prefill-tokens-per-s", "10000", "--decode-tokens-per-s", "1000",
        "--max-model-len", "65536",
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)
    samples: dict[str, list[float]] = {"cold": [], "gpu": [], "host": [], "disk": []}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", process=process)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        filler = iter(range(10_000, 20_000))
        for run in range(RUNS):
            prompt = words(run, PROMPT_BLOCKS * BLOCK + 100)
            samples["cold"].append(ttft(client, MODEL, prompt)[0])
            samples["gpu"].append(ttft(client, MODEL, prompt)[0])
            for tier, fillers in (("host", 1), ("disk", 2)):
                # Each filler as large as GPU memory pushes what is there down one tier.
                for _ in range(fillers):
                    ttft(client, MODEL, words(next(filler), GPU_BLOCKS * BLOCK + 100))
                took, cached = ttft(client, MODEL, prompt)
                assert cached.get(tier) == PROMPT_BLOCKS * BLOCK, (tier, cached)
                samples[tier].append(took)
    finally:
        process.terminate()
        process.wait(timeout=10)
    return {name: statistics.median(values) for name, values in samples.items()}


def report(name: str, medians: dict[str, float], blocks: int) -> None:
    prefill = (medians["cold"] - medians["gpu"]) / blocks
    print(f"\n{name}: median TTFT of {RUNS} runs (s)")
    print("| served from | TTFT (s) | per block over a GPU hit (ms) | weight |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| recomputed | {medians['cold']:.4f} | {1000 * prefill:.2f} | 0 |")
    print(f"| the device's prefix cache | {medians['gpu']:.4f} | 0 | 1 |")
    for tier in ("host", "disk"):
        if tier in medians:
            fetch = (medians[tier] - medians["gpu"]) / blocks
            print(
                f"| {tier} | {medians[tier]:.4f} | {1000 * fetch:.2f} | "
                f"{weight(fetch, prefill):.3f} |"
            )


def measure_vllm() -> None:
    from tests.support.tiny_model import build_tiny_model
    from tests.support.vllm import SERVED_NAME, VllmUnavailable, launch_vllm, wait_ready

    with tempfile.TemporaryDirectory(prefix="kvgate-vllm-") as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        server = wait_ready(launch_vllm(Path(tmp) / "plain", model, num_blocks=256))
        samples: dict[str, list[float]] = {"cold": [], "gpu": []}
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            vocabulary = ["cache", "block", "token", "prefix", "model", "replica", "router"]
            for run in range(RUNS):
                prompt = " ".join(vocabulary[(run + i * 3) % 7] + str(run) for i in range(300))
                samples["cold"].append(ttft(client, SERVED_NAME, prompt)[0])
                took, cached = ttft(client, SERVED_NAME, prompt)
                samples["gpu"].append(took)
            blocks = cached["cached"] // 32
        finally:
            server.stop()
        title = f"vLLM on CPU, tiny model, {blocks} blocks of 32 tokens hit"
        report(title, medians(samples), blocks)
        # The offloading connector, as a deployment would enable it.
        offload = launch_vllm(
            Path(tmp) / "offload",
            model,
            extra_args=(
                "--kv-transfer-config",
                json.dumps(
                    {
                        "kv_connector": "OffloadingConnector",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": 8 << 20},
                    }
                ),
            ),
        )
        try:
            wait_ready(offload, timeout_s=400)
            print("\nvLLM's OffloadingConnector started on the CPU build")
        except VllmUnavailable:
            errors = [line for line in offload.output().splitlines() if "Exception:" in line]
            print(f"\nvLLM's OffloadingConnector does not start on the CPU build: {errors[:1]}")


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vllm", action="store_true", help="also measure real vLLM on CPU")
    args = parser.parse_args(argv)
    report(
        f"kvgate sim, {PROMPT_BLOCKS} blocks of {BLOCK} tokens hit "
        f"(host {CPU_BLOCK_MS} ms, disk {DISK_BLOCK_MS} ms a block)",
        measure_sim(),
        PROMPT_BLOCKS,
    )
    if args.vllm:
        measure_vllm()


if __name__ == "__main__":
    main(sys.argv[1:])
