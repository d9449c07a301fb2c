"""Stored responses' replicas, written into the ids: a follow-up goes to the replica that
holds the response it continues, through any gateway sharing the replicas (here two, over
two replicas that a round-robin would otherwise alternate between), streamed or not; and
the client gets the ids back as it was given them."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.serving.homes import home_key, home_of, homed, split_home
from tests.factories import config_file, vllm
from tests.serving.conftest import Harness
from tests.support.inprocess import gateway_settings, running_gateway


def test_an_id_carries_its_replica_and_anything_else_is_unmarked() -> None:
    marked = homed("resp_abc", "http://10.0.0.1:8000")
    assert marked == "resp_abc_r" + home_key("http://10.0.0.1:8000") and len(marked) == 18
    assert split_home(marked) == ("resp_abc", home_key("http://10.0.0.1:8000"))
    replicas = ["http://10.0.0.2:8000", "http://10.0.0.1:8000"]
    assert home_of(split_home(marked)[1] or "", replicas) == "http://10.0.0.1:8000"
    assert home_of(home_key("http://10.0.0.3:8000"), replicas) is None
    for unmarked in ("resp_abc", "resp_abc_r1234567", "resp_abc_r1234567g", "_r12345678", ""):
        assert split_home(unmarked) == (unmarked, None)
    assert split_home("resp_abc_r0x123456") == ("resp_abc_r0x123456", None)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_follow_up_goes_to_the_replica_its_id_names_through_any_gateway(
    harness: Harness, stream: bool
) -> None:
    sims = [await harness.sim(), await harness.sim()]
    config = config_file(harness.tmp / "kvgate.yaml", [vllm("m", sims, policy="round-robin")])
    # Two gateways, one secret and one database, journals of their own.
    settings = [
        gateway_settings(harness.database_url, harness.tmp / name, config, secret="s" * 32)
        for name in ("a", "b")
    ]
    key = harness.tenant.key
    async with running_gateway(settings[0]) as a, running_gateway(settings[1]) as b:
        clients = [a.client(key), b.client(key)]

        async def ask(n: int, **asked: Any) -> tuple[Any, str]:
            """Turn ``n`` through gateway n % 2: the Response, and the replica it came from."""
            gateway, client = (a, b)[n % 2], clients[n % 2]
            asked = {"model": "m", "max_output_tokens": 3, **asked}
            raw = await client.responses.with_raw_response.create(stream=stream, **asked)
            if stream:
                events = [e async for e in raw.parse()]  # type: ignore[union-attr]
                response = events[-1].response  # type: ignore[union-attr]
                ids = {e.response.id for e in events if hasattr(e, "response")}  # type: ignore[union-attr]
                assert ids == {response.id}  # every event names it as the client keeps it
            else:
                response = raw.parse()
            [row] = await gateway.attempts(raw.headers["x-request-id"], count=1)
            return response, row.upstream

        first, home = await ask(0, input="remember: 42")
        previous = first
        for n in range(1, 5):
            follow, served_by = await ask(n, input=f"turn {n}", previous_response_id=previous.id)
            assert served_by == home, (n, served_by, home)
            assert follow.previous_response_id == previous.id  # given back as it was sent
            # The replica rendered the stored conversation before the new input.
            assert follow.usage.input_tokens > previous.usage.input_tokens
            previous = follow
        # A request that continues nothing is round-robined as any other.
        served = {(await ask(n, input=f"fresh {n}"))[1] for n in range(4)}
        assert served == set(sims)
        for client in clients:
            await client.close()


async def test_a_follow_up_whose_replica_left_the_deployment_is_a_clear_404(
    harness: Harness,
) -> None:
    sims = [await harness.sim(), await harness.sim()]
    first_config = config_file(harness.tmp / "one.yaml", [vllm("m", sims[:1])])
    settings = gateway_settings(harness.database_url, harness.tmp / "a", first_config)
    key = harness.tenant.key
    async with running_gateway(settings) as gateway, gateway.client(key) as client:
        first = await client.responses.create(model="m", input="remember", max_output_tokens=2)
    moved = config_file(harness.tmp / "two.yaml", [vllm("m", sims[1:])])
    settings = gateway_settings(harness.database_url, harness.tmp / "b", moved)
    async with running_gateway(settings) as gateway, gateway.client(key) as client:
        with pytest.raises(openai.NotFoundError) as gone:
            await client.responses.create(
                model="m", input="still there?", previous_response_id=first.id
            )
        assert gone.value.body["code"] == "previous_response_unavailable"  # type: ignore[index]
        assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]
        assert "no longer in this deployment" in gone.value.body["message"]  # type: ignore[index]


async def test_only_the_responses_api_is_pinned_by_a_marked_id(harness: Harness) -> None:
    """``previous_response_id`` means nothing to chat: a chat body carrying a marked one
    (of a replica not in the deployment) is served as any chat request, not refused."""
    sim = await harness.sim()
    gateway = await harness.one(sim)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "previous_response_id": homed("resp_elsewhere", "http://10.9.9.9:8000"),
    }
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 2
