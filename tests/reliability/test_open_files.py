"""The connection cap and the open-files limit: the server raises its soft limit as far as
the cap needs and the hard limit allows, and lowers the cap (saying so) when it cannot."""

from __future__ import annotations

import resource
import subprocess
import sys

PROBE = "from gateway.server import allow_connections; print(allow_connections({wanted}))"


def cap_under(soft: int, hard: int, wanted: int) -> tuple[int, int, str]:
    """The cap a fresh process allows under these limits, its soft limit after, its log."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    code = PROBE.format(wanted=wanted) + (
        "; import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        check=True,
    )
    cap, raised = done.stdout.split()
    return int(cap), int(raised), done.stderr


def test_the_soft_limit_is_raised_to_what_the_cap_needs() -> None:
    # 2 per connection (its upstream connection too) and 256 for the rest.
    assert cap_under(600, 4096, 1000)[:2] == (1000, 2256)


def test_a_cap_past_the_hard_limit_is_lowered_with_a_warning() -> None:
    cap, raised, log = cap_under(600, 1024, 10_000)
    assert (cap, raised) == ((1024 - 256) // 2, 1024)
    assert "KVGATE_MAX_CONNECTIONS=10000 needs 20256 open files, the limit is 1024" in log
