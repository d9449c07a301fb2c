"""CPU per request of each process of kvgate's tree at c=32, in sidebyside's set-up.

Throughput at c=32 on a shared 2-core machine moves by a third between runs of the same
code; the CPU a request costs does not. This runs `benchmarks/sidebyside.py`'s set-up
(nginx upstream, kvgate alone on core 0 with its writer child, recording into a scratch
Postgres) and, before its scenarios, ``--rounds`` runs of wrk at c=32 (json) for
``--seconds`` each, reading each process's user + system time from /proc around them:
the serving process and the records' writer, in ms per request answered.

``--tree`` measures another checkout's code with this driver (its own sidebyside.py sets
the gateway up), so that before and after are measured alike:

    .venv/bin/python benchmarks/cpu.py [--tree ../before] [--rounds 2] [--seconds 15]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


# (benchmarks/workers.py reads /proc alike, but importing it would bind the `benchmarks`
# package to this checkout before --tree's is put first on the path.)


def tree_of(pid: int) -> list[int]:
    """A process and its descendants."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in os.listdir(f"/proc/{current}/task"):
            children = Path(f"/proc/{current}/task/{task}/children").read_text()
            pending += [int(c) for c in children.split()]
    return found


def cpu_s(pid: int) -> float:
    """User + system time of a process so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def role(pid: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_text()
    return "serving" if " serve" in command.replace("\0", " ") else "writer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=15)
    args = parser.parse_args()
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    import benchmarks.sidebyside as sidebyside  # the tree's own set-up
    from benchmarks.load import wrk

    real = sidebyside.measure
    report = sys.stdout

    def measure(target: Any, tmp: Path, options: Any, *more: Any, **named: Any) -> Any:
        if target.name == "kvgate":
            wrk(target, tmp, stream=False, concurrency=32, seconds=3)  # warm
            root = int(subprocess.check_output(["pgrep", "-n", "-f", " serve"]).split()[0])
            for _ in range(args.rounds):
                pids = [p for p in tree_of(root) if p == root or cpu_s(p) > 0]
                start = {p: cpu_s(p) for p in pids}
                figures = wrk(target, tmp, stream=False, concurrency=32, seconds=args.seconds)
                time.sleep(1.0)  # the writer's last batch of them
                used: dict[str, float] = {}
                for p in pids:
                    used[role(p)] = used.get(role(p), 0.0) + cpu_s(p) - start[p]
                per = {name: 1000 * seconds / figures.ok for name, seconds in used.items()}
                print(
                    f"{tree.name}: c=32 {figures.rps:.0f} req/s ({figures.ok} answered); CPU ms"
                    " per request: "
                    + ", ".join(f"{name} {value:.3f}" for name, value in sorted(per.items()))
                    + f", total {sum(per.values()):.3f}",
                    file=report,
                    flush=True,
                )
        return real(target, tmp, options, *more, **named)

    sidebyside.measure = measure
    # The scenarios after ours, as short as they go (their figures are not this benchmark's).
    sys.argv = [sys.argv[0], "--duration", "1", "--skip-litellm", "--sweep-step", "0.5"]
    sys.argv += ["--sweep-max", "100"]
    if "--skip-hosted" in Path(sidebyside.__file__).read_text():
        sys.argv.append("--skip-hosted")
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet  # sidebyside's own table
        try:
            sidebyside.main()
        finally:
            sys.stdout = stdout


if __name__ == "__main__":
    main()
