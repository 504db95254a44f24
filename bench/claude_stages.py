"""A real claude-agent-acp 0.23.1 turn, direct and through bridges, split by stage.

    python bench/claude_stages.py [--rounds 8] [--bridge NAME=PYTHON ...] [--until MARK]
                                  [--load-beside]

Each round starts the agent once per path, in an order that turns from round to round:
directly, and behind each bridge named (``NAME=PYTHON``: the ``acp-bridge`` installed for
that interpreter, so two installs can be compared in one run; default: this interpreter's,
named ``bridge``). The client timestamps each answer: ``initialize``, ``session/new``,
``session/prompt`` (a one-line reply from the embedded model endpoint). The agent command
is wrapped in ``sh -c 'echo $(date) >FILE; exec node …'``, the same on every path, so the
moment the agent was spawned is known too (the shell adds about a millisecond to each path).

Printed: per path, the median of each stage (the time from the previous mark; the first
from the start of the process the client talks to) and of the whole turn; per bridge, the
median over the rounds of its difference to direct in the same round (the load alike),
with the load average of each round.

``--load-beside`` adds the path ``loaded beside``: the agent started directly, and
:data:`~acp_bridge.runtime.early_initialize.LOAD_AFTER` later another process of this
interpreter imports what the bridge loads while the agent starts
(:data:`~acp_bridge.runtime.early_initialize.RUNTIME_MODULES`). Its difference to direct is
what that load alone costs the agent's start, whoever does it.

``--until initialize`` ends each turn at that answer: the stages a bridge's start-up can
touch, in a fifth of a turn's time, so that more rounds fit (the later stages swing by
more than the start-up costs).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_bench import Peer, bridge_command, claude_setup, install_kind

from acp_bridge.runtime.early_initialize import LOAD_AFTER, RUNTIME_MODULES

MARKS: Final = ("spawn", "initialize", "session/new", "session/prompt")
BESIDE: Final = "loaded beside"
LOAD: Final = [sys.executable, "-c", "; ".join(f"import {name}" for name in RUNTIME_MODULES)]


def turn(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    spawned: Path,
    until: str = MARKS[-1],
    *,
    load_beside: bool = False,
) -> dict[str, float]:
    """One turn up to the mark ``until``; the time of each mark since the process was
    started, in ms. ``load_beside``: the bridge's runtime is imported by another process
    meanwhile, started as the bridge would start loading it."""
    spawned.unlink(missing_ok=True)
    started_wall = time.time()
    peer = Peer(argv, env)
    loader = None
    try:
        if load_beside:
            time.sleep(LOAD_AFTER)
            loader = subprocess.Popen(LOAD, cwd=tempfile.gettempdir(), env=env)
        marks = _answers(peer, cwd, until)
    finally:
        peer.close(0.0)  # claude-agent-acp takes seconds to end on EOF
        status = 0 if loader is None else loader.wait()
    if status != 0:
        raise RuntimeError(f"the runtime's import beside the agent failed (status {status})")
    marks["spawn"] = (float(spawned.read_text()) - started_wall) * 1000
    return marks


def _answers(peer: Peer, cwd: Path, until: str) -> dict[str, float]:
    """The time of each answer up to ``until`` since ``peer`` was started, in ms."""
    marks: dict[str, float] = {}

    def mark(name: str) -> bool:
        marks[name] = (time.perf_counter() - peer.started) * 1000
        return name == until

    peer.initialize()
    if mark("initialize"):
        return marks
    session = peer.request("session/new", {"cwd": str(cwd), "mcpServers": []})
    if mark("session/new"):
        return marks
    prompt = [{"type": "text", "text": "Say hello."}]
    peer.request("session/prompt", {"sessionId": session["sessionId"], "prompt": prompt})
    mark("session/prompt")
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--bridge", action="append", default=[], metavar="NAME=PYTHON")
    parser.add_argument("--until", choices=MARKS[1:], default=MARKS[-1])
    parser.add_argument("--load-beside", action="store_true")
    args = parser.parse_args()
    marks = MARKS[: MARKS.index(args.until) + 1]
    bridges = dict(item.split("=", 1) for item in args.bridge) or {"bridge": sys.executable}
    paths = ["direct", *bridges, *([BESIDE] if args.load_beside else [])]
    samples: dict[str, dict[str, list[float]]] = {p: {m: [] for m in marks} for p in paths}
    loads: list[float] = []
    # The agents behind a killed bridge are ended by its watchdog a moment later, and may
    # still write into the folder as it is removed.
    with tempfile.TemporaryDirectory(prefix="acp-stages-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        spawned = work / "spawned"
        with claude_setup(work) as (command, env, cwd):
            # The shell writes the time it runs, then becomes the agent (same pid).
            script = f'date +%s.%N >{spawned}; exec "$@"'
            agent = ["sh", "-c", script, "sh", *command]
            turn(agent, env, cwd, spawned)  # untimed: the first start reads from disk
            for number in range(args.rounds):
                loads.append(os.getloadavg()[0])
                shift = number % len(paths)
                for path in paths[shift:] + paths[:shift]:
                    argv = agent
                    if path in bridges:
                        argv = [*bridge_command(bridges[path]), "--state", ":memory:",
                                "--log-level", "error", "--", *agent]  # fmt: skip
                    beside = path == BESIDE
                    reached = turn(argv, env, cwd, spawned, args.until, load_beside=beside)
                    for mark, value in reached.items():
                        samples[path][mark].append(value)
    print(f"{args.rounds} interleaved rounds; load average at each round: "
          + ", ".join(f"{load:.2f}" for load in loads))  # fmt: skip
    for name, python in bridges.items():
        print(f"{name}: {' '.join(bridge_command(python))} ({install_kind(python)} install)")

    def stages(path: str, index: int) -> list[float]:
        times = [samples[path][m][index] for m in marks]
        return [times[0]] + [after - before for before, after in itertools.pairwise(times)]

    heading = "  ".join(f"{m:>14}" for m in marks)
    print(f"{'median ms, by stage':>24}  {heading}  {'total':>14}")
    for path in paths:
        per_round = [stages(path, i) for i in range(args.rounds)]
        medians = [statistics.median(column) for column in zip(*per_round, strict=True)]
        total = statistics.median(samples[path][marks[-1]])
        print(f"{path:>24}  " + "  ".join(f"{m:14.1f}" for m in medians) + f"  {total:14.1f}")
    # The difference to direct in the same round, where the load was alike.
    for path in paths[1:]:
        per_round = [
            [b - d for b, d in zip(stages(path, i), stages("direct", i), strict=True)]
            for i in range(args.rounds)
        ]
        medians = [statistics.median(column) for column in zip(*per_round, strict=True)]
        totals = [
            samples[path][marks[-1]][i] - samples["direct"][marks[-1]][i]
            for i in range(args.rounds)
        ]
        print(f"{path + ' - direct':>24}  " + "  ".join(f"{m:+14.1f}" for m in medians)
              + f"  {statistics.median(totals):+14.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
