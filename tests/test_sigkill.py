"""The bridge SIGKILLed at any moment of its life (spec §3): nothing it started survives
it by more than 2 s, from the agent started before the runtime loaded to a pooled
process in the middle of a turn.

Every process of one trial (the bridge, its watchdogs, the agent and what the agent
started) inherits an environment entry of its own, so survivors are found by it, whether
or not they had time to say who they are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio
from agent_processes import live_processes
from conftest import RunningBridge, fake_agent_argv

# A killed bridge's agents, their children and its watchdogs must be gone by then.
NO_SURVIVOR_AFTER = 2.0
MARK = "ACP_BRIDGE_TEST_TRIAL"


async def survivors(entry: str, seconds: float) -> list[int]:
    """The processes holding ``entry`` that still run ``seconds`` from now (or fewer, once
    none is left)."""
    deadline = trio.current_time() + seconds
    while (found := live_processes(entry)) and trio.current_time() < deadline:
        await trio.sleep(0.05)
    return found


async def open_cli(args: list[str], env: dict[str, str], directory: Path) -> RunningBridge:
    """``python -m acp_bridge ARGS`` with the raw test streams."""
    stderr_path = directory / "bridge-stderr"
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "acp_bridge", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    return RunningBridge(process, directory, stderr_path)


def trial_env(bridge_env: dict[str, str]) -> tuple[dict[str, str], str]:
    entry = f"{MARK}={uuid.uuid4().hex}"
    return {**bridge_env, MARK: entry.split("=", 1)[1]}, entry


def kill_all(entry: str) -> None:
    """What a failed trial left, so that it does not run on after the test."""
    for pid in live_processes(entry):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- one agent, started before the runtime loaded ---------------------------------------

# When the bridge is killed: (after what, how long after it). "spawn" is the bridge's own
# start (the agent is started within its first tenth of a second, before trio loads);
# "sent" is the client's initialize written; "answer" is its answer read.
EARLY_MOMENTS = [
    ("spawn", 0.0),
    ("spawn", 0.02),
    ("spawn", 0.05),
    ("spawn", 0.08),
    ("spawn", 0.12),
    ("spawn", 0.2),
    ("sent", 0.0),
    ("sent", 0.02),
    ("answer", 0.0),
    ("answer", 0.3),
    ("answer", 0.6),
    ("answer", 1.2),
]


@pytest.mark.parametrize(("after", "delay"), EARLY_MOMENTS)
async def test_an_agent_started_early_never_outlives_a_sigkilled_bridge(
    tmp_path: Path, bridge_env: dict[str, str], after: str, delay: float
) -> None:
    env, entry = trial_env(bridge_env)
    agent = fake_agent_argv(tmp_path, "--ignore-eof", "--ignore-term", grandchild=True)
    # No configuration file: the agent starts, and initialize is answered, before the
    # runtime has loaded.
    bridge = await open_cli(["--state", ":memory:", "--", *agent], env, tmp_path)
    try:
        with trio.fail_after(30):
            if after != "spawn":
                await bridge.request(0, "initialize", {"protocolVersion": 1})
            if after == "answer":
                assert "result" in await bridge.receive()
            await trio.sleep(delay)
            bridge.process.kill()
            await bridge.wait()
            assert await survivors(entry, NO_SURVIVOR_AFTER) == []
    finally:
        kill_all(entry)
