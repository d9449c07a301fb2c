"""Response ids are the tenant's own: a follow-up naming a response another tenant was
given is a 404 that says nothing of whether it exists, on every backend (a vLLM replica's
memory, OpenAI's store under the operator's one key). The ids carry an HMAC of the tenant
under the gateway's secret, and nothing is kept: a follow-up works, and a stranger's is
refused, across a restart of the gateway."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.api.response_ids import ResponseIds
from gateway.db.session import make_engine
from gateway.errors import ResponseNotFound
from gateway.tools.sim.server import SimConfig
from gateway.tools.sim.server import create_app as sim_app
from gateway.tools.sim.timing import TimingModel
from tests.factories import Tenant, config_file, litellm, tenants, vllm
from tests.providers.emulator import Emulator
from tests.providers.prices import GPT
from tests.serving.conftest import Harness
from tests.support.inprocess import Gateway, gateway_settings, running_gateway

UPSTREAM_ID = "resp_68b1c0a8d1f48190b2f6a2b5c0e1d3f4"  # the emulated OpenAI's answer's


def stranger(harness: Harness) -> Tenant:
    engine = make_engine(harness.database_url)
    try:
        return tenants(engine, "globex")["globex"]
    finally:
        engine.dispose()


def client(gateway: Gateway, tenant: Tenant) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=tenant.key, max_retries=0)


async def refused(gateway: Gateway, tenant: Tenant, previous: str, **asked: Any) -> None:
    """The follow-up is a 404 in OpenAI's shape naming the id as sent, nothing more."""
    async with client(gateway, tenant) as openai_client:
        with pytest.raises(openai.NotFoundError) as missing:
            await openai_client.responses.create(
                model=asked.pop("model", "m"),
                input="and then?",
                previous_response_id=previous,
                **asked,
            )
    assert missing.value.body == {
        "message": f"Previous response with id '{previous}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }


async def test_a_stored_vllm_response_is_followed_by_its_tenant_only_across_restarts(
    harness: Harness,
) -> None:
    sim = await harness.serve(sim_app(SimConfig(model="m", timing=TimingModel.zero())))
    config = config_file(harness.tmp / "kvgate.yaml", [vllm("m", [sim])])
    settings = gateway_settings(harness.database_url, harness.tmp, config)
    acme, globex = harness.tenant, stranger(harness)
    async with running_gateway(settings) as gateway, client(gateway, acme) as mine:
        first = await mine.responses.create(model="m", input="remember: 42", max_output_tokens=3)
        upstream_id, mark, tag = first.id.rpartition("_k")
        assert upstream_id.startswith("resp_") and mark and len(tag) == 20
        # Streamed, the id is tagged in every event that carries the Response.
        events = [
            e
            async for e in await mine.responses.create(
                model="m", input="remember: 7", max_output_tokens=3, stream=True
            )
        ]
        ids = {e.response.id for e in events if hasattr(e, "response")}  # type: ignore[union-attr]
        assert len(ids) == 1 and "_k" in next(iter(ids))
        follow = await mine.responses.create(
            model="m", input="and then?", previous_response_id=first.id, max_output_tokens=3
        )
        assert follow.previous_response_id == first.id  # given back as the client sent it
        assert follow.usage is not None and follow.usage.input_tokens > 0
        # Another tenant: with the id it saw, with the replica's own, with one made up.
        for previous in (first.id, upstream_id, upstream_id + "_k" + "0" * 20, "resp_nope"):
            await refused(gateway, globex, previous)
    # A new gateway process, the same secret: nothing was kept, nothing was lost.
    async with running_gateway(settings) as gateway, client(gateway, acme) as mine:
        again = await mine.responses.create(
            model="m", input="still there?", previous_response_id=follow.id, max_output_tokens=3
        )
        # The replica rendered the stored conversation before the new input.
        assert again.usage is not None and again.usage.input_tokens > follow.usage.input_tokens
        await refused(gateway, globex, follow.id)


async def test_openais_stored_responses_are_the_tenants_own(harness: Harness) -> None:
    """Hosted OpenAI keeps every tenant's responses under the operator's key: a stranger's
    follow-up never reaches it; the tenant's own reaches it with OpenAI's id."""
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(GPT)
    gateway = await harness.gateway(
        litellm(
            "gpt", "openai/openai-responses-cached", api_base=url + "/v1", price_model=GPT.model
        )
    )
    acme, globex = harness.tenant, stranger(harness)
    async with client(gateway, acme) as mine:
        first = await mine.responses.create(model="gpt", input="Capital of France?")
        assert first.id.startswith(UPSTREAM_ID + "_k")
        await mine.responses.create(
            model="gpt", input="And of Spain?", previous_response_id=first.id
        )
    assert [r.body.get("previous_response_id") for r in emulator.requests] == [None, UPSTREAM_ID]
    await refused(gateway, globex, first.id, model="gpt")
    await refused(gateway, globex, UPSTREAM_ID, model="gpt")
    assert len(emulator.requests) == 2  # neither reached the provider


def test_a_tag_is_the_tenants_and_the_secrets() -> None:
    """Another tenant, another secret, a changed character: each is a 404; an upstream id
    that itself holds the mark is untagged whole."""
    ids = ResponseIds("s" * 32)
    mine = ids.tag("ten_a", "resp_x_k1")
    assert mine.startswith("resp_x_k1_k") and ids.untag("ten_a", mine) == "resp_x_k1"
    assert ids.tag("ten_a", "resp_x_k1") == mine  # nothing kept: the same tag every time
    assert ids.tag("ten_b", "resp_x_k1") != mine
    assert ResponseIds("t" * 32).tag("ten_a", "resp_x_k1") != mine
    flipped = mine[:-1] + ("0" if mine[-1] != "0" else "1")
    for wrong in (("ten_b", mine), ("ten_a", flipped), ("ten_a", "resp_x_k1"), ("ten_a", "")):
        with pytest.raises(ResponseNotFound):
            ids.untag(*wrong)
