"""Hosted models (litellm) in-process: tests/providers' emulator of Anthropic served in the
test's loop; a target that fails is followed by the next as attempt 2, exactly recorded.

Sonnet bills 3 / 0.30 / 15 USD per million: the cache-read answer (50 uncached, 2,000 read,
80 output) costs 50 × 3 + 2,000 × 0.30 + 80 × 15 = 1,950 micro-dollars.
"""

from __future__ import annotations

import pytest

from tests.factories import litellm
from tests.providers.emulator import Emulator
from tests.providers.prices import SONNET
from tests.serving.conftest import CHAT, D, Harness, StartsWith, attempt, chat, facts
from tests.support.inprocess import refusing_url

KEY_ENV = "KVGATE_TEST_ANTHROPIC_KEY"


@pytest.mark.parametrize("failing", ["answers-500", "refuses-connections"])
async def test_a_failing_target_is_followed_by_the_next_as_attempt_two(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    emulator = Emulator()
    url = await harness.serve(emulator.app())
    harness.add_prices(SONNET)
    target = {"api_key_env": KEY_ENV, "price_model": SONNET.model}
    if failing == "answers-500":
        first = {"litellm_model": "anthropic/anthropic-error-500", "api_base": url}
        said = "anthropic/anthropic-error-500: InternalServerError (500): "
    else:
        first = {"litellm_model": "anthropic/anthropic-cache-read", "api_base": refusing_url()}
        # litellm calls a refused connection an internal server error.
        said = (
            "anthropic/anthropic-cache-read: InternalServerError (500): litellm."
            "InternalServerError: AnthropicException - Cannot connect to host"
        )
    fallback = {"litellm_model": "anthropic/anthropic-cache-read", "api_base": url, **target}
    deployment = litellm("m", first["litellm_model"], api_base=first["api_base"], **target)
    gateway = await harness.gateway({**deployment, "fallbacks": [fallback]})
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    assert reply.status_code == 200, reply.text
    rid = reply.headers["x-request-id"]
    rows = await gateway.attempts(rid)
    assert [facts(row) for row in rows] == [
        attempt(
            rid, first["litellm_model"], status="failed", source="missing", error=StartsWith(said)
        ),
        attempt(
            rid,
            "anthropic/anthropic-cache-read",
            number=2,
            tokens=(50, 2000, 0, 80),
            cost=D("0.001950000"),
            finish="stop",
        ),
    ]
    assert [r.path for r in emulator.requests] == (
        ["/v1/messages", "/v1/messages"] if failing == "answers-500" else ["/v1/messages"]
    )
