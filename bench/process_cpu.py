"""The CPU one bridge process spends from its start to its exit.

    python bench/process_cpu.py [--runs 10] [--agent fake|echo] [--python PY ...]

Each run starts ``PY -m acp_bridge --state :memory: -- PY AGENT`` as an editor would,
sends ``initialize``, waits for the answer, sends one ``session/new`` with a
``systemPrompt``, waits for that answer, closes stdin and waits for the bridge to exit
(that wait is the second figure: how long the bridge takes to end).
The agent is ``tests/fake_agent.py`` (``fake``) or ``bench/echo_agent.py`` (``echo``).

The bridge's CPU is what ``wait4`` reports for it (user and system time of all its
threads, and of the children it reaped), less what the agent reports for itself on
the way out: the agent's start-up is not the bridge's. Several ``--python`` (each the
interpreter of a checkout's venv, which runs that checkout) are run in turn, run after
run, so that a change of load hits them alike. Prints the median and the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENTS = {"fake": ROOT / "tests" / "fake_agent.py", "echo": ROOT / "bench" / "echo_agent.py"}
# Runs the agent script and writes the agent's own CPU to stderr (the bridge's stderr)
# when it exits.
REPORTING = """
import atexit, os, resource, runpy, sys
def report():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    os.write(2, b"agent cpu %.3f\\n" % (used * 1000))
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
PROMPT = {"mode": "append", "content": [{"type": "text", "text": "Answer in one sentence."}]}
NEW = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "session/new",
    "params": {"cwd": "/", "mcpServers": [], "systemPrompt": PROMPT},
}


def line(message: dict[str, object]) -> bytes:
    # Compact, as echo_agent.py reads a request's id and method at fixed places.
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def one_run(python: str, agent: Path) -> tuple[float, float]:
    """The bridge's CPU in ms for one run, and the ms from stdin's close to its exit."""
    command = [python, "-m", "acp_bridge", "--state", ":memory:", "--"]
    command += [python, "-c", REPORTING, str(agent)]
    bridge = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",  # -m would import acp_bridge from a checkout in the working directory
    )
    assert bridge.stdin is not None and bridge.stdout is not None and bridge.stderr is not None
    answers = []
    for message in (INITIALIZE, NEW):
        bridge.stdin.write(line(message))
        bridge.stdin.flush()
        answers.append(bridge.stdout.readline())
    closed = time.perf_counter()
    bridge.stdin.close()
    _, status, usage = os.wait4(bridge.pid, 0)
    ending = (time.perf_counter() - closed) * 1000
    stderr = bridge.stderr.read().decode(errors="replace")
    agent_cpu = re.search(r"agent cpu ([0-9.]+)", stderr)
    if status != 0 or agent_cpu is None or not all(b'"result"' in a for a in answers):
        sys.exit(f"{python}: the run failed (status {status}): {answers} {stderr}")
    return (usage.ru_utime + usage.ru_stime) * 1000 - float(agent_cpu.group(1)), ending


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--agent", choices=sorted(AGENTS), default="fake")
    parser.add_argument("--python", action="append", help="default: this interpreter")
    args = parser.parse_args()
    pythons = [os.path.abspath(python) for python in args.python or [sys.executable]]
    figures: dict[str, list[tuple[float, float]]] = {python: [] for python in pythons}
    loads = []
    for _ in range(args.runs):
        for python in pythons:
            figures[python].append(one_run(python, AGENTS[args.agent]))
            loads.append(os.getloadavg()[0])
    for python, runs in figures.items():
        ms, ends = [cpu for cpu, _ in runs], [end for _, end in runs]
        print(
            f"{python}: bridge CPU median {statistics.median(ms):.1f} ms "
            f"(least {min(ms):.1f}, most {max(ms):.1f}); stdin closed -> exit median "
            f"{statistics.median(ends):.1f} ms (least {min(ends):.1f}, most {max(ends):.1f})"
        )
    print(f"{args.runs} runs each, agent {args.agent}, load {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
