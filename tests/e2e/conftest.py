"""A real stack on loopback: `kvgate sim` replicas, `kvgate serve`, tenants and their keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import _backends, new_database
from tests.factories import vllm
from tests.support.processes import free_port
from tests.support.stack import Stack, running_stack

MODEL = "kvgate/demo-llama-8b"
SOLO = "solo-llama"  # one replica: repeats always land on the same cache
DOWN = "down-llama"  # a replica nobody listens on
UNPRICED = "unpriced-llama"  # bills as a model the price book does not know
ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="module", params=_backends())
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("stack")
    with (
        new_database(request.param, tmp) as database_url,
        running_stack(
            tmp,
            database_url,
            # Tenants and keys made in process by the code the CLI runs (tests/test_cli.py
            # drives the commands): six CLI processes per stack cost CI about a minute.
            tenants=("alpha", "beta"),
            KVGATE_ADMIN_TOKEN=ADMIN_TOKEN,
            KVGATE_MAX_BODY_BYTES="65536",
        ) as stack,
    ):
        sims = stack.start_sims(3, extra=())
        same = {"price_model": MODEL, "upstream_model": MODEL}
        stack.configure(
            [
                vllm(MODEL, [sims[0].url, sims[1].url]),
                vllm(SOLO, [sims[2].url], **same),
                vllm(DOWN, [f"http://127.0.0.1:{free_port()}"], **same, connect_timeout_s=1),
                vllm(
                    UNPRICED, [sims[2].url], price_model="no-price-for-this", upstream_model=MODEL
                ),
            ]
        )
        stack.start_gateway()
        yield stack
