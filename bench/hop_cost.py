"""What one relay process in between costs a real agent's ``session/new``, and what the
bridge adds to that.

    python bench/hop_cost.py [--calls 60] [--trials 1] AGENT [AGENT ...]

For each pooled agent (the names of ``pool_bench.py``), three processes of it run side by
side against the embedded model endpoint, set up as ``pool_bench.py`` sets them up:

* **direct**: the agent alone;
* **raw**: behind ``raw_relay.py``, trio copying bytes without reading them, the floor for
  any relay process;
* **bridge**: behind ``acp-bridge --adapter NAME``, a ``session/new`` without a prompt (the
  session goes to the first process; the bridge intercepts it, records the session and
  answers).

The calls are alternated one for one across the three, after one call each to warm them;
printed are the medians and their ratio to direct, and the CPU time the relay process
(raw, bridge) spent per call.

Two processes of the same agent can differ by more than a relay costs (one of them got
the faster memory layout, or the quieter start). ``--trials N`` repeats the measurement
with three new processes each time, started in an order that turns from trial to trial,
and prints, per relay, the median over the trials of its ratio to direct: the processes'
own differences then cancel out instead of deciding the figure. A ``session/new`` of a few
milliseconds shows what the hops between processes cost on this machine, before any
reading or judging: the part of "at most 1.1x a direct ``session/new``" that no relay
process can give back.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pool_bench
from peer_bench import CLOSE_TIMEOUT, Peer, cpu_seconds

from acp_bridge.model_endpoint import ThreadedModelEndpoint

RAW_RELAY = Path(__file__).with_name("raw_relay.py")


def measure(
    agent: pool_bench.PooledAgent, calls: int, turn: int = 0
) -> tuple[dict[str, float], dict[str, float]]:
    """Median ``session/new`` milliseconds per path, and the relay's CPU milliseconds
    per call (for the paths with a relay). ``turn``: how far the order in which the
    processes start is turned."""
    with (
        tempfile.TemporaryDirectory(prefix="acp-bridge-hops-") as tmp,
        ThreadedModelEndpoint(reply="Hello.") as endpoint,
        pool_bench.agent_setup(agent, Path(tmp), endpoint.url) as setup,
    ):
        bridge = [sys.executable, "-m", "acp_bridge", "--state", ":memory:", "--log-level",
                  "error", "--adapter", agent.adapter, "--", *setup.argv]  # fmt: skip
        raw = [sys.executable, str(RAW_RELAY), *setup.argv]
        paths: dict[str, Peer] = {}
        try:
            # One after another: opencode and Kilo started side by side on a fresh data
            # folder may fail on their own database ("database is locked").
            order = [("direct", setup.argv), ("raw", raw), ("bridge", bridge)]
            turn %= len(order)
            for name, argv in order[turn:] + order[:turn]:
                peer = paths[name] = Peer(argv, setup.env, setup.cwd)
                peer.initialize()
                pool_bench.timed_new(peer, setup.cwd)
            samples: dict[str, list[float]] = {name: [] for name in paths}
            relays = {name: peer.process.pid for name, peer in paths.items() if name != "direct"}
            cpu_before = {name: cpu_seconds(pid) for name, pid in relays.items()}
            for _ in range(calls):
                for name, peer in paths.items():
                    samples[name].append(pool_bench.timed_new(peer, setup.cwd))
            cpu = {
                name: (cpu_seconds(pid) - cpu_before[name]) * 1000 / calls
                for name, pid in relays.items()
            }
        finally:
            for name, peer in paths.items():
                # The bridge stops its agent itself on EOF. Killed, it would leave that to
                # its watchdog, a moment later: the agent could still write in the data
                # folder as it is removed (qwen-code did).
                peer.close(CLOSE_TIMEOUT if name == "bridge" else 0.0)
    return {name: statistics.median(values) for name, values in samples.items()}, cpu


def main(argv: Sequence[str] | None = None) -> None:
    names = [agent.name for agent in pool_bench.POOLED_AGENTS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60, help="calls per path (default 60)")
    parser.add_argument("--trials", type=int, default=1, help="new processes, each time")
    parser.add_argument("agents", nargs="+", choices=names, metavar="AGENT")
    args = parser.parse_args(argv)
    for agent in pool_bench.POOLED_AGENTS:
        if agent.name not in args.agents:
            continue
        ratios: dict[str, list[float]] = {}
        for trial in range(args.trials):
            medians, cpu = measure(agent, args.calls, trial)
            direct = medians["direct"]
            for name, ms in medians.items():
                ratios.setdefault(name, []).append(ms / direct)
            print(
                f"{agent.name} (load {os.getloadavg()[0]:.2f}): "
                + ", ".join(
                    f"{name} {ms:.2f} ms ({ms / direct:.2f}x)" for name, ms in medians.items()
                )
                + "; relay CPU per call: "
                + ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items()),
                flush=True,
            )
        if args.trials > 1:
            print(
                f"{agent.name}, median of {args.trials} trials: "
                + ", ".join(
                    f"{name} {statistics.median(values):.2f}x (spread "
                    f"{min(values):.2f}-{max(values):.2f})"
                    for name, values in ratios.items()
                    if name != "direct"
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
