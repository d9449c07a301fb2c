"""Any JSON in any field is a 4xx, never a 5xx: every JSON type in every position.

Each endpoint has an example body that holds every member its schema
(gateway/api/schemas.py) names. Hypothesis puts a value of each JSON type (null,
boolean, integer, number, string, array, object) in each position of it, or takes a
member away, or adds one it does not know, and sends the body to the real app: text-mode
and token-mode vLLM deployments (a kvgate sim) and a litellm deployment (the provider
emulator of tests/providers), all in this process (the app through httpx's ASGI
transport, the sim and the emulator on loopback, one event loop in a thread), so that
10,000 bodies take a minute, not an hour of subprocess round trips.

What must hold: no answer is a 5xx; a value whose JSON type its position does not take
(or a required member taken away) is a 400 that names that position in ``param``, the
same answer from every deployment.

An endpoint added later plugs in with its schema in ``SCHEMAS`` and an example body in
``EXAMPLES`` below.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.calls import SCHEMAS, Endpoint
from gateway.api.shapes import Kind, Shape, kind_of, paths, variant
from tests.reliability.inprocess import HOSTED, TEXT, TOKENS, App

BODIES = 10_000
PER_EXAMPLE = 50  # bodies per hypothesis example, sent concurrently
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)

PLAIN_CHAT = {
    "model": TEXT,
    "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say something."}]},
        {"role": "assistant", "content": "Something."},
        {"role": "user", "content": "Again."},
    ],
    "max_tokens": 2,
    "stream": False,
    "metadata": {"interaction_id": "plain-chat"},
}
PLAIN_COMPLETION = {"model": TEXT, "prompt": "Once upon a time", "max_tokens": 2}
RICH_CHAT = {
    "model": TEXT,
    "messages": [
        {"role": "system", "content": "Be terse.", "name": "rules"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                {"type": "video_url", "video_url": {"url": PNG, "detail": "low"}},
                {"type": "audio_url", "audio_url": {"url": PNG, "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {
                    "type": "file",
                    "file": {"file_id": "f", "file_data": "AAAA", "filename": "a.txt"},
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "Go on."},
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "look", "arguments": "{}"},
                }
            ],
            "function_call": {"name": "look", "arguments": "{}"},
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
    ],
    "stream": False,
    "stream_options": {"include_usage": True, "continuous_usage_stats": False},
    "max_tokens": 2,
    "max_completion_tokens": 2,
    "n": 1,
    "temperature": 0.5,
    "top_p": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logit_bias": {"50256": -100},
    "seed": 7,
    "stop": ["\n\n"],
    "user": "someone",
    "cache_salt": "salt",
    "metadata": {"interaction_id": "chat-1"},
    "service_tier": "auto",
    "logprobs": False,
    "top_logprobs": 0,
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "look",
                "description": "Look at it",
                "parameters": {"type": "object", "properties": {}},
                "strict": False,
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "look"}},
    "parallel_tool_calls": True,
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "description": "the answer",
            "schema": {"type": "object"},
            "strict": False,
        },
    },
    "functions": [{"name": "look", "description": "Look", "parameters": {}, "strict": None}],
    "function_call": {"type": "function", "function": {"name": "look"}},
    "modalities": ["text"],
    "reasoning_effort": "low",
    "store": False,
}
RICH_COMPLETION = {
    "model": TEXT,
    "prompt": ["Once upon", "a time"],
    "stream": False,
    "stream_options": {"include_usage": True, "continuous_usage_stats": False},
    "max_tokens": 2,
    "n": 1,
    "temperature": 0.5,
    "top_p": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logit_bias": {"50256": -100},
    "seed": 7,
    "stop": ["\n\n", "The end"],
    "user": "someone",
    "cache_salt": "salt",
    "metadata": {"interaction_id": "text-1"},
    "service_tier": "auto",
    "echo": False,
    "logprobs": 0,
    "best_of": 1,
    "suffix": "The end.",
}
# Per endpoint: a body with every member its schema names (the replica may refuse some of
# them), and a plain one that every deployment serves.
RICH_EMBEDDINGS = {
    "model": TEXT,
    "input": "embed this sentence",
    "encoding_format": "float",
    "dimensions": 8,
    "user": "user-1",
    "cache_salt": "my-salt",
}
PLAIN_EMBEDDINGS = {"model": TEXT, "input": ["one", "two"]}
RICH_RESPONSES = {
    "model": TEXT,
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "found"},
        {"role": "user", "content": "Go on."},
    ],
    "instructions": "Be brief.",
    "stream": False,
    "store": True,
    "previous_response_id": None,
    "max_output_tokens": 2,
    "temperature": 0.5,
    "top_p": 1.0,
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look it up.",
            "parameters": {"type": "object"},
            "strict": False,
        }
    ],
    "metadata": {"interaction_id": "json-types"},
    "user": "user-1",
    "cache_salt": "my-salt",
}
PLAIN_RESPONSES = {"model": TEXT, "input": "Once upon a time", "max_output_tokens": 2}


def ephemeral() -> dict[str, str]:
    """A cache_control of its own (a shared dict would change in every place at once)."""
    return {"type": "ephemeral", "ttl": "5m"}


ANTHROPIC_PROMPT = {
    "model": TEXT,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": ephemeral()}],
    "messages": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi.", "cache_control": ephemeral()}],
        },
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Go on."},
    ],
    "tools": [
        {
            "name": "lookup",
            "description": "Looks things up.",
            "input_schema": {"type": "object"},
            "cache_control": ephemeral(),
        }
    ],
    "cache_salt": "my-salt",
}
RICH_MESSAGES = {
    **ANTHROPIC_PROMPT,
    "max_tokens": 2,
    "stream": False,
    "temperature": 0.5,
    "top_p": 1.0,
    "top_k": 5,
    "stop_sequences": ["The end."],
    "metadata": {"user_id": "user-1", "interaction_id": "json-types"},
}
PLAIN_MESSAGES = {"model": TEXT, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]}
EXAMPLES: dict[Endpoint, list[dict[str, Any]]] = {
    Endpoint.CHAT: [RICH_CHAT, PLAIN_CHAT],
    Endpoint.COMPLETIONS: [RICH_COMPLETION, PLAIN_COMPLETION],
    Endpoint.EMBEDDINGS: [RICH_EMBEDDINGS, PLAIN_EMBEDDINGS],
    Endpoint.RESPONSES: [RICH_RESPONSES, PLAIN_RESPONSES],
    Endpoint.MESSAGES: [RICH_MESSAGES, PLAIN_MESSAGES],
    Endpoint.COUNT_TOKENS: [
        ANTHROPIC_PROMPT,
        {"model": TEXT, "messages": [{"role": "user", "content": "Hi."}]},
    ],
}
# The deployments every body of an endpoint goes to (the hosted one serves chat only: a
# 400 for the others, never a 5xx).
TARGETS: dict[Endpoint, tuple[str, ...]] = {
    endpoint: (TEXT, TOKENS, HOSTED) for endpoint in EXAMPLES
}

# -- positions and values -------------------------------------------------------------------

Path_ = tuple[str | int, ...]


def positions(value: Any, at: Path_ = ()) -> Iterator[Path_]:
    """Every member and element of a JSON value, outermost first."""
    if at:
        yield at
    if isinstance(value, dict):
        for name, member in value.items():
            yield from positions(member, (*at, name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from positions(item, (*at, index))


def param(at: Path_) -> str:
    """A position as the gateway names it: ``messages[2].content``."""
    text = ""
    for step in at:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def shape_at(schema: Shape, body: Any, at: Path_) -> Shape | None:
    """The shape a position of ``body`` is checked as (objects by their variant); None
    where it passes through unchecked."""
    shape: Shape | None = schema
    value = body
    for step in at:
        if shape is None:
            return None
        if isinstance(step, int):
            shape = shape.items
        else:
            if isinstance(value, dict):
                shape = variant(shape, value)
            shape = shape.fields.get(step, shape.values)
        value = value[step] if _has(value, step) else None
    return shape


def _has(value: Any, step: str | int) -> bool:
    if isinstance(value, dict):
        return step in value
    return isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value)


def put(body: dict[str, Any], at: Path_, value: Any) -> None:
    target: Any = body
    for step in at[:-1]:
        target = target[step]
    target[at[-1]] = value


def take(body: dict[str, Any], at: Path_) -> None:
    target: Any = body
    for step in at[:-1]:
        target = target[step]
    del target[at[-1]]


KEYS = st.sampled_from(["type", "text", "role", "content", "url", "name", "id"]) | st.text(
    max_size=6
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
OF_KIND: dict[Kind, st.SearchStrategy[Any]] = {
    Kind.NULL: st.none(),
    Kind.BOOLEAN: st.booleans(),
    Kind.INTEGER: st.integers(min_value=-(2**63), max_value=2**64 - 1),
    Kind.NUMBER: st.floats(allow_nan=False, allow_infinity=False),
    Kind.STRING: st.text(max_size=16),
    Kind.ARRAY: st.lists(json_values, max_size=4),
    Kind.OBJECT: st.dictionaries(KEYS, json_values, max_size=4),
}


@dataclass(frozen=True)
class Mutation:
    """One body: an endpoint's example with one position changed."""

    endpoint: Endpoint
    example: int
    at: Path_
    how: str  # "set", "delete" or "add"
    value: Any = None

    def body(self) -> dict[str, Any]:
        body = copy.deepcopy(EXAMPLES[self.endpoint][self.example])
        if self.how == "delete":
            take(body, self.at)
        else:
            put(body, self.at, self.value)
        return body


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    endpoint = draw(st.sampled_from(list(EXAMPLES)))
    number = draw(st.integers(0, len(EXAMPLES[endpoint]) - 1))
    example = EXAMPLES[endpoint][number]
    at = draw(st.sampled_from(list(positions(example))))
    how = draw(st.sampled_from(["set"] * 8 + ["delete", "add"]))
    if how == "delete":
        return Mutation(endpoint, number, at, how)
    if how == "add":  # a member the schema does not know, anywhere an object is
        parent = at[:-1]
        while parent and not isinstance(lookup(example, parent), dict):
            parent = parent[:-1]
        name = "x_" + draw(st.text(max_size=4))
        return Mutation(endpoint, number, (*parent, name), how, draw(json_values))
    kind = draw(st.sampled_from(list(Kind)))
    return Mutation(endpoint, number, at, how, draw(OF_KIND[kind]))


def lookup(value: Any, at: Path_) -> Any:
    for step in at:
        value = value[step]
    return value


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    with App(tmp_path_factory.mktemp("json-types")) as running:
        yield running


# -- the property ---------------------------------------------------------------------------


def expected_refusal(mutation: Mutation, sent: dict[str, Any]) -> str | None:
    """The param of the 400 this body must get, if its change breaks its schema's types
    (the rest of the example is valid, so this is the first and only fault)."""
    schema = SCHEMAS[mutation.endpoint]
    if mutation.how == "add":
        return None
    if mutation.how == "delete":
        parent = shape_at(schema, sent, mutation.at[:-1])
        holder = lookup(sent, mutation.at[:-1])
        if parent is not None and isinstance(holder, dict):
            parent = variant(parent, holder)
        required = parent is not None and mutation.at[-1] in parent.required
        return param(mutation.at) if required else None
    shape = shape_at(schema, sent, mutation.at)
    kind = kind_of(lookup(sent, mutation.at))  # as the gateway reads it (a huge int: float)
    return None if shape is None or shape.accepts(kind) else param(mutation.at)


async def judge(app: App, mutation: Mutation, statuses: Counter[int]) -> list[str]:
    """Send one body to each deployment of its endpoint; what went wrong, if anything."""
    raw = json.dumps(mutation.body()).encode()  # json: integers past 64 bits, as clients do
    sent = orjson.loads(raw)
    expected = expected_refusal(mutation, sent)
    answers, wrong = [], []
    for model in TARGETS[mutation.endpoint]:
        if mutation.at != ("model",):
            sent["model"] = model
        status, reply = await app.post(mutation.endpoint, orjson.dumps(sent))
        answers.append((status, reply))
        statuses[status] += 1
        if status >= 500:
            wrong.append(f"{model}: {status} {reply}")
    if expected is not None:
        if {status for status, _ in answers} != {400}:
            wrong.append(f"expected 400s naming {expected!r}, got {answers}")
        elif named(mutation.endpoint, answers[0][1]) != expected:
            wrong.append(f"expected param {expected!r}, got {answers[0][1]}")
        elif len({json.dumps(reply, sort_keys=True) for _, reply in answers}) != 1:
            wrong.append(f"the deployments disagree: {answers}")
        else:
            statuses[-400] += 1  # refused as expected
    return wrong


def named(endpoint: Endpoint, reply: dict[str, Any]) -> Any:
    """The position a 400 names: OpenAI's ``param``; in Anthropic's shape, which has none,
    the quoted position its message starts with."""
    error = reply["error"]
    if not endpoint.anthropic:
        return error["param"]
    assert reply["type"] == "error" and sorted(error) == ["message", "type"], reply
    message: str = error["message"]
    return message.split("'")[1] if message.startswith("'") else message


def pattern(at: Path_) -> str:
    """A position with its indices left out: ``messages[].content[].text``."""
    text = ""
    for step in at:
        text += "[]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def test_every_schema_position_is_in_its_example_body() -> None:
    """So that every position a schema names is tried: a member added to a schema
    without its example fails here."""
    for endpoint, schema in SCHEMAS.items():
        covered = {pattern(at) for body in EXAMPLES[endpoint] for at in positions(body)}
        missing = [
            named
            for named in paths(schema)
            if not (
                named in covered
                or (named.endswith(".*") and any(c.startswith(named[:-1]) for c in covered))
            )
        ]
        assert missing == [], endpoint


def test_any_json_in_any_field_is_a_4xx_naming_the_field(app: App) -> None:
    statuses: Counter[int] = Counter()
    wrong: list[tuple[Mutation, list[str]]] = []
    sent = [0]

    @settings(
        max_examples=BODIES // PER_EXAMPLE,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=st.lists(mutations(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def check(batch: list[Mutation]) -> None:
        async def all_of() -> list[list[str]]:
            return await asyncio.gather(*(judge(app, m, statuses) for m in batch))

        found = [(m, w) for m, w in zip(batch, app.run(all_of()), strict=True) if w]
        sent[0] += len(batch)
        wrong.extend(found)
        assert found == []

    check()
    refused = statuses.pop(-400, 0)
    print(
        f"\n{sent[0]} bodies, {sum(statuses.values())} requests: statuses "
        f"{dict(sorted(statuses.items()))}; {refused} bodies refused naming the changed position"
    )
    assert wrong == []
    assert sent[0] >= BODIES
    assert not [status for status in statuses if status >= 500]
    assert statuses[200] > 0 and refused > 0
