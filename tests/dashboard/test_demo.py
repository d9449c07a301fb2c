"""`kvgate demo` starts the dashboard and feeds the gateway a workload it can show.

The demo's router has the sims' tokenizer (``tokenizer: kvgate-sim``): its prompts are the
sims' prompts to the token and block, so every ceiling and prediction it records is exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.api.calls import Endpoint, parse_call
from gateway.auth import hash_key
from gateway.config import Deployment, load_deployments
from gateway.db.figures import spend
from gateway.db.models import ApiKeyRow, RequestRow, TenantRow
from gateway.db.session import make_engine
from gateway.db.statements import day_bounds
from gateway.routing.fleet import Fleet
from gateway.routing.prompts import Prompt
from gateway.routing.vllm_blocks import external
from gateway.serving.fleets import fleet_configs, prompt_tokenizer
from gateway.serving.prompts import routing_prompt
from gateway.tools import workload
from gateway.tools.demo import DEMO_MODEL
from gateway.tools.sim.hashing import block_hashes
from tests.support.processes import (
    Proc,
    call,
    free_port,
    kvgate,
    wait_http,
    wait_recorded,
)

pytestmark = pytest.mark.e2e


def router_prompt(config: Path, messages: list[dict[str, str]], salt: str) -> Prompt:
    """The prompt as the demo's router sees it, from the deployments file the demo wrote."""
    (deployment,) = load_deployments(config)
    assert isinstance(deployment, Deployment)
    call = parse_call(Endpoint.CHAT, {"model": DEMO_MODEL, "messages": messages})
    (fleet_config,) = fleet_configs([deployment]).values()
    fleet = Fleet(fleet_config, tokenizer=prompt_tokenizer(fleet_config.tokenizer))
    return fleet.hasher.prompt(routing_prompt(call), salt)


def sim_tokens(sim_port: int, messages: list[dict[str, str]]) -> list[int]:
    """The token ids a running sim makes of a chat (its /tokenize, as vLLM's)."""
    body = json.dumps({"model": DEMO_MODEL, "messages": messages}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{sim_port}/tokenize",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        tokens: list[int] = json.loads(reply.read())["tokens"]
    return tokens


def test_the_demo_serves_the_dashboard_with_tenants_retries_and_cache_hits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    port, dashboard, sim_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(
        {
            "KVGATE_DATABASE_URL": url,
            "KVGATE_JOURNAL_DIR": str(tmp_path / "journal"),
            "KVGATE_RECORDER_FLUSH_INTERVAL_S": "0.05",
            "KVGATE_MAX_HEADER_BYTES": "8192",
            "HOME": str(tmp_path),
        }
    )
    log = tmp_path / "demo.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "demo",
            "--port",
            str(port),
            "--sim-ports",
            f"{sim_port},{free_port()}",
            "--workdir",
            str(tmp_path / "demo"),
            "--dashboard-port",
            str(dashboard),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    demo = Proc(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_http(f"http://127.0.0.1:{dashboard}/_stcore/health", timeout_s=60, process=process)
        deadline = time.monotonic() + 90
        while "demo workload sent" not in demo.output():
            assert time.monotonic() < deadline and process.poll() is None, demo.output()
            time.sleep(0.2)
        wait_recorded(demo.url)
        # The demo's gateway is kvgate serve's server, with its limits (a head too large).
        status, _, _ = call(f"{demo.url}/v1/models", headers={"X-Padding": "x" * 9000})
        assert status == 431
        engine = make_engine(url)
        with engine.connect() as connection:
            tenants = set(connection.scalars(select(TenantRow.name)))
            by_status = dict(
                connection.execute(
                    select(RequestRow.status, func.count()).group_by(RequestRow.status)
                ).all()
            )
            cached = connection.scalar(select(func.sum(RequestRow.cache_read_tokens)))
            routed = connection.execute(
                select(
                    RequestRow.uncached_tokens + RequestRow.cache_read_tokens,
                    RequestRow.cache_read_tokens,
                    RequestRow.ceiling_cached_tokens,
                    RequestRow.ceiling_exact,
                ).where(RequestRow.ceiling_cached_tokens.is_not(None))
            ).all()
            with Session(engine) as session:
                figures = spend.by_tenant(
                    session, spend.Scope(*day_bounds(date(2000, 1, 1), date(2100, 1, 1)))
                )
            retried = connection.scalar(
                select(func.count()).select_from(
                    select(RequestRow.interaction_id)
                    .group_by(RequestRow.tenant_id, RequestRow.interaction_id)
                    .having(func.count(func.distinct(RequestRow.status)) > 1)
                    .subquery()
                )
            )
        engine.dispose()
        # The router and a running sim make the same tokens and blocks of every opening turn.
        config = tmp_path / "demo" / "kvgate.yaml"
        openings = [
            [{"role": "system", "content": workload.SYSTEM}, {"role": "user", "content": q[0]}]
            for q in workload.QUESTIONS
        ]
        opening_tokens = set()
        for messages in openings:
            prompt = router_prompt(config, messages, "a-salt")
            opening_tokens.add(prompt.prompt_tokens)
            tokens = sim_tokens(sim_port, messages)
            assert prompt.exact and prompt.prompt_tokens == len(tokens)
            assert prompt.hashes == [external(h) for h in block_hashes(tokens, 16, "a-salt")]
    finally:
        demo.stop(signal.SIGINT)  # Ctrl-C
    assert process.returncode == 0 and "Traceback" not in demo.output(), demo.output()
    assert {"demo", "acme", "globex", "initech"} <= tenants
    assert by_status["completed"] == 3 * 10  # 4 chats of 3, 2, 2 and 3 turns per tenant
    assert by_status["failed"] == 3  # one refused request per tenant ...
    assert retried == 3  # ... each retried within its interaction
    assert by_status.get("cancelled", 0) == 3
    assert cached and cached > 0  # the shared system prompt was served from cache
    # Every completed turn carries a ceiling counted in the sims' own tokens, at least what
    # they served (they also cache their answers' blocks, which the router never hashed).
    assert len(routed) == 30
    assert all(exact is True and read <= ceiling for _, read, ceiling, exact in routed)
    assert opening_tokens <= {prompt for prompt, _, _, _ in routed}
    assert {f.ceiling_kind for f in figures.values()} == {"exact"}
    assert all(
        f.routing_efficiency is not None and f.routing_efficiency <= 1 for f in figures.values()
    )


def test_the_demo_key_is_kept_and_minted_again_only_once_revoked(
    database_url: str, tmp_path: Path
) -> None:
    """`python -m gateway.tools.demo KEY_FILE` (what `make vllm-demo` prints its key with)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env["KVGATE_DATABASE_URL"] = database_url
    key_file = tmp_path / "var" / "api-key"

    def key() -> str:
        command = [sys.executable, "-m", "gateway.tools.demo", str(key_file)]
        return subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout

    first = key().strip()
    assert first.startswith("kvg-") and key().strip() == first
    assert key_file.read_text().strip() == first and key_file.stat().st_mode & 0o777 == 0o600
    engine = make_engine(database_url)
    with engine.connect() as connection:
        key_id = connection.scalar(
            select(ApiKeyRow.id).where(ApiKeyRow.key_hash == hash_key(first))
        )
    engine.dispose()
    kvgate("keys", "revoke", str(key_id), env=env)
    again = key().strip()
    assert again.startswith("kvg-") and again != first
    assert key_file.read_text().strip() == again
