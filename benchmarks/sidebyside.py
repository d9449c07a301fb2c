"""kvgate beside the LiteLLM proxy and beside no gateway at all, in one run (issue #8).

The upstream is nginx answering every chat completion with a fixed reply (JSON, or
server-sent events ending in a usage chunk with cached tokens), so it cannot be the
bottleneck. In turn, on the same upstream: direct; kvgate (recording into a scratch
Postgres database, kv-aware routing over 3 replica URLs, a tenant key, metrics); the
LiteLLM proxy (one worker, no database, LITELLM_OFFLINE_MODE=true). Each gateway runs
alone on core 0 (every thread and child process); nginx, wrk and this script's own
clients share core 1. Scenarios: wrk non-streaming at concurrency 1 and 32, wrk streaming
whole response at concurrency 1, time to the first streamed event (aiohttp, c=1), and an
open-loop rate sweep for the highest rate held with p99 under 25 ms. Afterwards every
request kvgate answered 200 must have its record, with usage and cost.

kvgate's hosted path is measured too (unless --skip-hosted), in the same gateway process:
a hosted deployment (``openai/bench`` with an ``api_base``) whose provider is the same
nginx, standing in for any OpenAI-wire provider, served over the provider's own wire as
the vLLM path is; every scenario but the sweep, printed beside the vLLM path's figures.

Setup (Debian's wrk and nginx, LiteLLM in .venv-litellm): `make bench-deps`. Then

    .venv/bin/python benchmarks/sidebyside.py [--duration 10] [--skip-litellm] [--skip-hosted]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from urllib.request import urlopen

import orjson
import uvloop
import yaml
from sqlalchemy import create_engine, func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.load import (
    JSON_MODEL,
    SSE_MODEL,
    Figures,
    Target,
    first_event,
    sweep,
    wrk,
)
from benchmarks.overhead import scratch_database
from benchmarks.sidebyside_table import SCENARIOS, hosted_table, table
from gateway.db.models import RequestRow
from gateway.db.session import normalise_url
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LITELLM = ROOT / ".venv-litellm" / "bin" / "litellm"
PRICE_MODEL = "kvgate/demo-llama-8b"  # pricing/catalog/demo.yaml
PROMPT, CACHED, OUTPUT = 120, 96, 3  # the fixed replies' usage
HOSTED_JSON, HOSTED_SSE = "bench-hosted-json", "bench-hosted-sse"
GATEWAY_CORE, LOAD_CORE = 0, 1


def reply_bodies() -> tuple[bytes, bytes]:
    """The upstream's fixed replies: a chat completion, and the same as a stream."""
    usage = {
        "prompt_tokens": PROMPT,
        "completion_tokens": OUTPUT,
        "total_tokens": PROMPT + OUTPUT,
        "prompt_tokens_details": {"cached_tokens": CACHED},
    }
    head = {"id": "chatcmpl-bench", "created": 1764400000, "model": "bench"}
    message = {"role": "assistant", "content": "Short answer."}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    whole = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
    chunk = {**head, "object": "chat.completion.chunk"}
    deltas = [{"role": "assistant", "content": ""}, {"content": "Short"}, {"content": " answer."}]
    events = [
        {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]
    events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events.append({**chunk, "choices": [], "usage": usage})
    stream = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return orjson.dumps(whole), stream


@contextlib.contextmanager
def on_core(core: int) -> Iterator[None]:
    """Processes started inside inherit this core for every thread and child they make."""
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, {LOAD_CORE})


def cores_of_tree(pid: int) -> set[str]:
    """Cpus_allowed_list of every thread of a process and of its children."""
    seen: set[str] = set()
    pending = [pid]
    while pending:
        proc = Path(f"/proc/{pending.pop()}")
        for task in proc.glob("task/*"):
            with contextlib.suppress(OSError):
                status = (task / "status").read_text()
                seen.add(status.split("Cpus_allowed_list:")[1].split()[0])
                pending += [int(c) for c in (task / "children").read_text().split()]
    return seen


def start_nginx(tmp: Path, json_ports: list[int], sse_ports: list[int]) -> Proc:
    json_body, sse_body = reply_bodies()
    models = orjson.dumps(
        {"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]}
    )
    metrics = "vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n"

    def quoted(text: bytes | str) -> str:
        raw = text.decode() if isinstance(text, bytes) else text
        return raw.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")

    def listen(ports: list[int]) -> str:
        return "\n".join(f"        listen 127.0.0.1:{port};" for port in ports)

    fields = {
        "DIR": str(tmp),
        "JSON_LISTEN": listen(json_ports),
        "SSE_LISTEN": listen(sse_ports),
        "JSON_BODY": quoted(json_body),
        "SSE_BODY": quoted(sse_body),
        "MODELS": quoted(models),
        "METRICS": quoted(metrics),
    }
    config = (HERE / "nginx" / "upstream.conf.template").read_text()
    for name, value in fields.items():
        config = config.replace(f"@{name}@", value)
    (tmp / "nginx.conf").write_text(config)
    log = tmp / "nginx.out"
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    command = [nginx, "-c", str(tmp / "nginx.conf"), "-p", str(tmp), "-g", "daemon off;"]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{json_ports[0]}"
    wait_http(url + "/health", process=process)
    return Proc(process, url, log)


def bench_tenant(database_url: str, tmp: Path, **extra: str) -> tuple[dict[str, str], str]:
    """The benchmark gateway's environment over a migrated database with prices, and the
    key of its one tenant (``extra``: more environment, for the CLI calls too)."""
    env = gateway_env(
        database_url,
        tmp / "journal",
        KVGATE_LOG_LEVEL="error",
        KVGATE_RECORDER_FLUSH_INTERVAL_S="0.2",
        KVGATE_KEY_REFRESH_S="5",
        KVGATE_PRICE_REFRESH_S="30",
        **extra,
    )
    kvgate("db", "upgrade", env=env)
    kvgate("prices", "sync", env=env)
    key, _ = cli_tenant(env, "bench")
    return env, key


def start_litellm(tmp: Path, upstream_json: str, upstream_sse: str, key: str) -> Proc:
    def model(name: str, upstream: str) -> dict[str, object]:
        return {
            "model_name": name,
            "litellm_params": {"model": f"openai/{name}", "api_base": upstream + "/v1"},
            # Priced like kvgate's model, so both compute a cost per request.
            "model_info": {
                "input_cost_per_token": 2e-7,
                "cache_read_input_token_cost": 2e-8,
                "output_cost_per_token": 6e-7,
            },
        }

    config = {
        "model_list": [model(JSON_MODEL, upstream_json), model(SSE_MODEL, upstream_sse)],
        "general_settings": {"master_key": key},
        "litellm_settings": {"telemetry": False},
    }
    path = tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "LITELLM"))}
    env |= {"LITELLM_OFFLINE_MODE": "true", "OPENAI_API_KEY": "none", "LITELLM_LOG": "ERROR"}
    port = free_port()
    log = tmp / "litellm.log"
    command = [str(LITELLM), "--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--num_workers", "1"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health/liveliness", timeout_s=180, process=process)
    except Exception:
        print(log.read_text(errors="replace")[-3000:])
        raise
    return Proc(process, url, log)


def measure(
    target: Target, tmp: Path, args: argparse.Namespace, *, open_loop: bool = True
) -> tuple[dict[str, Figures], int]:
    """Every scenario against one target (the sweep only if ``open_loop``); also the 200s
    it answered, warm-ups included."""
    print(f"measuring {target.name} ...", flush=True)
    seconds = args.duration

    def closed(*, stream: bool, concurrency: int, seconds: int) -> Figures:
        figures = wrk(target, tmp, stream=stream, concurrency=concurrency, seconds=seconds)
        # wrk leaves up to one request per connection behind, which a gateway that does
        # not cancel on disconnect still serves: about one p99 of work. Let it drain.
        time.sleep(min(30.0, max(0.5, 2 * figures.p99_ms / 1000 if figures.ok else 10.0)))
        return figures

    warm = [
        closed(stream=False, concurrency=32, seconds=1),
        closed(stream=True, concurrency=1, seconds=1),
    ]
    figures = {
        SCENARIOS[0]: closed(stream=False, concurrency=1, seconds=seconds),
        SCENARIOS[1]: closed(stream=False, concurrency=32, seconds=seconds),
        SCENARIOS[2]: closed(stream=True, concurrency=1, seconds=seconds),
        SCENARIOS[3]: uvloop.run(first_event(target, seconds)),
    }
    answered = sum(f.ok for f in warm) + sum(f.ok for f in figures.values())
    if not open_loop:
        return figures, answered
    # From a quarter of what one connection got (at most an eighth of the ceiling).
    start = args.sweep_start or max(5.0, min(args.sweep_max / 8, figures[SCENARIOS[0]].rps / 4))
    top, cpu, swept = sweep(target, args.sweep_step, round(start), args.sweep_max)
    figures[SCENARIOS[4]] = top
    top.note = ", ".join(filter(None, [top.note, f"load generator {cpu:.0%} of its core"]))
    return figures, answered + swept


def check_records(
    database_url: str, answered: int, models: tuple[str, ...] = (JSON_MODEL, SSE_MODEL)
) -> dict[str, int | str]:
    """Records of ``models`` in the scratch database against the 200s kvgate gave them."""
    engine = create_engine(normalise_url(database_url))
    completed = (RequestRow.status == "completed") & RequestRow.model.in_(models)
    exact = (
        (RequestRow.uncached_tokens == PROMPT - CACHED)
        & (RequestRow.cache_read_tokens == CACHED)
        & (RequestRow.output_tokens == OUTPUT)
        & (RequestRow.cost_total > 0)
    )
    with engine.connect() as connection:
        mine = RequestRow.model.in_(models)
        rows = connection.scalar(select(func.count()).where(mine)) or 0
        done = connection.scalar(select(func.count()).where(completed)) or 0
        billed = connection.scalar(select(func.count()).where(completed & exact)) or 0
        replicas = func.count(func.distinct(RequestRow.upstream))
        routed = connection.execute(
            select(RequestRow.model, RequestRow.policy, replicas)
            .where(mine)
            .group_by(RequestRow.model, RequestRow.policy)
            .order_by(RequestRow.model)
        ).all()
    engine.dispose()
    # wrk stops mid-request: a request it cut off may still complete and be recorded.
    return {
        "answered_200": answered,
        "records": rows,
        "completed_records": done,
        "completed_with_usage_and_cost": billed,
        "missing": max(0, answered - billed),
        "replicas used": ", ".join(f"{model} {policy} {n} of 3" for model, policy, n in routed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/test",
        help="a Postgres server; a fresh database is created in it and dropped",
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per scenario")
    parser.add_argument("--sweep-step", type=float, default=5.0, help="seconds per sweep rate")
    parser.add_argument(
        "--sweep-start",
        type=float,
        default=None,
        help="first rate, req/s (default: a quarter of the target's json c=1 req/s)",
    )
    parser.add_argument("--sweep-max", type=float, default=8000.0, help="highest rate tried")
    parser.add_argument("--skip-litellm", action="store_true", help="leave the LiteLLM proxy out")
    parser.add_argument("--skip-hosted", action="store_true", help="leave kvgate's hosted path out")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores: the gateway on one, the upstream and the load on the other")
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            sys.exit(f"{tool} is missing: make bench-deps")
    if not args.skip_litellm and not LITELLM.exists():
        sys.exit(f"{LITELLM} is missing: make bench-deps (or --skip-litellm)")

    os.sched_setaffinity(0, {LOAD_CORE})
    tmp = Path(tempfile.mkdtemp(prefix="kvgate-sidebyside-"))
    json_ports, sse_ports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    results: dict[str, dict[str, Figures]] = {}
    extra: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        nginx = start_nginx(tmp, json_ports, sse_ports)
        stack.callback(nginx.stop)
        json_urls = [f"http://127.0.0.1:{p}" for p in json_ports]
        sse_urls = [f"http://127.0.0.1:{p}" for p in sse_ports]
        direct = Target("direct", sse_urls[0], "none", json_base=json_urls[0])
        results["direct"], _ = measure(direct, tmp, args)

        database_url = stack.enter_context(scratch_database(args.database_url, "kvgate_sbs_"))
        env, key = bench_tenant(database_url, tmp)
        models: list[dict[str, object]] = [
            {"name": name, "replicas": urls, "policy": "kv-aware", "price_model": PRICE_MODEL}
            for name, urls in ((JSON_MODEL, json_urls), (SSE_MODEL, sse_urls))
        ]
        # The hosted path: nginx standing in for an OpenAI-wire provider (no key asked).
        models += [
            {
                "name": name,
                "backend": "litellm",
                "litellm_model": "openai/bench",
                "api_base": url + "/v1",
                "price_model": PRICE_MODEL,
            }
            for name, url in ((HOSTED_JSON, json_urls[0]), (HOSTED_SSE, sse_urls[0]))
        ]
        config = config_file(tmp / "kvgate.yaml", models)
        with on_core(GATEWAY_CORE):
            gateway = start_gateway(tmp, config, env, port=free_port())
        try:
            extra["kvgate_cores"] = sorted(cores_of_tree(gateway.process.pid))
            results["kvgate"], answered = measure(Target("kvgate", gateway.url, key), tmp, args)
            hosted_answered = 0
            if not args.skip_hosted:
                hosted = Target("hosted", gateway.url, key, HOSTED_JSON, HOSTED_SSE)
                results["kvgate hosted"], hosted_answered = measure(
                    hosted, tmp, args, open_loop=False
                )
            wait_recorded(gateway.url, timeout_s=120)
            records = check_records(database_url, answered)
            extra["records"] = records
            if not args.skip_hosted:
                hosted_records = check_records(
                    database_url, hosted_answered, (HOSTED_JSON, HOSTED_SSE)
                )
                extra["hosted_records"] = hosted_records
            with contextlib.suppress(OSError), urlopen(gateway.url + "/metrics") as reply:
                extra["kvgate_metrics_bytes"] = len(reply.read())
        finally:
            gateway.stop()

        if not args.skip_litellm:
            master = "sk-bench-" + secrets.token_hex(8)
            with on_core(GATEWAY_CORE):
                proxy = start_litellm(tmp, json_urls[0], sse_urls[0], master)
            try:
                extra["litellm_cores"] = sorted(cores_of_tree(proxy.process.pid))
                results["litellm"], _ = measure(Target("litellm", proxy.url, master), tmp, args)
            finally:
                proxy.stop()

    print(
        f"\nSide by side, {args.duration} s per scenario; each gateway alone on core "
        f"{GATEWAY_CORE} (kvgate: cores {extra.get('kvgate_cores')}, LiteLLM: cores "
        f"{extra.get('litellm_cores', '-')}), nginx + wrk + this script on core {LOAD_CORE}."
        f" Times in ms; +p50 = added to direct."
    )
    print(table(results))
    print(
        f"kvgate records: {records['answered_200']} answered 200, {records['records']} records,"
        f" {records['completed_records']} completed, {records['completed_with_usage_and_cost']}"
        f" of them with the exact usage and a cost; missing: {records['missing']};"
        f" replicas used: {records['replicas used']}"
    )
    if "kvgate hosted" in results:
        print("\nkvgate's hosted path (nginx as an OpenAI-wire provider) beside its vLLM path:")
        print(hosted_table(results))
        said = extra["hosted_records"]
        assert isinstance(said, dict)
        print(
            f"kvgate hosted records: {said['answered_200']} answered 200, {said['records']}"
            f" records, {said['completed_with_usage_and_cost']} completed with the exact usage"
            f" and a cost; missing: {said['missing']}"
        )
    print(f"kvgate /metrics: {extra.get('kvgate_metrics_bytes', 'not served')} bytes")
    if args.json:
        figures = {who: {n: asdict(f) for n, f in r.items()} for who, r in results.items()}
        args.json.write_text(json.dumps({"figures": figures, **extra}, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)  # kept when the run failed: its logs are there
    hosted_missing = extra.get("hosted_records", {"missing": 0})
    assert isinstance(hosted_missing, dict)
    if records["missing"] or hosted_missing["missing"]:
        sys.exit("some requests kvgate answered 200 have no complete record")


if __name__ == "__main__":
    main()
