"""/v1/embeddings on a vLLM deployment, against `kvgate sim` and real vLLM (marker ``vllm``),
with the official ``openai`` client: the tokens billed are those the replica itself counts,
priced at the entry's input rate to the nano-dollar, in the answer, its header, its record
and the tenant's statement, on a line of its own endpoint.

Real vLLM serves the tiny Llama as an embedding model (``--runner pooling --convert embed``:
the last token's normalised hidden state), a third server beside the backend's two; a
`kvgate sim` replica embeds beside generating, so the sim backend's first replica serves.
A second `kvgate serve` (its own journal, the stack's database) fronts it: whatever the
gateway adds to the body (the tenant's ``cache_salt``, the served model's name) and what a
client sends beyond the endpoint's members reach the real replica, which must accept them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import openai
import pytest

from gateway.db.session import session_factory, transaction
from tests.factories import config_file, demo_cost, tenant
from tests.support.processes import Proc, start_gateway, wait_recorded
from tests.support.statements import Seen
from tests.support.vllm import SERVED_NAME, VllmServer, launch_vllm, wait_ready
from tests.vllm.conftest import PRICED_AS, ExactStack
from tests.vllm.replicas import replica_tokens, text

EMBEDDING = ("--runner", "pooling", "--convert", "embed")
HIDDEN = 128  # the tiny model's: real vLLM's vectors (the sim's have 16 dimensions)


@dataclass
class Embedder:
    replica: str  # the URL of the replica that embeds
    gateway: Proc
    dimensions: int
    started_s: float


@pytest.fixture(scope="module")
def embedder(stack: ExactStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedder]:
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp(f"embed-{stack.backend.kind}")
    server: VllmServer | None = None
    if stack.backend.kind == "vllm":
        # The backend's deployments' tokenizer is the tiny model's directory: served again.
        model = Path(stack.backend.tokenizer)
        server = wait_ready(launch_vllm(tmp / "vllm", model, extra_args=EMBEDDING))
        replica, dimensions = server.url, HIDDEN
    else:
        replica, dimensions = stack.backend.replicas[0].url, 16
    config = config_file(
        tmp / "kvgate.yaml",
        [
            {
                "name": "tiny-embed",
                "replicas": [replica],
                "upstream_model": SERVED_NAME,
                "price_model": PRICED_AS,
                "tokenizer": stack.backend.tokenizer,
                "connect_timeout_s": 2,
            }
        ],
    )
    try:
        gateway = start_gateway(tmp, config, {**stack.env, "KVGATE_JOURNAL_DIR": str(tmp / "j")})
    except BaseException:
        if server is not None:
            server.stop()
        raise
    try:
        yield Embedder(replica, gateway, dimensions, time.monotonic() - started)
    finally:
        gateway.stop()
        if server is not None:
            server.stop()


def test_embeddings_bill_the_replicas_own_token_count_at_the_input_rate(
    stack: ExactStack, embedder: Embedder
) -> None:
    with transaction(session_factory(stack.engine)) as session:
        key = tenant(session, f"embeddings-{stack.backend.kind}").key
    client = openai.OpenAI(base_url=embedder.gateway.url + "/v1", api_key=key, max_retries=0)
    one = text(7401, 24)
    several = [text(7402, 9), text(7403, 30), "three"]
    seen = Seen()
    asked = [
        # The SDK's default: base64 vectors, decoded by the client.
        {"input": one},
        # A list, a client salt (folded under the tenant's), an end user, and members of
        # other endpoints that the gateway passes on unread.
        {
            "input": several,
            "encoding_format": "float",
            "user": "reader-7",
            "extra_body": {
                "cache_salt": "reader-salt",
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        },
    ]
    for request in asked:
        raw = client.embeddings.with_raw_response.create(model="tiny-embed", **request)  # type: ignore[arg-type]
        reply = raw.parse()
        inputs = request["input"] if isinstance(request["input"], list) else [request["input"]]
        counted = sum(len(replica_tokens(embedder.replica, prompt=p)) for p in inputs)
        assert [d.index for d in reply.data] == list(range(len(inputs)))
        assert {len(d.embedding) for d in reply.data} == {embedder.dimensions}
        usage = reply.usage
        assert (usage.prompt_tokens, usage.total_tokens) == (counted, counted)
        cost = (usage.model_extra or {})["cost"]
        # Input tokens at the entry's input rate, nothing read from cache, nothing generated.
        assert Decimal(cost) == demo_cost(counted, 0, 0) > 0
        assert raw.headers["x-kvgate-cost"] == cost
        assert raw.headers["x-kvgate-cached-tokens"] == "0"
        row = stack.row(raw.headers["x-request-id"])
        assert (row.status, row.endpoint, row.upstream) == (
            "completed",
            "/v1/embeddings",
            embedder.replica,
        )
        assert (row.uncached_tokens, row.cache_read_tokens, row.output_tokens) == (counted, 0, 0)
        assert row.end_user == request.get("user")
        assert Decimal(row.cost_total) == demo_cost(counted, 0, 0)
        seen.add("/v1/embeddings", uncached=counted, cached=0, output=0, cost=cost)
    wait_recorded(embedder.gateway.url)
    seen.check(stack.statement(key, via=embedder.gateway.url))
