"""What OpenTelemetry export costs a request: the same gateway with and without it, one run.

Two `kvgate serve` processes over one zero-cost `kvgate sim` and one Postgres database,
identical but for KVGATE_OTLP_ENDPOINT: one exports a span per request over OTLP/HTTP to a
receiver in this process (which counts what it is sent), the other exports nothing. Both
gateways are pinned to core 0 and loaded in turn (never together), several rounds
alternately, at concurrency 32, non-streamed; the replica, the receiver and the load
generator share core 1. Reported per gateway: p50 latency and the gateway process's own
CPU per request (its span thread and exporter included; the writer child apart), and the
difference, which the issue bounds at 0.05 ms.

    .venv/bin/python benchmarks/telemetry.py [--requests 6000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import MODEL, own_cpu, pin, run, scratch_database
from tests.factories import config_file
from tests.support.processes import (
    cli_tenant,
    free_port,
    gateway_env,
    kvgate,
    start_gateway,
    start_sim,
)


class Sink:
    """An OTLP/HTTP receiver that reads and counts what it is sent (bytes, requests)."""

    def __init__(self) -> None:
        self.posts = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bytes += len(self.rfile.read(int(self.headers["content-length"])))
                sink.posts += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--requests", type=int, default=6000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvgate-telemetry-"))
    scratch = contextlib.ExitStack()
    database_url = scratch.enter_context(scratch_database(args.database_url, "kvgate_bench_"))
    sink = Sink()
    processes = []
    try:
        common = {
            "KVGATE_LOG_LEVEL": "error",
            "KVGATE_RECORDER_FLUSH_INTERVAL_S": "0.2",
            "KVGATE_KEY_REFRESH_S": "5",
            "KVGATE_PRICE_REFRESH_S": "30",
        }
        env = gateway_env(database_url, tmp / "journal-off", **common)
        kvgate("db", "upgrade", env=env)
        kvgate("prices", "sync", env=env)
        key, _ = cli_tenant(env, "bench")
        sim = start_sim(
            tmp,
            extra=(
                "--prefill-tokens-per-s",
                "0",
                "--decode-tokens-per-s",
                "0",
                "--max-num-seqs",
                "100000",
                "--capacity-blocks",
                "100000",
            ),
        )
        processes.append(sim)
        config = config_file(
            tmp / "kvgate.yaml", [{"name": MODEL, "replicas": [sim.url], "policy": "kv-aware"}]
        )
        on_env = gateway_env(
            database_url, tmp / "journal-on", **common, KVGATE_OTLP_ENDPOINT=sink.url
        )
        gateways = {
            "off": start_gateway(tmp, config, env, port=free_port()),
            "on": start_gateway(tmp, config, on_env, port=free_port()),
        }
        processes.extend(gateways.values())
        for gateway in gateways.values():
            pin(gateway.process.pid, 0)
        pin(sim.process.pid, 1)
        pin(0, 1)
        p50: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for name, gateway in gateways.items():
                before = own_cpu(gateway.process.pid)
                result = asyncio.run(
                    run(
                        gateway.url + "/v1/chat/completions",
                        key,
                        stream=False,
                        concurrency=32,
                        requests=args.requests,
                        request_ids=[],
                    )
                )
                spent = own_cpu(gateway.process.pid) - before
                assert result.errors == 0, result.errors
                p50[name].append(result.p50_ms)
                cpu[name].append(spent * 1000 / len(result.latencies))
        print("\nOpenTelemetry export cost, c=32 non-streamed, gateways pinned to core 0")
        print(f"{'export':<8}{'p50 (median of rounds)':>24}{'CPU/req (median)':>20}")
        for name in ("off", "on"):
            print(
                f"{name:<8}{statistics.median(p50[name]):>22.3f}ms"
                f"{statistics.median(cpu[name]):>18.4f}ms"
            )
        added_p50 = statistics.median(p50["on"]) - statistics.median(p50["off"])
        added_cpu = statistics.median(cpu["on"]) - statistics.median(cpu["off"])
        print(
            f"added by export: p50 {added_p50:+.3f} ms, CPU {added_cpu:+.4f} ms"
            f" per request (rounds: off {[f'{c:.4f}' for c in cpu['off']]},"
            f" on {[f'{c:.4f}' for c in cpu['on']]})"
        )
        print(f"the receiver got {sink.posts} OTLP posts, {sink.bytes:,} bytes")
    finally:
        for process in processes:
            process.stop()
        sink.server.shutdown()
        scratch.close()


if __name__ == "__main__":
    main()
