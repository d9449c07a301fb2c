"""The test plan's client against a simulated replica served on loopback, in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import date

import pytest
from aiohttp.test_utils import TestServer

from gateway.tools.cachetest.client import Endpoint, key_salt, server_root
from gateway.tools.cachetest.prompts import PromptMaker
from gateway.tools.sim.server import SimConfig, create_app
from gateway.tools.sim.timing import TimingModel

MODEL = "kvgate/demo-llama-8b"


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    timing = TimingModel(prefill_tokens_per_s=0, decode_tokens_per_s=0)
    server = TestServer(create_app(SimConfig(model=MODEL, capacity_blocks=256, timing=timing)))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_a_streamed_request_reports_its_usage_and_first_token(sim: str) -> None:
    text = PromptMaker(1).text(1, 100)
    async with Endpoint(sim, MODEL, max_tokens=3) as endpoint:
        cold = await endpoint.chat("k", text)
        warm = await endpoint.chat("k", text)
        salted = await endpoint.chat("k", text, salt=key_salt("k"))
    assert (cold.status, cold.prompt_tokens, cold.cached_tokens, cold.output_tokens) == (
        200,
        102,
        0,
        3,
    )
    assert warm.ok and warm.cached_tokens == 96  # (102 - 1) // 16 full blocks
    assert salted.ok and salted.cached_tokens == 0
    assert cold.ttft_s is not None and 0 < cold.ttft_s <= cold.latency_s


async def test_an_error_answer_is_an_outcome_not_an_exception(sim: str) -> None:
    async with Endpoint(sim, "no-such-model") as endpoint:
        outcome = await endpoint.chat("k", "hello")
    assert outcome.status == 404 and not outcome.ok
    assert outcome.error is not None and "does not exist" in outcome.error


async def test_the_cache_config_comes_from_vllm_metrics_and_a_sim_has_no_statement(
    sim: str,
) -> None:
    async with Endpoint(sim, MODEL) as endpoint:
        cache = await endpoint.cache_config()
        statement = await endpoint.statement("k", start=date(2026, 1, 1), end=date(2026, 1, 1))
    assert cache is not None and (cache.block_size, cache.num_blocks) == (16, 256)
    assert statement is None


def test_a_key_salt_is_stable_distinct_and_never_the_key() -> None:
    salt = key_salt("kvg-secret")
    assert salt == key_salt("kvg-secret") != key_salt("kvg-other")
    assert salt.startswith("cachetest-") and len(salt) == 42 and "secret" not in salt


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "//v1//"])
async def test_the_target_is_a_base_url_with_or_without_v1(sim: str, suffix: str) -> None:
    """As the openai SDK's base_url: chat, /metrics and the statement all find the server."""
    async with Endpoint(sim + suffix, MODEL, max_tokens=2) as endpoint:
        assert endpoint.target == sim
        outcome = await endpoint.chat("k", "hello there")
        cache = await endpoint.cache_config()
    assert outcome.ok and outcome.prompt_tokens > 0
    assert cache is not None and cache.block_size == 16


def test_a_base_url_keeps_its_path_prefix_and_must_be_http() -> None:
    assert server_root("https://gw.example.com/llm/v1/") == "https://gw.example.com/llm"
    assert server_root(" http://127.0.0.1:8000 ") == "http://127.0.0.1:8000"
    assert server_root("http://127.0.0.1:8000/v10") == "http://127.0.0.1:8000/v10"
    for bad in ("127.0.0.1:8000/v1", "ftp://host/v1", "http://", ""):
        with pytest.raises(ValueError, match="want an http"):
            server_root(bad)
