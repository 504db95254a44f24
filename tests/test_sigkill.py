"""The bridge SIGKILLed at any moment of its life (spec §3): nothing it started survives
it by more than 2 s, from the agent started before the runtime loaded to a pooled
process in the middle of a turn.

Every process of one trial (the bridge, its watchdogs, the agent and what the agent
started) inherits an environment entry of its own, so survivors are found by it, whether
or not they had time to say who they are.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_processes import live_processes
from conftest import RunningBridge, fake_agent_argv
from memory_agent import FAKE_PYTHON
from preloaded import PreloadedProcess, start_bridge

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


async def open_cli(
    args: list[str], env: dict[str, str], directory: Path, *, started: bool = False
) -> RunningBridge:
    """``python -m acp_bridge ARGS`` with the raw test streams. ``started``: a trial that
    kills it once it is running, not while it starts, forks it from a process that has
    already imported it (``preloaded``)."""
    stderr_path = directory / "bridge-stderr"
    with stderr_path.open("wb") as stderr:
        if started:
            process: trio.Process | PreloadedProcess = await start_bridge(
                args, env=env, stderr=stderr
            )
        else:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "acp_bridge", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
            )
    return RunningBridge(directory, process=process, stderr_path=stderr_path)


def trial_env(bridge_env: dict[str, str]) -> tuple[dict[str, str], str]:
    entry = f"{MARK}={uuid.uuid4().hex}"
    return {**bridge_env, MARK: entry.split("=", 1)[1]}, entry


def kill_all(entry: str) -> None:
    """What a failed trial left, so that it does not run on after the test."""
    for pid in live_processes(entry):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def assert_sigkill_leaves_no_process(bridge: RunningBridge, entry: str) -> None:
    """SIGKILL the bridge: within :data:`NO_SURVIVOR_AFTER` no process holding ``entry``
    (its agents, theirs) runs."""
    bridge.process.kill()
    await bridge.wait()
    assert await survivors(entry, NO_SURVIVOR_AFTER) == []


async def initialize(bridge: RunningBridge) -> None:
    await bridge.request(0, "initialize", {"protocolVersion": 1})
    await bridge.response_to(0)


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
            await assert_sigkill_leaves_no_process(bridge, entry)
    finally:
        kill_all(entry)


# --- a pool's private folders ---------------------------------------------------------

FAKE_CODEX = Path(__file__).with_name("fake_codex.py")
PRIVATE = "acp-bridge-codex-"


def pooled_env(bridge_env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], str, Path]:
    """A trial's environment whose temporary folder, where the codex adapter makes its
    private folders (no ``~/.codex`` here), is the test's own."""
    env, entry = trial_env(bridge_env)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    return {**env, "TMPDIR": str(temporary)}, entry, temporary


def private_folders(temporary: Path) -> list[str]:
    return sorted(p.name for p in temporary.iterdir() if p.name.startswith(PRIVATE))


async def open_pooled_cli(
    tmp_path: Path,
    env: dict[str, str],
    *bridge_args: str,
    name: str = "bridge",
    started: bool = True,
) -> RunningBridge:
    directory = tmp_path / name
    directory.mkdir()
    records = directory / "records"
    records.mkdir()
    agent = [*FAKE_PYTHON, str(FAKE_CODEX), "--record-dir", str(records)]
    return await open_cli(
        ["--state", ":memory:", *bridge_args, "--", *agent], env, directory, started=started
    )


def override(text: str) -> dict[str, Any]:
    return {"mode": "override", "content": [{"type": "text", "text": text}]}


async def new_session(bridge: RunningBridge, request_id: int, prompt: Any, cwd: Path) -> str:
    params = {"cwd": str(cwd), "mcpServers": [], "systemPrompt": prompt}
    await bridge.request(request_id, "session/new", params)
    answer = await bridge.response_to(request_id)
    session_id: str = answer["result"]["sessionId"]
    return session_id


async def test_a_private_folder_made_while_the_pool_makes_room_is_not_left(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    # At most two processes: the second prompt's folder is written, then the first
    # prompt's idle process is stopped to make room (codex ignores EOF: 0.4 s), and only
    # then is the second process started under a watchdog.
    env, entry, temporary = pooled_env(bridge_env, tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text("bridge:\n  adapter_options:\n    codex:\n      max_processes: 2\n")
    bridge = await open_pooled_cli(tmp_path, env, "--config", str(config))
    try:
        with trio.fail_after(30):
            await initialize(bridge)
            first = await new_session(bridge, 1, override("first"), tmp_path)
            await bridge.request(2, "session/close", {"sessionId": first})
            await bridge.response_to(2)
            params = {"cwd": str(tmp_path), "mcpServers": [], "systemPrompt": override("second")}
            await bridge.request(3, "session/new", params)
            with trio.move_on_after(5):
                while len(private_folders(temporary)) < 2:
                    await trio.sleep(0.01)
            assert len(private_folders(temporary)) == 2
            await assert_sigkill_leaves_no_process(bridge, entry)
            assert private_folders(temporary) == []
    finally:
        kill_all(entry)


async def test_the_private_folder_of_a_pooled_process_that_exited_is_not_left(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    env, entry, temporary = pooled_env(bridge_env, tmp_path)
    bridge = await open_pooled_cli(tmp_path, env)
    try:
        with trio.fail_after(30):
            await initialize(bridge)
            session = await new_session(bridge, 1, override("persona"), tmp_path)
            assert len(private_folders(temporary)) == 1
            prompt = [{"type": "text", "text": "exit"}]
            await bridge.request(2, "session/prompt", {"sessionId": session, "prompt": prompt})
            assert "error" in await bridge.response_to(2)  # the process exited
            await assert_sigkill_leaves_no_process(bridge, entry)
            assert private_folders(temporary) == []
    finally:
        kill_all(entry)


async def test_a_private_folder_a_dead_bridge_left_is_removed_at_the_next_start(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    # What a bridge leaves when its watchdog could not act either (killed with it, the
    # machine stopped): the next bridge with the same adapter removes it; a folder a
    # live bridge holds (locked, as each bridge locks its own) stays.
    env, entry, temporary = pooled_env(bridge_env, tmp_path)
    left = temporary / f"{PRIVATE}left"
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "instructions.md").write_text("prompt text")
    held = temporary / f"{PRIVATE}held"
    held.mkdir()
    lock = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    other = temporary / "acp-bridge-verify-kept"  # not a pool's
    other.mkdir()
    bridge = await open_pooled_cli(tmp_path, env)
    try:
        with trio.fail_after(30):
            await initialize(bridge)
            await bridge.request(1, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
            assert "result" in await bridge.response_to(1)
            assert sorted(p.name for p in temporary.iterdir()) == sorted([held.name, other.name])
    finally:
        os.close(lock)
        kill_all(entry)


# --- at any moment, one agent or a pool ---------------------------------------------------

# (the last step done, how long after it): ten moments from the bridge's spawn to the
# middle of a turn. "new" is a session/new with a prompt (override for the pool, which
# starts a process for it, with its private folder), "opened" its answer, "turn" a turn
# that does not end.
ANY_MOMENT = [
    ("spawn", 0.0),
    ("spawn", 0.05),
    ("spawn", 0.15),
    ("sent", 0.0),
    ("answer", 0.0),
    ("answer", 0.3),
    ("new", 0.0),
    ("new", 0.05),
    ("opened", 0.0),
    ("turn", 0.1),
]
STEPS = ["spawn", "sent", "answer", "new", "opened", "turn"]


async def live_until(bridge: RunningBridge, moment: str, pooled: bool, cwd: Path) -> None:
    """Drive the bridge through :data:`STEPS` up to ``moment``."""
    for step in STEPS[1 : STEPS.index(moment) + 1]:
        if step == "sent":
            await bridge.request(0, "initialize", {"protocolVersion": 1})
        elif step == "answer":
            assert "result" in await bridge.response_to(0)
        elif step == "new":
            prompt = override("persona") if pooled else {**override("persona"), "mode": "append"}
            params = {"cwd": str(cwd), "mcpServers": [], "systemPrompt": prompt}
            await bridge.request(1, "session/new", params)
        elif step == "opened":
            assert "result" in await bridge.response_to(1)
        elif pooled:
            session = bridge.received.split(b'"sessionId": "', 1)[1].split(b'"', 1)[0].decode()
            hang = [{"type": "text", "text": "hang"}]
            await bridge.request(2, "session/prompt", {"sessionId": session, "prompt": hang})
        else:
            await bridge.request(2, "_test/hang")


@pytest.mark.parametrize("pooled", [False, True], ids=["one-agent", "pooled"])
@pytest.mark.parametrize(("moment", "delay"), ANY_MOMENT)
async def test_a_bridge_sigkilled_at_any_moment_leaves_no_process_and_no_private_file(
    tmp_path: Path, bridge_env: dict[str, str], pooled: bool, moment: str, delay: float
) -> None:
    env, entry, temporary = pooled_env(bridge_env, tmp_path)
    # Killed while it starts (up to the initialize answer): the command as an editor runs it.
    started = STEPS.index(moment) > STEPS.index("answer")
    if pooled:
        bridge = await open_pooled_cli(tmp_path, env, started=started)
    else:
        directory = tmp_path / "bridge"
        directory.mkdir()
        agent = fake_agent_argv(directory, "--ignore-eof", "--ignore-term", grandchild=True)
        bridge = await open_cli(
            ["--state", ":memory:", "--", *agent], env, directory, started=started
        )
    try:
        with trio.fail_after(30):
            await live_until(bridge, moment, pooled, tmp_path)
            await trio.sleep(delay)
            await assert_sigkill_leaves_no_process(bridge, entry)
            # No private file is left either, before a next start could remove one.
            assert private_folders(temporary) == []
            if pooled:
                # Nor does the pool's next start find one (one agent makes none).
                after = await open_pooled_cli(tmp_path, env, name="next")
                await after.request(0, "initialize", {"protocolVersion": 1})
                assert "result" in await after.response_to(0)
                assert private_folders(temporary) == []
                await after.close_stdin()
                await after.wait()
    finally:
        kill_all(entry)
