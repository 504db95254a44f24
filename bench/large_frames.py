"""Large frames through the bridge, beside the agent alone and relays that judge lines only.

    python bench/large_frames.py [--rounds 4] [--paths PATH ...] [--bridge NAME=PYTHON ...]
                                 [--quick]

The 1 MiB and 16 MiB rows of ``peer_bench.py`` (frames echoed by ``echo_agent.py``, MiB
per second both ways counted) for more paths, to tell where the bridge's time goes and
what another way of moving a long line's bytes would win:

* **direct**: the agent alone; **bridge**: ``python -m acp_bridge --adapter passthrough``;
  **raw**: ``raw_relay.py``, trio copying bytes unread (the floor of a trio relay);
* ``judging_relay.py`` in each of its modes: relays that judge every line with the
  bridge's validator and do nothing else, moving the bytes through trio (**trio**), a
  worker thread (**thread**), ``tee``/``splice`` (**splice**); **splice-unjudged** moves
  them with ``splice`` alone;
* ``--bridge NAME=PYTHON`` (any number of times): the bridge run by another interpreter
  (another install, another version) as the path **NAME**, to hold two builds side by
  side in one run.

Every measurement takes a fresh process; rounds are interleaved and the order of the paths
turns from round to round. Printed per size and path: the median throughput with its
range, its ratio to direct, and the relay's CPU time per MiB crossing it (all threads,
after one frame echoed untimed, so the bridge's start-up is not in it), with the share of
it spent in the kernel; and the load average at each round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import relay_bench
from peer_bench import Peer, cpu_seconds

BENCH: Final = Path(__file__).resolve().parent
AGENT: Final = [sys.executable, str(BENCH / "echo_agent.py")]
MiB: Final = 1024 * 1024
PATHS: Final = ("direct", "bridge", "raw", "trio", "thread", "splice", "splice-unjudged")
TICK: Final = os.sysconf("SC_CLK_TCK")


def argv(path: str, bridges: dict[str, str]) -> list[str]:
    if path == "direct":
        return AGENT
    if path == "bridge" or path in bridges:
        python = bridges.get(path, sys.executable)
        return [python, "-m", "acp_bridge", "--state", ":memory:",
                "--log-level", "error", "--adapter", "passthrough", "--", *AGENT]  # fmt: skip
    if path == "raw":
        return [sys.executable, str(BENCH / "raw_relay.py"), *AGENT]
    return [sys.executable, str(BENCH / "judging_relay.py"), path, *AGENT]


def kernel_seconds(pid: int) -> float:
    """System CPU time of a process so far (``/proc/PID/stat``, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / TICK


def measure(
    path: str, size: int, frames: int, env: dict[str, str], bridges: dict[str, str]
) -> tuple[float, float, float]:
    """MiB/s, and the relay's CPU microseconds per MiB crossing it with the kernel's share."""
    peer = Peer(argv(path, bridges), env)
    pid = None if path == "direct" else peer.process.pid
    try:
        peer.initialize()
        peer.call("bench/echo", b'{"blob":"warm"}')
        cpu, kernel = cpu_seconds(pid), kernel_seconds(pid) if pid else 0.0
        # large_frames echoes one frame more, untimed, before it starts the clock.
        speed = relay_bench.large_frames(peer, size, frames)
        crossed = 2 * (frames + 1) * size / MiB
        if pid is None:
            return speed, 0.0, 0.0
        used = cpu_seconds(pid) - cpu
        return speed, used / crossed * 1e6, (kernel_seconds(pid) - kernel) / max(used, 1e-9)
    finally:
        peer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--quick", action="store_true", help="fewer frames")
    parser.add_argument("--bridge", action="append", default=[], metavar="NAME=PYTHON",
                        help="also the bridge run by PYTHON, as the path NAME")  # fmt: skip
    args = parser.parse_args()
    bridges = dict(entry.split("=", 1) for entry in args.bridge)
    paths = list(dict.fromkeys(["direct", *args.paths, *bridges]))
    sizes = ((MiB, 8 if args.quick else 32), (16 * MiB, 1 if args.quick else 4))
    results: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    loads = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="acp-bridge-bench-") as tmp:
        env = {**os.environ, "XDG_CONFIG_HOME": tmp, "XDG_STATE_HOME": tmp}
        for round_number in range(args.rounds):
            loads.append(os.getloadavg()[0])
            turn = round_number % len(paths)
            order = paths[turn:] + paths[:turn]
            for size, frames in sizes:
                for path in order:
                    results.setdefault((size, path), []).append(
                        measure(path, size, frames, env, bridges)
                    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"{time.perf_counter() - started:.0f} s; medians of {args.rounds} interleaved rounds, "
          f"[min-max]; load average at each round: "
          + ", ".join(f"{load:.2f}" for load in loads))  # fmt: skip
    print(f"{'frames':7s} {'path':16s} {'MiB/s':>16s} {'x direct':>9s} "
          f"{'relay CPU per MiB':>18s} {'in kernel':>9s}")  # fmt: skip
    for size, _ in sizes:
        direct = statistics.median(speed for speed, _, _ in results[(size, "direct")])
        for path in paths:
            runs = results[(size, path)]
            speeds = [speed for speed, _, _ in runs]
            median = statistics.median(speeds)
            spread = f"{median:5.0f} [{min(speeds):.0f}-{max(speeds):.0f}]"
            cpu = "-" if path == "direct" else f"{statistics.median(r[1] for r in runs):.0f} us"
            kernel = "-" if path == "direct" else f"{statistics.median(r[2] for r in runs):.0%}"
            print(f"{size // MiB:>2d} MiB  {path:16s} {spread:>16s} {median / direct:9.2f} "
                  f"{cpu:>18s} {kernel:>9s}")  # fmt: skip


if __name__ == "__main__":
    main()
