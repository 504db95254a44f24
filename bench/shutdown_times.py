"""How long the bridge takes to exit after the client's EOF or a SIGTERM, and whether a
SIGKILLed bridge leaves processes behind.

For each agent, N runs of: start ``python -m acp_bridge -- AGENT``, ``initialize``, then
either close stdin (``eof``) or send SIGTERM (``sigterm``), and time until the bridge has
exited (its stdout closed and its status collected). A third case SIGKILLs the bridge and
times until no process of the agent's group is left.

Agents: ``fake`` is ``tests/fake_agent.py --ignore-eof`` (honours SIGTERM);
``claude-0.23.1`` is the real @zed-industries/claude-agent-acp 0.23.1, which ignores EOF
(installed or taken from the cache by ``tests/agents.py``).

    python bench/shutdown_times.py [--runs N] [--session] [--agent fake|claude-0.23.1 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from acp_bridge.supervision.agent_watchdog import process_table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import agents  # noqa: E402

INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}},
    }
).encode()


def agent_argv(name: str) -> list[str]:
    if name == "fake":
        return [sys.executable, str(ROOT / "tests" / "fake_agent.py"), "--ignore-eof"]
    return agents.claude_agent_command(*agents.CLAUDE_LEGACY)


def group_members(pgid: int) -> list[int]:
    return [
        pid
        for pid, (_, group, state, _) in process_table().items()
        if group == pgid and state != b"Z"
    ]


def agent_pgid(bridge_pid: int) -> int:
    """The process group of the bridge's agent (its child in a session of its own)."""
    for pid, (parent, group, _, _) in process_table().items():
        if parent == bridge_pid and group == pid:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"agent_watchdog" not in cmdline:
                return pid
    raise RuntimeError("no agent found")


NEW_SESSION = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "session/new",
        "params": {"cwd": str(ROOT), "mcpServers": []},
    }
).encode()


def one_run(argv: list[str], how: str, env: dict[str, str], session: bool) -> float:
    with tempfile.TemporaryDirectory() as home:
        run_env = {**env, "XDG_STATE_HOME": home, "XDG_CONFIG_HOME": home}
        bridge = subprocess.Popen(
            [sys.executable, "-m", "acp_bridge", "--state", ":memory:", "--", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=run_env,
        )
        assert bridge.stdin is not None and bridge.stdout is not None
        bridge.stdin.write(INITIALIZE + b"\n")
        bridge.stdin.flush()
        json.loads(bridge.stdout.readline())
        if session:  # an open session keeps claude-agent-acp 0.23.1 alive after EOF
            bridge.stdin.write(NEW_SESSION + b"\n")
            bridge.stdin.flush()
            while "id" not in json.loads(bridge.stdout.readline()):
                pass
        pgid = agent_pgid(bridge.pid)
        started = time.monotonic()
        if how == "eof":
            bridge.stdin.close()
        elif how == "sigterm":
            bridge.send_signal(signal.SIGTERM)
        else:
            bridge.kill()
        if how != "sigkill":
            bridge.stdout.read()
            bridge.wait()
            took = time.monotonic() - started
        else:
            bridge.wait()
            while group_members(pgid) and time.monotonic() - started < 10:
                time.sleep(0.01)
            took = time.monotonic() - started
        for pid in group_members(pgid):  # never leave anything behind, whatever happened
            os.kill(pid, signal.SIGKILL)
        return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--agent", action="append", choices=["fake", "claude-0.23.1"])
    parser.add_argument("--session", action="store_true", help="open a session first")
    args = parser.parse_args()
    env = agents.clean_agent_env(os.environ)
    # session/new needs no model call; a closed local port keeps anything else offline.
    env.update({"ANTHROPIC_API_KEY": "unused", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    for name in args.agent or ["fake", "claude-0.23.1"]:
        argv = agent_argv(name)
        for how in ("eof", "sigterm", "sigkill"):
            times = [one_run(argv, how, env, args.session) for _ in range(args.runs)]
            print(
                f"{name:14} {how:8} median {statistics.median(times):.2f} s  "
                f"max {max(times):.2f} s  ({', '.join(f'{t:.2f}' for t in times)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
