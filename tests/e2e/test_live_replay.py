"""`kvgate replay --target`: a trace through a real gateway, hit rates read back from records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.factories import vllm
from tests.support.processes import kvgate
from tests.support.stack import running_stack

pytestmark = pytest.mark.e2e


def test_live_replay_reports_the_same_hit_rate_as_the_records(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    # 12 requests: a shared 2-block prefix (ids 0, 1) and a distinct last block each.
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": n * 10,
                    "input_length": 3 * 512 - 37,
                    "output_length": 4,
                    "hash_ids": [0, 1, 100 + n],
                }
            )
            + "\n"
            for n in range(12)
        )
    )
    with running_stack(
        tmp_path, f"sqlite:///{tmp_path / 'kvgate.db'}", tenants=("replayer",)
    ) as stack:
        stack.configure(
            [
                vllm(
                    "kvgate/demo-llama-8b",
                    [s.url for s in stack.start_sims(2)],
                    tokenizer="kvgate-sim",
                )
            ]
        )
        stack.start_gateway()
        command = ("replay", str(trace), "--target", stack.url, "--key", stack.key)
        out = kvgate(*command, "--speed", "20", env=stack.env).stdout
    reported = float(re.search(r"token hit rate \(reported by the replicas\): ([\d.]+)%", out)[1])  # type: ignore[index]
    recorded = re.search(
        r"recorded by the gateway: (\d+) requests, ([\d,]+) prompt tokens, "
        r"token hit rate ([\d.]+)%, cost ([\d.]+) USD",
        out,
    )
    assert recorded is not None, out
    assert int(recorded[1]) == 12
    assert float(recorded[3]) == reported
    # After the first request, kv-aware keeps the shared prefix on one replica: 11 of 12
    # requests reuse 2 of their ~3 blocks.
    assert reported > 55.0
    assert "completed: 12 of 12" in out
