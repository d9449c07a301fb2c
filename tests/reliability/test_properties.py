"""Properties, over generated inputs, of what the bill is computed from.

- SSE: however an upstream's stream is cut into reads (line endings LF or CRLF, comments
  between events), the gateway sees the same events, the same usage, the same finish.
- Usage normalisers: any JSON at all becomes a valid Usage (never an exception); each
  wire convention keeps its prompt total and its four classes disjoint.
- Price arithmetic: each class is tokens × rate / 1M rounded half-even to the nano-dollar,
  exactly (checked against rational arithmetic); totals are exact sums; costs add up with
  no drift, and pricing per request differs from pricing the summed tokens by at most the
  rounding, half a nano-dollar per class per request.

Derandomized: the same examples on every run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.calls import Endpoint, parse_body, parse_call
from gateway.errors import InvalidRequest
from gateway.upstream.sse import EventSplitter, StreamState, inspect
from gateway.usage import (
    Usage,
    UsageSource,
    from_anthropic,
    from_deepseek,
    from_gemini,
    from_litellm,
    from_openai,
    from_openrouter,
    to_openai,
)
from pricing.book import Rates, price_from_mapping
from pricing.cost import Cost, compute, money

SETTINGS = settings(derandomize=True, max_examples=150, deadline=None, database=None)
NANO = Fraction(1, 10**9)
tokens = st.integers(min_value=0, max_value=10**10)


# -- SSE -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """An upstream stream as bytes, and what it says."""

    raw: bytes
    usage: dict[str, Any]
    finish_reason: str
    choice_events: int


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    texts = draw(st.lists(st.text(max_size=12), max_size=8))
    finish = draw(st.sampled_from(["stop", "length"]))
    prompt, output = draw(tokens), draw(tokens)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": draw(st.integers(0, prompt))},
    }
    usage_alone = draw(st.booleans())  # vLLM: a usage-only chunk; some servers: on the last

    def choice(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "finish_reason": finish_reason}

    chunks = [{"id": "c", "choices": [choice({"content": t}, None)]} for t in texts]
    last: dict[str, Any] = {"id": "c", "choices": [choice({}, finish)]}
    chunks.append(last if usage_alone else {**last, "usage": usage})
    if usage_alone:
        chunks.append({"id": "c", "choices": [], "usage": usage})
    events = [b"data: " + orjson.dumps(chunk) for chunk in chunks]
    for _ in range(draw(st.integers(0, 3))):  # keep-alive comments, anywhere
        events.insert(draw(st.integers(0, len(events))), b": keep-alive")
    events.append(b"data: [DONE]")
    raw = b"".join(event + eol + eol for event in events)
    return Stream(raw, usage, finish, len(texts) + 1)


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted({p % (len(raw) + 1) for p in points}), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(bounds)]


def read(reads: list[bytes]) -> tuple[list[bytes], StreamState]:
    """The events the relay sees from these reads, and what it learns from them."""
    splitter, state, events = EventSplitter(), StreamState(), []
    for data in reads:
        for event in splitter.feed(data):
            events.append(event)
            inspect(event, state)
    assert splitter.rest() == b""
    return events, state


@SETTINGS
@given(stream=streams(), points=st.lists(st.integers(min_value=0), max_size=40))
def test_any_cutting_of_a_stream_gives_the_same_events_usage_and_finish(
    stream: Stream, points: list[int]
) -> None:
    whole_events, whole = read([stream.raw])
    events, state = read(cut(stream.raw, points))
    assert events == whole_events
    assert state.usage == whole.usage == stream.usage
    assert state.finish_reason == whole.finish_reason == stream.finish_reason
    assert state.content_events == whole.content_events == stream.choice_events
    assert state.saw_done and whole.saw_done
    assert from_openai(state.usage) == from_openai(stream.usage)


@SETTINGS
@given(stream=streams())
def test_a_stream_read_a_byte_at_a_time_gives_the_same_usage(stream: Stream) -> None:
    _, state = read([stream.raw[i : i + 1] for i in range(len(stream.raw))])
    assert state.usage == stream.usage and state.finish_reason == stream.finish_reason


# -- usage normalisers -----------------------------------------------------------------------

NORMALISERS: list[Callable[[Mapping[str, Any] | None], Usage]] = [
    from_openai,
    from_anthropic,
    from_deepseek,
    from_gemini,
    from_openrouter,
    from_litellm,
]
KNOWN = [
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "cache_write_tokens",
    "cache_creation_tokens",
    "cache_creation_token_details",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation",
    "ephemeral_5m_input_tokens",
    "ephemeral_1h_input_tokens",
    "prompt_cache_hit_tokens",
    "promptTokenCount",
    "cachedContentTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "toolUsePromptTokenCount",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and infinities too: Python's json reads them, and litellm uses it
    st.text(max_size=5),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(KNOWN) | st.text(max_size=4), inner, max_size=5),
    ),
    max_leaves=20,
)
usages = st.dictionaries(st.sampled_from(KNOWN), scalars | values, max_size=10)


# Keys of at most four characters: no convention reads any of them.
noise = st.dictionaries(st.text(max_size=4), values, min_size=1, max_size=3)


@SETTINGS
@given(usage=st.one_of(st.none(), usages), extra=noise)
def test_every_normaliser_reads_any_json_by_its_own_fields_alone(
    usage: dict[str, Any] | None, extra: dict[str, Any]
) -> None:
    """Nothing or an empty object is missing usage; any other object is reported usage
    (its __post_init__ checked the invariants), the same with fields no convention reads."""
    for normalise in NORMALISERS:
        result = normalise(usage)
        if not usage:
            assert result == Usage.missing()
            assert normalise(extra) == Usage()  # reported, and nothing in it to count
            continue
        assert result.source is UsageSource.REPORTED
        assert result.cache_write_1h_tokens <= result.cache_write_tokens
        assert normalise({**extra, **usage}) == result


garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=-1),
    st.floats(),
    st.text(max_size=5),
    st.lists(tokens, max_size=2),
    st.dictionaries(st.text(max_size=3), tokens, max_size=2),
)


def as_count(value: Any) -> int:
    """The wire rule: a count is a non-negative number, a float counts its whole part;
    anything else (absent, negative, NaN, a string, a bool, a list...) counts as zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return max(int(value), 0)


@SETTINGS
@given(prompt=tokens | garbage, cached=tokens | garbage, output=tokens | garbage)
def test_vllm_usage_counts_malformed_counts_as_zero_and_never_caches_past_the_prompt(
    prompt: Any, cached: Any, output: Any
) -> None:
    usage = from_openai(
        {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
    )
    read = min(as_count(cached), as_count(prompt))
    assert usage == Usage(as_count(prompt) - read, read, 0, as_count(output))


@SETTINGS
@given(prompt=tokens, cached=tokens, output=tokens)
def test_openai_cached_tokens_are_inside_the_prompt(prompt: int, cached: int, output: int) -> None:
    wire = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    for normalise in (from_openai, from_deepseek, from_openrouter, from_litellm):
        usage = normalise(wire)
        assert usage.prompt_tokens == prompt and usage.output_tokens == output
        assert usage.cache_read_tokens == min(cached, prompt)


@SETTINGS
@given(fresh=tokens, read=tokens, write=tokens, hour=tokens, output=tokens)
def test_anthropic_cache_tokens_are_on_top_of_the_input(
    fresh: int, read: int, write: int, hour: int, output: int
) -> None:
    usage = from_anthropic(
        {
            "input_tokens": fresh,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": write,
            "cache_creation": {"ephemeral_1h_input_tokens": hour},
            "output_tokens": output,
        }
    )
    assert (usage.uncached_tokens, usage.cache_read_tokens) == (fresh, read)
    assert usage.cache_write_tokens == max(write, hour)
    assert usage.cache_write_1h_tokens == hour
    assert usage.prompt_tokens == fresh + read + max(write, hour)


@SETTINGS
@given(fresh=tokens, read=tokens, output=tokens)
def test_the_gateways_own_usage_reads_back_as_it_was(fresh: int, read: int, output: int) -> None:
    usage = Usage(uncached_tokens=fresh, cache_read_tokens=read, output_tokens=output)
    assert from_openai(to_openai(usage)) == usage
    assert from_litellm(to_openai(usage)) == usage


# -- price arithmetic ------------------------------------------------------------------------

# Rates as stored (Numeric(18, 9)): up to nine decimals, per million tokens.
rates = st.decimals(min_value=0, max_value=10**6, places=9, allow_nan=False, allow_infinity=False)


@st.composite
def usage_values(draw: st.DrawFn) -> Usage:
    write = draw(tokens)
    return Usage(
        uncached_tokens=draw(tokens),
        cache_read_tokens=draw(tokens),
        cache_write_tokens=write,
        output_tokens=draw(tokens),
        cache_write_1h_tokens=draw(st.integers(0, write)),
    )


@st.composite
def prices(draw: st.DrawFn) -> Rates:
    return Rates(
        input=draw(rates),
        cache_read=draw(rates),
        output=draw(rates),
        cache_write=draw(st.none() | rates),
        cache_write_1h=draw(st.none() | rates),
    )


def exact(tokens: int, rate: Fraction) -> Fraction:
    """tokens × rate / 1M to the nano-dollar, half to even, in rationals."""
    nanos = Fraction(tokens) * rate / 10**6 / NANO
    return Fraction(round(nanos)) * NANO  # Python's round() is half-to-even


def priced(usage: Usage, r: Rates) -> Cost:
    entry = {
        "model": "m",
        "effective_from": "2026-01-01",
        **{k: Decimal(v) for k, v in r.to_mapping().items()},
    }
    return compute(usage, price_from_mapping(entry))


@SETTINGS
@given(usage=usage_values(), r=prices())
def test_each_class_is_exact_to_the_nano_dollar_and_the_total_is_their_sum(
    usage: Usage, r: Rates
) -> None:
    cost = priced(usage, r)
    write_5m = r.cache_write if r.cache_write is not None else r.input
    write_1h = r.cache_write_1h if r.cache_write_1h is not None else write_5m
    hour = usage.cache_write_1h_tokens
    writes = Fraction(usage.cache_write_tokens - hour) * Fraction(write_5m)
    writes += Fraction(hour) * Fraction(write_1h)
    assert Fraction(cost.uncached) == exact(usage.uncached_tokens, Fraction(r.input))
    assert Fraction(cost.cache_read) == exact(usage.cache_read_tokens, Fraction(r.cache_read))
    assert Fraction(cost.cache_write) == exact(1, writes)  # the two write kinds rounded once
    assert Fraction(cost.output) == exact(usage.output_tokens, Fraction(r.output))
    assert cost.total == cost.uncached + cost.cache_read + cost.cache_write + cost.output
    for part in (cost.uncached, cost.cache_read, cost.cache_write, cost.output, cost.total):
        assert part.as_tuple().exponent == -9  # nano-dollars, as stored
    assert cost.uncached_equivalent == money(usage.prompt_tokens, r.input) + money(
        usage.output_tokens, r.output
    )
    assert cost.saved == cost.uncached_equivalent - cost.total


@SETTINGS
@given(requests=st.lists(usage_values(), min_size=1, max_size=20), r=prices())
def test_costs_add_up_without_drift_and_within_rounding_of_the_summed_tokens(
    requests: list[Usage], r: Rates
) -> None:
    costs = [priced(usage, r) for usage in requests]
    total = sum((c.total for c in costs), Decimal(0))
    assert Fraction(total) == sum((Fraction(c.total) for c in costs), Fraction(0))
    # Rounded once per class per request: at most half a nano-dollar each away from the
    # same tokens priced all at once.
    summed = Usage(
        uncached_tokens=sum(u.uncached_tokens for u in requests),
        cache_read_tokens=sum(u.cache_read_tokens for u in requests),
        cache_write_tokens=sum(u.cache_write_tokens for u in requests),
        output_tokens=sum(u.output_tokens for u in requests),
        cache_write_1h_tokens=sum(u.cache_write_1h_tokens for u in requests),
    )
    roundings = 4 * (len(requests) + 1)
    assert abs(Fraction(total) - Fraction(priced(summed, r).total)) <= roundings * NANO / 2


@SETTINGS
@given(a=tokens, b=tokens, rate=rates)
def test_more_tokens_never_cost_less(a: int, b: int, rate: Decimal) -> None:
    low, high = sorted((a, b))
    assert money(low, rate) <= money(high, rate)
    assert money(0, rate) == 0 and money(low, Decimal(0)) == 0


# -- what the gateway reads from clients and upstreams ---------------------------------------

FIELDS = [
    "model",
    "messages",
    "prompt",
    "role",
    "content",
    "text",
    "stream",
    "stream_options",
    "include_usage",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "cache_salt",
    "metadata",
    "interaction_id",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=25,
)


@SETTINGS
@given(body=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8))
def test_any_json_body_is_a_call_or_an_invalid_request(body: dict[str, Any]) -> None:
    for endpoint in Endpoint:
        try:
            call = parse_call(endpoint, body)
        except InvalidRequest as error:
            assert error.status == 400 and error.message
            continue
        assert call.model == body["model"] and call.prompt_chars >= 0


# The least body each endpoint serves: a member of another endpoint's (`stream_options` on
# Messages, `metadata` on embeddings) is unknown here, passed through and never read.
MINIMAL: dict[Endpoint, dict[str, Any]] = {
    Endpoint.CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    Endpoint.COMPLETIONS: {"prompt": "hi"},
    Endpoint.EMBEDDINGS: {"input": "hi"},
    Endpoint.RESPONSES: {"input": "hi"},
    Endpoint.MESSAGES: {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    Endpoint.COUNT_TOKENS: {"messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize("member", ["stream", "stream_options", "metadata", "user", "cache_salt"])
@pytest.mark.parametrize("value", [True, 1, 1.5, "x", [1], {"include_usage": True}])
def test_a_member_of_any_type_on_any_endpoint_is_a_call_or_a_400(
    endpoint: Endpoint, member: str, value: Any
) -> None:
    body = {"model": "m", **MINIMAL[endpoint], member: value}
    try:
        call = parse_call(endpoint, body)
    except InvalidRequest as error:
        assert error.status == 400 and (error.param or "").startswith(member)
        return
    assert call.body is body and call.body[member] == value  # passed on as it came


@pytest.mark.parametrize("endpoint", [Endpoint.EMBEDDINGS, Endpoint.COUNT_TOKENS])
def test_stream_where_the_endpoint_has_no_streams_is_passed_on_not_obeyed(
    endpoint: Endpoint,
) -> None:
    call = parse_call(endpoint, {"model": "m", **MINIMAL[endpoint], "stream": True})
    assert not call.stream and call.body["stream"] is True


@SETTINGS
@given(raw=st.binary(max_size=64) | json_values.map(orjson.dumps))
def test_any_bytes_are_a_json_object_or_an_invalid_request(raw: bytes) -> None:
    try:
        assert isinstance(parse_body(raw, limit=48), dict)
    except InvalidRequest as error:  # BodyTooLarge included
        assert error.status in (400, 413)


choice_values = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"index": st.integers(0, 3)},
        optional={
            "finish_reason": st.none() | st.sampled_from(["stop", "length", ""]) | json_values,
            "delta": st.fixed_dictionaries({"content": st.text(max_size=8)}),
        },
    ),
)
usage_values = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": tokens | garbage,
            "completion_tokens": tokens | garbage,
            "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": tokens | garbage}),
        },
    ),
)
chunks = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "choices": st.lists(choice_values, max_size=3) | json_values,
        "usage": usage_values,
    },
)


@SETTINGS
@given(chunk=chunks)
def test_an_event_gives_its_own_usage_and_finish_reason_and_is_held_only_if_usage_only(
    chunk: dict[str, Any],
) -> None:
    """What a stream's relay learns from one chunk, however malformed: the chunk's usage
    object, the last finish reason of its choices; it is held back (to be priced) only
    when it is usage with no choices."""
    state = StreamState()
    held = inspect(b"data: " + orjson.dumps(chunk) + b"\n\n", state)
    usage = chunk.get("usage")
    choices = chunk.get("choices")
    choices = choices if isinstance(choices, list) else []
    reasons = [
        c["finish_reason"] for c in choices if isinstance(c, dict) and c.get("finish_reason")
    ]
    reported = usage if isinstance(usage, dict) else None
    assert state.usage == reported
    if reported is not None or any(isinstance(r, str) for r in reasons):
        assert state.finish_reason == (str(reasons[-1]) if reasons else None)
    assert held == (chunk if reported is not None and not choices else None)
    assert not state.saw_done


def test_a_chunk_whose_usage_is_nested_deeper_is_passed_on_as_it_is() -> None:
    state = StreamState()
    chunk = b'data: {"id":"x","choices":[],"meta":{"usage":{"tokens":1}}}\n\n'
    assert (inspect(chunk, state), state.usage, state.content_events) == (None, None, 1)


@SETTINGS
@given(data=st.binary(max_size=40))
def test_an_event_that_is_not_json_teaches_the_relay_nothing_but_one_more_event(
    data: bytes,
) -> None:
    """Bytes that are not a JSON chunk are passed on as they are: no usage, no finish."""
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        if data.strip() == b"[DONE]":
            return  # the end of the stream, not a chunk
    else:
        return  # JSON: the property above
    for event in (b"data: " + data + b"\n\n", b'data: {"usage":{}, "choices": ' + data + b"}"):
        state = StreamState()
        assert inspect(event, state) is None
        assert (state.usage, state.finish_reason, state.saw_done) == (None, None, False)
