"""What OpenTelemetry export costs a request: the same gateway with and without it, one run.

Two `kvgate serve` processes over one zero-cost `kvgate sim` and one Postgres database,
identical but for KVGATE_OTLP_ENDPOINT: one exports a span per request over OTLP/HTTP to a
receiver in this process (which counts what it is sent), the other exports nothing. Both
gateways are pinned to core 0 and loaded in turn (never together), several rounds
alternately, at concurrency 32, non-streamed; the replica, the receiver and the load
generator share core 1, and so do the gateways' children (the records' writer, which now
makes and exports the spans, and multiprocessing's resource tracker). Reported per
gateway: p50 latency, the gateway process's own CPU per request (all its threads), which
the issue bounds at +0.05 ms, and its children's CPU per request (the writer's work:
database inserts, and with export on, the spans).

    .venv/bin/python benchmarks/telemetry.py [--requests 6000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
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


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the writer child, the resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:
                    found.append(int(entry))
    return found


def children_cpu(pids: list[int]) -> float:
    """CPU seconds so far of the given processes (0 for one that has gone)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += own_cpu(pid)
    return total


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
        writers = {name: children(g.process.pid) for name, g in gateways.items()}
        for name, gateway in gateways.items():
            pin(gateway.process.pid, 0)
            for child in writers[name]:
                pin(child, 1)
        pin(sim.process.pid, 1)
        pin(0, 1)
        p50: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        writer_cpu: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for name, gateway in gateways.items():
                before = own_cpu(gateway.process.pid)
                writer_before = children_cpu(writers[name])
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
                # The writer's share of these requests: it drains up to a flush interval
                # behind the load, so wait for it (and for the spans' export) first.
                time.sleep(1.5)
                spent = own_cpu(gateway.process.pid) - before
                writer_spent = children_cpu(writers[name]) - writer_before
                assert result.errors == 0, result.errors
                p50[name].append(result.p50_ms)
                cpu[name].append(spent * 1000 / len(result.latencies))
                writer_cpu[name].append(writer_spent * 1000 / len(result.latencies))
        print("\nOpenTelemetry export cost, c=32 non-streamed, gateways pinned to core 0")
        print(
            f"{'export':<8}{'p50 (median of rounds)':>24}{'gateway CPU/req':>18}"
            f"{'writer CPU/req':>18}"
        )
        for name in ("off", "on"):
            print(
                f"{name:<8}{statistics.median(p50[name]):>22.3f}ms"
                f"{statistics.median(cpu[name]):>16.4f}ms"
                f"{statistics.median(writer_cpu[name]):>16.4f}ms"
            )
        added_p50 = statistics.median(p50["on"]) - statistics.median(p50["off"])
        added_cpu = statistics.median(cpu["on"]) - statistics.median(cpu["off"])
        added_writer = statistics.median(writer_cpu["on"]) - statistics.median(writer_cpu["off"])
        print(
            f"added by export: p50 {added_p50:+.3f} ms, gateway CPU {added_cpu:+.4f} ms,"
            f" writer CPU {added_writer:+.4f} ms per request"
        )
        for label, values in (("p50", p50), ("gateway CPU", cpu), ("writer CPU", writer_cpu)):
            print(
                f"rounds, {label}: off {[f'{v:.4f}' for v in values['off']]},"
                f" on {[f'{v:.4f}' for v in values['on']]}"
            )
        print(f"the receiver got {sink.posts} OTLP posts, {sink.bytes:,} bytes")
    finally:
        for process in processes:
            process.stop()
        sink.server.shutdown()
        scratch.close()


if __name__ == "__main__":
    main()
