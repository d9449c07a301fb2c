"""A simulated fleet behind a real `kvgate serve` for the cache test: two `kvgate sim`
replicas whose timing makes the cache plain in TTFT (prefill 20,000 uncached tokens/s, one
prefill at a time; instant decode, so TTFT is queueing + prefill) and whose caches are small
enough (640 blocks of 16 tokens each) for the eviction stage to find their size quickly.

Tenants: ``alpha`` and ``beta`` isolated (each its own cache scope), ``carol`` and ``dave``
put into one explicit sharing group by the operator (``kvgate tenants set-group``). The
database is prepared in-process through the functions the CLI calls (each CLI process
costs seconds on a busy 2-core machine); the operator's group change goes through the CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.factories import vllm
from tests.support.processes import kvgate
from tests.support.stack import Stack, running_stack

MODEL = "kvgate/demo-llama-8b"
CAPACITY_BLOCKS = 640
BLOCK_SIZE = 16
SIM_TIMING = (
    "--prefill-tokens-per-s",
    "20000",
    "--decode-tokens-per-s",
    "0",
    "--capacity-blocks",
    str(CAPACITY_BLOCKS),
    "--block-size",
    str(BLOCK_SIZE),
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("cachetest-fleet")
    with running_stack(
        tmp, f"sqlite:///{tmp / 'kvgate.db'}", tenants=("alpha", "beta", "carol", "dave")
    ) as stack:
        for name in ("carol", "dave"):
            kvgate(
                "tenants", "set-group", name, "--cache-group", "shared-by-operator", env=stack.env
            )
        stack.configure([vllm(MODEL, [s.url for s in stack.start_sims(2, extra=SIM_TIMING)])])
        stack.start_gateway()
        yield stack


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


def cachetest(*args: str, timeout_s: float = 240.0) -> Run:
    """The real command (``python -m gateway.cli cachetest``), timed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "cachetest", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
