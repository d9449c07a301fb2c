"""End to end: the official openai client, a real `kvgate serve` process and the emulator
process, on hosted ``/v1/completions`` over the provider's own wire; records, statement
and costs checked to the nano-dollar (the fixtures' usage, computed by hand)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import openai
import pytest

from tests.factories import litellm
from tests.providers.prices import DEEPSEEK, GPT
from tests.support.inprocess import refusing_url
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e
D = Decimal
KEY_ENV = "KVGATE_TEST_OPENAI_KEY"
PROMPT = "Q: What is the capital of France?\nA:"
TEXT = " Paris is the capital of France."


@pytest.fixture
def stack(empty_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path,
        empty_database_url,
        prices=[GPT, DEEPSEEK],
        tenants=("acme",),
        **{KEY_ENV: "sk-openai-test"},
    ) as stack:
        emulator = stack.start_emulator()
        base = {"api_base": emulator.url + "/v1", "api_key_env": KEY_ENV}
        gpt = {**base, "price_model": GPT.model}
        stack.configure(
            [
                litellm(
                    "gpt",
                    "openai/openai-error-500",
                    **gpt,
                    fallbacks=[
                        {"litellm_model": "openai/openai-completion", **gpt},
                    ],
                ),
                litellm(
                    "deepseek",
                    "deepseek/deepseek-completion",
                    **{**base, "api_base": refusing_url() + "/v1"},
                    price_model=DEEPSEEK.model,
                    fallbacks=[
                        {
                            "litellm_model": "deepseek/deepseek-completion",
                            **base,
                            "price_model": DEEPSEEK.model,
                        }
                    ],
                ),
            ]
        )
        stack.start_gateway()
        yield stack


def test_completions_fail_over_and_are_billed_in_each_providers_convention_bad_input_a_400(
    stack: Stack,
) -> None:
    """gpt: a 500, then OpenAI's answer (176 x 2 + 1024 x 0.50 + 30 x 8 per million);
    deepseek: a refused port tried twice, then DeepSeek's (232 x 0.27 + 768 x 0.07 + 50 x
    1.10); streamed and not, the billed usage in the answer. A body the gateway cannot
    take is a 400, and no record."""
    client = stack.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="gpt", prompt=[1, "mixed"])  # type: ignore[list-item]
    assert caught.value.status_code == 400 and "prompt" in caught.value.message
    seen = []
    for model in ("gpt", "deepseek"):
        reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=64)
        assert reply.choices[0].text == TEXT and reply.usage is not None
        seen.append((reply.usage.prompt_tokens, (reply.usage.model_extra or {})["cost"]))
        chunks = list(
            client.completions.create(
                model=model, prompt=PROMPT, stream=True, stream_options={"include_usage": True}
            )
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == TEXT
        usage = chunks[-1].usage
        assert usage is not None
        seen.append((usage.prompt_tokens, (usage.model_extra or {})["cost"]))
    assert seen == [(1200, "0.001104000")] * 2 + [(1000, "0.000171400")] * 2

    rows = stack.rows(count=10)
    assert [(r.model, r.attempt, r.status, r.stream, r.endpoint, r.cost_total) for r in rows] == [
        ("gpt", 1, "failed", False, "/v1/completions", D("0E-9")),
        ("gpt", 2, "completed", False, "/v1/completions", D("0.001104000")),
        ("gpt", 1, "failed", True, "/v1/completions", D("0E-9")),
        ("gpt", 2, "completed", True, "/v1/completions", D("0.001104000")),
        ("deepseek", 1, "failed", False, "/v1/completions", D("0E-9")),
        ("deepseek", 2, "failed", False, "/v1/completions", D("0E-9")),
        ("deepseek", 3, "completed", False, "/v1/completions", D("0.000171400")),
        ("deepseek", 1, "failed", True, "/v1/completions", D("0E-9")),
        ("deepseek", 2, "failed", True, "/v1/completions", D("0E-9")),
        ("deepseek", 3, "completed", True, "/v1/completions", D("0.000171400")),
    ]
    completed = [r for r in rows if r.status == "completed"]
    assert [(r.uncached_tokens, r.cache_read_tokens, r.output_tokens) for r in completed] == [
        (176, 1024, 30)
    ] * 2 + [(232, 768, 50)] * 2

    totals = stack.statement()["totals"]
    assert (totals["requests"], totals["cost_total"]) == (10, "0.002550800")
