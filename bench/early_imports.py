"""What the bridge imports before it answers ``initialize`` on the default command line.

    python bench/early_imports.py [--agent-name NAME] [--native]

Runs the early exchange (``acp_bridge.runtime.early_initialize``, as ``acp-bridge -- AGENT`` runs
it) in a fresh interpreter under ``python -X importtime``, in front of a stdlib agent that
answers at once as ``NAME`` (default: a name no adapter knows, so ``first-turn`` is
chosen), with the thread that loads the runtime meanwhile switched off: so the list is
what the answer itself needs. Prints each module imported on the way, its own and
cumulative import time (the least of ``--runs``), and the modules of ``acp_bridge`` and
heavy libraries among them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = """
import json, sys
request = json.loads(sys.stdin.readline())
answer = {"jsonrpc": "2.0", "id": request["id"], "result": json.loads(sys.argv[1])}
sys.stdout.write(json.dumps(answer) + "\\n")
sys.stdout.flush()
for line in sys.stdin:
    pass
"""
PROBE = """
import os, subprocess, sys
agent = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
client_in, client_writes = os.pipe()
os.write(client_writes, sys.argv[3].encode())
client_reads, client_out = os.pipe()
before = set(sys.modules)
print("--- exchange", file=sys.stderr, flush=True)
from acp_bridge.runtime import early_initialize
early_initialize._Loader._load = staticmethod(lambda: None)
done = early_initialize.exchange(client_in, client_out, agent.stdin.fileno(), agent.stdout.fileno())
print("--- answered" if done.answered else "--- not answered", file=sys.stderr, flush=True)
print(os.read(client_reads, 1 << 16).decode().strip())
print(" ".join(name for name in sys.modules if name not in before))
agent.kill()
"""
INITIALIZE = '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'
HEAVY = ("trio", "pydantic", "click", "yaml", "sqlite3", "acp_bridge.pool")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent-name", default="some-agent")
    parser.add_argument("--native", action="store_true", help="the agent advertises systemPrompt")
    parser.add_argument("--runs", type=int, default=7, help="times are the least of the runs")
    args = parser.parse_args()
    session: dict[str, object] = {"systemPrompt": {}} if args.native else {}
    result = {
        "protocolVersion": 1,
        "agentInfo": {"name": args.agent_name, "version": "1.0.0"},
        "agentCapabilities": {"sessionCapabilities": session},
    }
    times: dict[str, tuple[int, int]] = {}
    totals: list[int] = []
    for _ in range(args.runs):
        run = subprocess.run(
            [
                sys.executable,
                "-X",
                "importtime",
                "-c",
                PROBE,
                AGENT,
                json.dumps(result),
                INITIALIZE,
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        lines = run.stderr.splitlines()
        start = lines.index("--- exchange")
        end = next(i for i, line in enumerate(lines) if line.startswith("--- ") and i > start)
        total = 0
        for line in lines[start + 1 : end]:
            if line.startswith("import time:") and "self [us]" not in line:
                own_us, cumulative_us, module = (part.strip() for part in line[12:].split("|"))
                own, cumulative = int(own_us), int(cumulative_us)
                total += own
                best = times.get(module, (own, cumulative))
                times[module] = (min(best[0], own), min(best[1], cumulative))
        totals.append(total)
    answer, imported = run.stdout.splitlines()
    modules = imported.split()
    print(f"answer: {answer}")
    print(f"{lines[end][4:]}; {len(modules)} modules imported by the exchange, in import order")
    print(f"(-X importtime, the least of {args.runs} runs; '-': loaded through importlib, which")
    print("it does not time):")
    print(f"{'module':44} {'self us':>8} {'cumul. us':>10}")
    for name in modules:
        own, cumulative = times.get(name, (-1, -1))
        shown = f"{own:8} {cumulative:10}" if own >= 0 else f"{'-':>8} {'-':>10}"
        print(f"{name:44} {shown}")
    ours = [name for name in modules if name.startswith("acp_bridge")]
    heavy = [name for name in modules if name.split(".")[0] in HEAVY or name in HEAVY]
    print(f"acp_bridge modules: {', '.join(ours)}")
    print(f"heavy modules: {', '.join(heavy) or 'none'}")
    load = os.getloadavg()[0]
    print(f"import time in all: {min(totals) / 1000:.1f} ms (least run); load average {load:.2f}")


if __name__ == "__main__":
    main()
