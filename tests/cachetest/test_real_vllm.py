"""`kvgate cachetest` straight against one real vLLM server on the CPU (the tiny local model):
the timing audit alone tells a server that salts each key's requests from one that does not.

vLLM has no tenants: with ``--salt-per-key`` each key's requests carry a ``cache_salt`` of
its own, which is how kvgate isolates tenants; without it both keys share one cache. The
audit withholds the reported cached tokens (``--audit-timing-only``), so each verdict rests
on TTFT. Prompts are 1,500 words (about 1,510 tokens of the 2,048 the model allows): on
this model a cold prefill of that takes roughly 200 ms on a CPU, a warm one roughly 60 ms.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cachetest.conftest import cachetest
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm import SERVED_NAME, VllmServer, launch_vllm, wait_ready

pytestmark = pytest.mark.vllm

# 32-token blocks: a batch of warmed and fresh prompts (8 x 48 blocks) and the first key's
# own stays well inside, so nothing the audit probes is evicted before it is probed.
NUM_BLOCKS = 1024
PROMPT_WORDS = "1500"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    tmp = tmp_path_factory.mktemp("cachetest-vllm")
    model = build_tiny_model(tmp / "tiny-model")
    server = wait_ready(
        launch_vllm(tmp / "server", model, num_blocks=NUM_BLOCKS, max_model_len=2048)
    )
    try:
        yield server
    finally:
        server.stop()


def audit(vllm: VllmServer, report: Path, *salt: str) -> tuple[int, dict[str, Any]]:
    run = cachetest(
        "--target", vllm.url,
        "--key", "tenant-one",
        "--second-key", "tenant-two",
        "--model", SERVED_NAME,
        "--stages", "isolation",
        "--prompt-words", PROMPT_WORDS,
        "--audit-timing-only",
        "--report", str(report),
        *salt,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr[-3000:]
    data = json.loads((report / "report.json").read_text())
    return run.returncode, data


def test_distinct_salts_per_key_show_no_sharing(vllm: VllmServer, tmp_path: Path) -> None:
    status, data = audit(vllm, tmp_path, "--salt-per-key")
    isolation = data["stages"]["isolation"]
    assert (status, isolation["verdict"]) == (0, "no evidence of sharing"), isolation["audit"]
    assert data["block_size"] == 32 and data["block_size_source"] == "target /metrics"
    # The control shows the cache is plain in TTFT here, so "no evidence" has power.
    assert isolation["control_detectable"] is True, isolation["control"]


def test_no_salts_let_the_second_key_hit_the_first_keys_cache(
    vllm: VllmServer, tmp_path: Path
) -> None:
    status, data = audit(vllm, tmp_path)
    isolation = data["stages"]["isolation"]
    assert (status, isolation["verdict"]) == (1, "cache shared across keys"), isolation["audit"]
    assert isolation["evidence"] == {"usage": None, "timing": True}
    assert isolation["audit"]["p_value"] < 0.01
    assert isolation["audit"]["rank_biserial"] >= 0.5
    confirmation = isolation["confirmation"]["audit"]
    assert confirmation["p_value"] < 0.01 and confirmation["rank_biserial"] >= 0.5
