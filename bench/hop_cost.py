"""What one relay process in between costs a real agent's ``session/new``, and what the
bridge adds to that.

    python bench/hop_cost.py [--calls 60] AGENT [AGENT ...]

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
(raw, bridge) spent per call. A ``session/new`` of a few
milliseconds shows what the hops between processes cost on this machine, before any
reading or judging: the part of "at most 1.1x a direct ``session/new``" that no relay
process can give back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pool_bench
from peer_bench import Peer, cpu_seconds

from acp_bridge.model_endpoint import ThreadedModelEndpoint

RAW_RELAY = Path(__file__).with_name("raw_relay.py")


def measure(agent: pool_bench.PooledAgent, calls: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median ``session/new`` milliseconds per path, and the relay's CPU milliseconds
    per call (for the paths with a relay)."""
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
            for name, argv in (("direct", setup.argv), ("raw", raw), ("bridge", bridge)):
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
            for peer in paths.values():
                peer.close(0.0)
    return {name: statistics.median(values) for name, values in samples.items()}, cpu


def main(argv: Sequence[str] | None = None) -> None:
    names = [agent.name for agent in pool_bench.POOLED_AGENTS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60, help="calls per path (default 60)")
    parser.add_argument("agents", nargs="+", choices=names, metavar="AGENT")
    args = parser.parse_args(argv)
    for agent in pool_bench.POOLED_AGENTS:
        if agent.name not in args.agents:
            continue
        medians, cpu = measure(agent, args.calls)
        direct = medians["direct"]
        print(
            f"{agent.name}: "
            + ", ".join(f"{name} {ms:.2f} ms ({ms / direct:.2f}x)" for name, ms in medians.items())
            + "; relay CPU per call: "
            + ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
