"""What starting an agent costs the process that starts it, by that process's size.

    python bench/spawn_cost.py [--spawns 50] [--heap-mb 0 300 ...]

For each size (a process holding that many MB more, in small objects, as a long-running
bridge or a test run does), ``/bin/true`` is started ``--spawns`` times three ways, and the
CPU time per start is printed (this process and its waited-for children, user + system):

* **preexec_fn**: ``subprocess.Popen`` with a ``preexec_fn`` in a new session, as the
  bridge started its agents until 0.2.x (the child named its group to the watchdog
  between fork and exec). CPython then forks the whole process;
* **vfork**: the same without the ``preexec_fn``: CPython uses vfork;
* **agent**: ``AgentProcess.start`` and ``stop``, as the bridge starts an agent now (its
  watchdog included, which is a second process).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import trio

from acp_bridge.supervision.agent_process import AgentProcess

TRUE = "/bin/true"


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def per_start(start: Callable[[], None], spawns: int) -> float:
    """CPU ms per call of ``start``."""
    before = cpu()
    for _ in range(spawns):
        start()
    return (cpu() - before) * 1000 / spawns


def popen(preexec: bool) -> None:
    extra = {"preexec_fn": os.getpid} if preexec else {}
    subprocess.Popen([TRUE], start_new_session=True, **extra).wait()  # type: ignore[call-overload]


def agent() -> None:
    async def start_and_stop() -> None:
        process = await AgentProcess.start([TRUE])
        await process.stop(1.0)

    trio.run(start_and_stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=50)
    parser.add_argument("--heap-mb", type=int, nargs="+", default=[0, 300])
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'held':>8} {'preexec_fn':>12} {'vfork':>8} {'agent':>8}   CPU ms per start")
    held: list[object] = []
    for size in sorted(args.heap_mb):
        # About 100 bytes an object: a heap of many small objects, not one large block.
        while len(held) < size * 10_000:
            held.append([len(held)])
        started = time.perf_counter()
        row = [
            per_start(lambda: popen(True), args.spawns),
            per_start(lambda: popen(False), args.spawns),
        ]
        row.append(per_start(agent, args.spawns))
        print(f"{size:>5} MB {row[0]:>12.2f} {row[1]:>8.2f} {row[2]:>8.2f}   "
              f"({time.perf_counter() - started:.1f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
