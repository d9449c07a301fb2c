"""Many gateways, exact mode: two `kvgate serve` instances (separate processes, journal
directories and databases, no peer link) behind an L4 balancer (nginx's stream module,
round robin per connection) in front of two replicas with KV events, real vLLM (marker
``vllm``) or `kvgate sim`. Every instance follows every replica's events, so:

- a conversation's turns, taken by either instance in turn, each go to the replica that
  holds the conversation, and every prediction equals what the replica reported;
- the hit rate equals one gateway's: the same sequence (another tenant, so another cache
  scope) sent through one instance alone hits the same tokens, request by request;
- each instance's hit-rate ceiling counts what the events announced, so no record's
  routing efficiency is above 100 %.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import select

from gateway.db.models import RequestRow
from gateway.db.session import make_engine
from tests.factories import config_file
from tests.support.processes import (
    Proc,
    cli_tenant,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    wait_http,
    wait_recorded,
)
from tests.support.vllm import SERVED_NAME
from tests.vllm.conftest import PRICED_AS, Backend
from tests.vllm.replicas import settle, text

pytestmark = pytest.mark.e2e
NGINX = Path("/usr/sbin/nginx")
STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")


@dataclass
class Balanced:
    balancer_url: str
    gateways: list[Proc]
    databases: list[str]
    keys: dict[str, str]
    replicas: list[tuple[str, str]]  # (url, replay endpoint)


def start_balancer(directory: Path, ports: list[int]) -> tuple[subprocess.Popen[bytes], str]:
    """nginx's stream module in front of the gateways: plain TCP, round robin."""
    if not STREAM_MODULE.exists():
        raise RuntimeError(
            f"no nginx stream module at {STREAM_MODULE}: apt-get install -y libnginx-mod-stream"
        )
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    upstreams = "".join(f"    server 127.0.0.1:{p};\n" for p in ports)
    config = directory / "nginx.conf"
    config.write_text(
        f"load_module {STREAM_MODULE};\n"
        f"daemon off;\nworker_processes 1;\npid {directory}/nginx.pid;\n"
        f"error_log {directory}/error.log warn;\n"
        "events { worker_connections 256; }\n"
        "stream {\n  upstream gateways {\n" + upstreams + "  }\n"
        f"  server {{ listen 127.0.0.1:{port}; proxy_pass gateways; }}\n}}\n"
    )
    process = subprocess.Popen(
        [str(NGINX), "-c", str(config), "-p", str(directory), "-e", str(directory / "error.log")],
        stdout=(directory / "out.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", timeout_s=15, process=process)
    return process, url


@pytest.fixture(scope="module")
def balanced(backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Balanced]:
    tmp = tmp_path_factory.mktemp(f"balanced-{backend.kind}")
    first = tmp / "gateway0.db"
    env = gateway_env(f"sqlite:///{first}", tmp / "journal0")
    kvgate("db", "upgrade", env=env)
    kvgate("prices", "sync", env=env)
    keys = {name: cli_tenant(env, name)[0] for name in ("balanced", "alone")}
    # The same tenants and keys in both instances' databases: one copied from the other.
    databases = [str(first), str(tmp / "gateway1.db")]
    shutil.copy(first, databases[1])
    replicas = backend.replicas
    config = config_file(
        tmp / "kvgate.yaml",
        [
            {
                "name": "chat",
                "replicas": [r.url for r in replicas],
                "kv_events": [
                    {"endpoint": r.events_endpoint, "replay_endpoint": r.replay_endpoint}
                    | {"topic": "kv"}
                    for r in replicas
                ],
                "upstream_model": SERVED_NAME,
                "price_model": PRICED_AS,
                "tokenizer": backend.tokenizer,
            }
        ],
    )
    gateways: list[Proc] = []
    balancer: subprocess.Popen[bytes] | None = None
    try:
        for n, database in enumerate(databases):
            instance_env = gateway_env(
                f"sqlite:///{database}",
                tmp / f"journal{n}",
                KVGATE_HEALTH_INTERVAL_S="0.3",
                KVGATE_LOAD_INTERVAL_S="0.3",
            )
            (tmp / f"gateway{n}").mkdir()
            gateways.append(start_gateway(tmp / f"gateway{n}", config, instance_env))
        balancer, url = start_balancer(
            tmp / "nginx", [int(g.url.rsplit(":", 1)[1]) for g in gateways]
        )
        yield Balanced(
            url,
            gateways,
            databases,
            keys,
            [(r.url, r.replay_endpoint) for r in replicas],
        )
    finally:
        if balancer is not None:
            balancer.terminate()
            balancer.wait(timeout=10)
        for gateway in gateways:
            gateway.stop()


def conversation_turns() -> list[tuple[int, list[dict[str, str]]]]:
    """Three conversations, three turns each, interleaved: (conversation, messages)."""
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": f"Conversation {c}: " + text(40 + c, 60)}] for c in range(3)
    ]
    turns = []
    for turn in range(3):
        for c, history in enumerate(histories):
            history.append({"role": "user", "content": f"Turn {turn}: " + text(c * 10 + turn, 25)})
            turns.append((c, list(history)))
            history.append({"role": "assistant", "content": "Noted: " + text(90 + turn, 8)})
    return turns


def send(balanced: Balanced, base_url: str, tenant: str) -> list[tuple[int, str]]:
    """The sequence one request at a time, a new connection each (so the balancer takes
    turns), every instance caught up on the replicas' events before each request."""
    client = openai.OpenAI(
        base_url=base_url + "/v1",
        api_key=balanced.keys[tenant],
        max_retries=0,
        http_client=httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)),
    )
    sent = []
    for conversation, messages in conversation_turns():
        for gateway in balanced.gateways:
            settle(gateway.url, "chat", balanced.replicas)
        raw = client.chat.completions.with_raw_response.create(
            model="chat",
            messages=messages,
            max_tokens=2,
            temperature=0,  # type: ignore[arg-type]
        )
        sent.append((conversation, raw.headers["x-request-id"]))
    return sent


def records(balanced: Balanced, ids: list[str]) -> dict[str, tuple[int, RequestRow]]:
    """Each request's record and the instance that wrote it."""
    found: dict[str, tuple[int, RequestRow]] = {}
    for n, (gateway, database) in enumerate(
        zip(balanced.gateways, balanced.databases, strict=True)
    ):
        wait_recorded(gateway.url)
        engine = make_engine(f"sqlite:///{database}")
        try:
            with engine.connect() as connection:
                for row in connection.execute(  # type: ignore[call-overload]
                    select(RequestRow).where(RequestRow.request_id.in_(ids))
                ):
                    found[row.request_id] = (n, row)
        finally:
            engine.dispose()
    return found


def test_instances_behind_a_balancer_route_as_one_and_hit_as_much(balanced: Balanced) -> None:
    through_balancer = send(balanced, balanced.balancer_url, "balanced")
    alone = send(balanced, balanced.gateways[0].url, "alone")
    time.sleep(0.2)
    both = records(balanced, [i for _, i in through_balancer])
    single = records(balanced, [i for _, i in alone])
    instances = [both[i][0] for _, i in through_balancer]
    print("instances", instances)
    assert set(instances) == {0, 1}  # the balancer took turns
    rows = [both[i][1] for _, i in through_balancer]
    # Every prediction, whichever instance made it, is what the replica reported.
    assert [r.predicted_cached_tokens for r in rows] == [r.cache_read_tokens for r in rows]
    # Each instance's ceiling saw the other's traffic (in the replicas' events): routing
    # efficiency is never above 100 % on either.
    assert all(r.ceiling_cached_tokens >= r.cache_read_tokens for r in rows)
    # A conversation's later turns go to the replica holding it, whoever takes them.
    home: dict[int, str] = {}
    for (conversation, _), row in zip(through_balancer, rows, strict=True):
        assert home.setdefault(conversation, row.upstream) == row.upstream
    later = [r.cache_read_tokens for (c, _), r in zip(through_balancer, rows, strict=True)][3:]
    assert all(cached > 0 for cached in later)
    # And the hit rate is one gateway's, request by request.
    alone_rows = [single[i][1] for _, i in alone]
    assert [r.cache_read_tokens for r in rows] == [r.cache_read_tokens for r in alone_rows]
    assert {single[i][0] for _, i in alone} == {0}
