"""`kvgate serve` with cProfile on its main thread between SIGUSR1 and SIGUSR2 (the profile
then dumped to the file named first), for benchmarks/callcount.py.

It imports the gateway from PYTHONPATH, never from this checkout, so the same driver can
count the calls of another commit's gateway.
"""

from __future__ import annotations

import cProfile
import signal
import sys
from pathlib import Path


def serve_profiled(out: Path, argv: list[str]) -> None:
    """In the gateway process: `kvgate serve`, profiled between SIGUSR1 and SIGUSR2."""
    profiles: list[cProfile.Profile] = []

    def start(*_: object) -> None:
        profiles.append(cProfile.Profile())  # a new one each time: profiles accumulate
        profiles[-1].enable()

    def stop(*_: object) -> None:
        profiles[-1].disable()
        profiles[-1].dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from gateway.cli import main  # from the tree on PYTHONPATH, not this checkout

    sys.argv = ["kvgate", *argv]
    main()


def main() -> None:
    """``profiled.py PROFILE serve --config ... --port ...``"""
    serve_profiled(Path(sys.argv[1]), sys.argv[2:])


if __name__ == "__main__":
    main()
