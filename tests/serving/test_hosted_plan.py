"""A hosted plan builds each target's request once, and lets the client's parsed body go
once every target's is built (a large body is then not held beside the bytes sent)."""

from __future__ import annotations

from typing import Any

from gateway.config import ProviderDeployment, ProviderTarget
from gateway.serving.calls import Call, Endpoint
from gateway.serving.hosted import Plan
from gateway.serving.passthrough import Prepared
from tests.factories import deployments, litellm


class Building:
    """Builds a target's request as the passthrough does, counting how often."""

    def __init__(self) -> None:
        self.built: list[str] = []

    def request(self, call: Call, target: ProviderTarget) -> Prepared:
        self.built.append(target.litellm_model)
        return (target.litellm_model, repr(sorted(call.body)).encode(), {})


def call_of(body: dict[str, Any]) -> Call:
    return Call(
        endpoint=Endpoint.COMPLETIONS,
        model="m",
        body=body,
        stream=False,
        client_wants_usage=False,
        client_salt=None,
        interaction_hint=None,
        prompt_chars=1,
    )


def targets(*models: str) -> tuple[ProviderTarget, ...]:
    first, *rest = models
    fallbacks = [{"litellm_model": m, "api_base": "http://x/v1"} for m in rest]
    [made] = deployments(litellm("m", first, api_base="http://x/v1", fallbacks=fallbacks))
    assert isinstance(made, ProviderDeployment)
    return tuple(made.targets)


def test_the_body_goes_once_every_targets_request_is_built_and_a_retry_resends_it() -> None:
    plan, building = Plan(targets("openai/a", "openai/b")), Building()
    call = call_of({"model": "m", "prompt": "hi"})
    first = plan.request(call, 1, building)
    assert call.body == {"model": "m", "prompt": "hi"}  # the fallback still needs it
    plan.again(1)  # attempt 1's connection failed: its target once more, as attempt 2
    assert plan.request(call, 2, building) is first
    third = plan.request(call, 3, building)
    assert third == ("openai/b", b"['model', 'prompt']", {})
    assert building.built == ["openai/a", "openai/b"] and call.body == {}


def test_one_target_the_body_goes_with_its_request_built() -> None:
    plan, building = Plan(targets("openai/a")), Building()
    call = call_of({"model": "m", "prompt": "hi"})
    assert plan.request(call, 1, building)[1] == b"['model', 'prompt']"
    assert call.body == {}
