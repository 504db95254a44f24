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


def test_nothing_before_the_agents_spawn_imports_typing() -> None:
    """``typing`` (with ``re``, for the watchdog) costs milliseconds every agent start waits
    for: the modules the early start needs until the agent is spawned do not import it,
    nor does the watchdog script, which starts up beside the agent."""
    from acp_bridge.supervision import agent_watchdog

    root = str(Path(__file__).parent.parent)
    # -S: no site, whose import hooks (an editable install's) are not the bridge's.
    probe = "import sys, acp_bridge.__main__; print('typing' in sys.modules)"
    early = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        capture_output=True, timeout=30, check=True, env={"PYTHONPATH": root},
    )  # fmt: skip
    watchdog = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", agent_watchdog.__file__, "0.5"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True,
    )  # fmt: skip
    imported = [line.rsplit("|", 1)[-1].strip() for line in watchdog.stderr.decode().splitlines()]
    assert (early.stdout.decode().strip(), "typing" in imported, "signal" in imported) == (
        "False",
        False,
        True,  # the list is read: the watchdog needs signal
    )
