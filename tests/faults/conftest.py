"""A stack for fault tests: replicas, one gateway, a database, one tenant."""

from __future__ import annotations

from pathlib import Path

from tests.factories import vllm
from tests.support.stack import INSTANT, Stack, open_stack

MODEL = "kvgate/demo-llama-8b"

__all__ = ["INSTANT", "MODEL", "Stack", "make_stack"]


def make_stack(
    tmp: Path,
    database_url: str,
    *,
    replicas: int = 2,
    sim_args: tuple[str, ...] = INSTANT,
    deployment: dict[str, object] | None = None,
    start: bool = True,
    **env: str,
) -> Stack:
    """Migrate, price, a tenant and its key, ``replicas`` sims, and (``start``) the gateway."""
    stack = open_stack(tmp, database_url, tenants=("faults",), **env)
    try:
        stack.start_sims(replicas, extra=sim_args)
        stack.configure([vllm(MODEL, stack.sim_urls, **(deployment or {}))])
        if start:
            stack.start_gateway()
    except BaseException:
        stack.close()
        raise
    return stack
