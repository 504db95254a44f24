"""Which command lines start the agent before the bridge has loaded (acp_bridge.commands.launch)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import pid_alive

from acp_bridge.commands.launch import agent_command


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--", "npx", "-y", "agent"], ["npx", "-y", "agent"]),
        (["--state", ":memory:", "--", "agent", "--acp"], ["agent", "--acp"]),
        (["--state=:memory:", "--trace-prompts", "--", "agent"], ["agent"]),
        (["--config", "c.yaml", "--log-level", "debug", "--", "a"], ["a"]),
        # A built-in adapter, found without loading any adapter.
        (["--adapter", "codex", "--", "codex-acp"], ["codex-acp"]),
        (["--adapter=first-turn", "--", "a"], ["a"]),
        (["--adapter", "auto", "--", "a"], ["a"]),
        # Left to the usual path: a preset, an adapter that is not built in (a user's, or
        # mistyped), another command, an option it does not know, a flag given a value,
        # no command at all.
        (["--agent", "claude"], None),
        (["--adapter", "codx", "--", "codex-acp"], None),
        (["--adapter", "../claude", "--", "a"], None),
        (["--no-override=1", "--", "a"], None),
        (["verify", "--", "agent"], None),
        (["--unknown", "--", "agent"], None),
        (["agent"], None),
        (["--"], None),
    ],
)
def test_only_an_agent_command_with_neutral_options_starts_early(
    args: list[str], expected: list[str] | None
) -> None:
    assert agent_command(args) == expected


def test_an_agent_started_early_does_not_outlive_a_usage_error(tmp_path: Path) -> None:
    pidfile = tmp_path / "agent.pid"
    agent = [sys.executable, "-c", IGNORES_EOF, str(pidfile)]
    done = subprocess.run(
        [sys.executable, "-m", "acp_bridge", "--log-level", "bogus", "--", *agent],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and b"bogus" in done.stderr
    deadline = time.monotonic() + 5
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid)


# An agent that ignores EOF and SIGTERM and says where it runs.
IGNORES_EOF = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""
