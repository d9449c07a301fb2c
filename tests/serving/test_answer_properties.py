"""Any whole answer a replica could send, through the in-process gateway: a JSON object
is served as it came (with the cost added to its usage), and recorded completed with the
usage its wire convention gives, the cost of that usage, and the first choice's finish
reason. Hypothesis draws the answers; one gateway serves every example.

The values stay within what both databases store (counts below 2**31, finish reasons
without NUL and under 50 characters): tests/serving/test_limits.py holds the rest.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.usage import from_openai
from pricing.cost import compute
from tests.serving.conftest import CHAT, PRICE, Harness, attempt, chat, facts
from tests.support.upstream import Answer

counts = st.integers(0, 2**31 - 1)
garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), -1),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9),
    st.text(max_size=4),
    st.lists(counts, max_size=2),
)
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | counts | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
usages = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": counts | garbage,
            "completion_tokens": counts | garbage,
            "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": counts | garbage})
            | json_values,
        },
    ),
)
finishes = (
    st.none() | st.sampled_from(["stop", "length", "tool_calls", ""]) | counts | st.booleans()
)
choice = st.fixed_dictionaries(
    {"index": st.integers(0, 3)},
    optional={"finish_reason": finishes, "message": st.fixed_dictionaries({"content": text})},
)
answers = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "choices": st.lists(choice | json_values, max_size=3) | json_values,
        "usage": usages,
    },
)


def first_finish(choices: Any) -> str | None:
    """The first choice's finish reason, where the first choice is an object with one."""
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return None if reason is None else str(reason)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(answer=answers)
async def test_any_json_object_answer_is_served_and_recorded_as_its_convention_reads_it(
    harness: Harness, answer: dict[str, Any]
) -> None:
    replica, url = await harness.shared_scripted()
    replica.answers[:] = [Answer(answer)]
    gateway = await harness.shared(url)
    async with gateway.http(harness.tenant.key) as http:
        reply = await http.post(CHAT, json=chat())
    assert reply.status_code == 200, reply.text
    served = reply.json()
    assert {k: v for k, v in served.items() if k != "usage"} == {
        k: v for k, v in answer.items() if k != "usage"
    }
    raw = answer.get("usage")
    usage = from_openai(raw if isinstance(raw, dict) else None)
    cost = compute(usage, PRICE)
    assert served["usage"]["cost"] == f"{cost.total:f}"
    rid = reply.headers["x-request-id"]
    tokens = (usage.uncached_tokens, usage.cache_read_tokens, 0, usage.output_tokens)
    assert [facts(row) for row in await gateway.attempts(rid)] == [
        attempt(
            rid,
            url,
            tokens=tokens,
            source=usage.source.value,
            cost=cost.total,
            finish=first_finish(answer.get("choices")),
        )
    ]
