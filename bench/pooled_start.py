"""Start -> ``initialize`` answer for the agents a pool adapter serves, on the default path.

    python bench/pooled_start.py [--rounds 6] [--agents codex-legacy gemini ...]
                                 [--bridge NAME=PYTHON ...]

``peer_bench.py``'s start figures use a stand-in agent that answers at once, for which the
automatic choice is ``first-turn``. This one starts each real agent that a pool adapter
serves (set up as ``pool_bench.py`` sets it up, against the embedded model endpoint),
directly and behind ``acp-bridge --state :memory: -- AGENT`` (no configuration file, so
the early exchange answers where it can), and times the client's ``initialize`` from the
spawn of the process it talks to. Rounds are interleaved; printed per agent and path: the
median with its range, and the difference to direct, with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_bench import Peer, bridge_command, start_to_initialize
from pool_bench import POOLED_AGENTS, agent_setup

from acp_bridge.model_endpoint.server import ThreadedModelEndpoint


def to_initialize(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """Milliseconds from the spawn of ``argv`` to the answer to ``initialize``."""
    peer = Peer(argv, env, cwd)
    try:
        return start_to_initialize(peer, None)["start"]
    finally:
        peer.close(0.0)


def main() -> None:
    names = [agent.name for agent in POOLED_AGENTS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--agents", nargs="+", choices=names, default=names)
    parser.add_argument("--bridge", action="append", default=[], metavar="NAME=PYTHON")
    args = parser.parse_args()
    bridges = dict(item.split("=", 1) for item in args.bridge) or {"bridge": sys.executable}
    paths = ["direct", *bridges]
    base = Path.home() / ".cache" / "acp-bridge" / "bench"  # codex refuses homes in /tmp
    base.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=base) as tmp,
        ThreadedModelEndpoint(reply="Hello.") as endpoint,
    ):
        for agent in [a for a in POOLED_AGENTS if a.name in args.agents]:
            with agent_setup(agent, Path(tmp), endpoint.url) as setup:
                times: dict[str, list[float]] = {path: [] for path in paths}
                loads = []
                for number in range(args.rounds + 1):  # the first, untimed, reads from disk
                    loads.append(os.getloadavg()[0])
                    shift = number % len(paths)
                    for path in paths[shift:] + paths[:shift]:
                        argv = setup.argv
                        if path != "direct":
                            argv = [*bridge_command(bridges[path]), "--state", ":memory:",
                                    "--", *setup.argv]  # fmt: skip
                        took = to_initialize(argv, setup.env, setup.cwd)
                        if number:
                            times[path].append(took)
                direct = statistics.median(times["direct"])
                cells = [
                    f"{path} {statistics.median(t):.0f} [{min(t):.0f}-{max(t):.0f}]"
                    + ("" if path == "direct" else f" ({statistics.median(t) - direct:+.0f})")
                    for path, t in times.items()
                ]
                load = f"load {min(loads[1:]):.2f}-{max(loads[1:]):.2f}"
                print(f"{agent.name:13} " + "  ".join(cells) + f"  ms, {load}", flush=True)


if __name__ == "__main__":
    main()
