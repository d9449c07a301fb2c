"""``kvgate demo``: everything local, nothing to set up.

Two simulated replicas and the dashboard as child processes, the gateway in this process
on SQLite, the demo price catalog, and a demo tenant with a key (kept in the demo folder so
that a second run prints the same key). Once the gateway is up, a short built-in workload
(``gateway.tools.workload``) goes through it from a few more tenants, so the dashboard opens with
data; then the gateway serves real clients until Ctrl-C stops everything.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from gateway.auth import hash_key
from gateway.config import Settings, child_environment
from gateway.db import crud
from gateway.db.migrate import upgrade
from gateway.db.session import make_engine, session_factory, transaction
from gateway.errors import NotFound
from gateway.tools import workload
from gateway.tools.workload import Tenant
from pricing.book import load_catalog

DEMO_MODEL = "kvgate/demo-llama-8b"
DEMO_TENANT = "demo"
WORKLOAD_TENANTS = ("acme", "globex", "initech")

log = logging.getLogger("kvgate.demo")


def write_config(path: Path, sim_ports: list[int]) -> Path:
    """The deployments file: one model served by the simulated replicas."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "models": [
            {
                "name": DEMO_MODEL,
                "backend": "vllm",
                "replicas": [f"http://127.0.0.1:{port}" for port in sim_ports],
                "policy": "kv-aware",
                "tokenizer": "kvgate-sim",
                "block_size": 16,
                "capacity_blocks": 4096,
                "max_num_seqs": 64,  # kvgate sim's own
            }
        ]
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def prepare_database(settings: Settings, key_file: Path) -> str:
    """Migrate, load prices, and make sure the demo tenant has a working key."""
    upgrade(settings.database_url)
    sessions = session_factory(make_engine(settings.database_url))
    with transaction(sessions) as session:
        crud.add_prices(session, prices=load_catalog())
    return tenant_key(settings, DEMO_TENANT, key_file)


def tenant_key(settings: Settings, name: str, key_file: Path) -> str:
    """A working key of tenant ``name`` (created if need be), kept in ``key_file``."""
    sessions = session_factory(make_engine(settings.database_url))
    with transaction(sessions) as session:
        if key_file.exists():
            key = key_file.read_text().strip()
            if hash_key(key) in crud.active_principals(session):
                return key
        try:
            crud.get_tenant(session, name=name)
        except NotFound:
            crud.create_tenant(session, name=name)
        issued = crud.create_key(session, tenant_name=name)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(issued.key + "\n")
    key_file.chmod(0o600)
    return issued.key


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    """Poll ``url`` until it answers 200; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
            if reply.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in {timeout_s:.0f} s")


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM if the demo dies, even by SIGKILL (Linux only)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def children(
    commands: list[list[str]], log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes that are stopped (TERM, then KILL) however the block ends."""
    log_dir.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for number, command in enumerate(commands):
            log = open(log_dir / f"child-{number}.log", "wb")  # noqa: SIM115 (lives with the child)
            processes.append(
                subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=_die_with_parent,
                )
            )
        yield processes
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()


def feed(base_url: str, tenants: list[Tenant]) -> None:
    """Wait for the gateway, then send the built-in workload (runs beside the server)."""
    try:
        wait_ready(base_url.removesuffix("/v1") + "/healthz")
    except RuntimeError as exc:
        log.warning("demo workload not sent: %s", exc)
        return
    outcome = workload.run(base_url, tenants, DEMO_MODEL)
    print(
        f"demo workload sent: {outcome.completed} completed, {outcome.failed} failed and "
        f"retried, {outcome.cancelled} cancelled; the dashboard has data",
        flush=True,
    )


def run_demo(
    settings: Settings,
    *,
    port: int,
    sim_ports: list[int],
    workdir: Path,
    dashboard_port: int = 8501,
) -> None:
    """Run the demo: database, simulated replicas, dashboard and workload, the gateway in front."""
    from dashboard.launcher import command as dashboard_command
    from gateway.app import create_app
    from gateway.server import run as serve

    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir / "kvgate.yaml", sim_ports)
    settings = settings.model_copy(update={"config": config})
    key = prepare_database(settings, workdir / "demo-key.txt")
    tenants = [
        Tenant(name, tenant_key(settings, name, workdir / "keys" / f"{name}.txt"))
        for name in WORKLOAD_TENANTS
    ]
    sims = [
        [sys.executable, "-m", "gateway.cli", "sim", "--port", str(p), "--model", DEMO_MODEL]
        for p in sim_ports
    ]
    # The dashboard reads the demo's database, and asks for no password.
    env = child_environment(
        without=("KVGATE_DASHBOARD_PASSWORD",), KVGATE_DATABASE_URL=settings.database_url
    )
    dashboard = dashboard_command(port=dashboard_port)
    with children([*sims, dashboard], workdir / "logs", env=env):
        for sim_port in sim_ports:
            wait_ready(f"http://127.0.0.1:{sim_port}/health")
        base_url = f"http://127.0.0.1:{port}/v1"
        threading.Thread(
            target=feed, args=(base_url, tenants), name="demo-workload", daemon=True
        ).start()
        print(
            f"""
kvgate demo
  gateway   {base_url}   (model {DEMO_MODEL})
  dashboard http://127.0.0.1:{dashboard_port}
  replicas  {", ".join(f"http://127.0.0.1:{p}" for p in sim_ports)}  (simulated vLLM)
  database  {settings.database_url}
  api key   {key}

  from openai import OpenAI
  client = OpenAI(base_url="{base_url}", api_key="{key}")

A short workload from tenants {", ".join(WORKLOAD_TENANTS)} is on its way, so the dashboard
opens with data. Ctrl-C stops everything.
""",
            flush=True,
        )
        # kvgate serve's server: the same header and body deadlines, head size and
        # connection cap (KVGATE_HEADER_TIMEOUT_S and the rest) as in production.
        serve(
            create_app(settings),
            settings=settings,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=3,
        )


if __name__ == "__main__":
    # `make vllm-demo`: the demo tenant's key, reused from the file while it is active.
    if len(sys.argv) != 2:
        sys.exit("usage: python -m gateway.tools.demo KEY_FILE")
    print(tenant_key(Settings(), DEMO_TENANT, Path(sys.argv[1])))
