"""Process supervision (spec §3): nothing outlives a killed bridge, shutdown is quick, and
an agent that cannot start is described in words a client can show."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_processes import live_processes
from conftest import OpenBridge, RunningBridge, pid_alive
from memory_agent import FAKE_PYTHON

from acp_bridge.supervision.agent_process import AgentProcess, AgentStartError
from acp_bridge.supervision.agent_watchdog import MARK_VARIABLE, RUN, Watchdog

# The target of spec §3: an agent that honours SIGTERM is gone, and the bridge has exited,
# within 1 s of the client's EOF or signal.
QUICK_EXIT = 1.0
# A killed bridge's agents and their children must be gone by then.
NO_SURVIVOR_AFTER = 2.0


async def ready(bridge: RunningBridge) -> None:
    await bridge.request("ready", "_test/echo", {})
    await bridge.response_to("ready")


def watchdogs_of(parent: int) -> list[int]:
    """Processes running the watchdog started by ``parent`` (the group a watchdog
    watches is told to it over its pipe, not on its command line)."""
    found, program = [], os.fsencode(RUN)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        watchdog = program in argv
        if watchdog and ppid == parent and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def watchdogs_running(parent: int, count: int = 1) -> list[int]:
    """The watchdogs ``parent`` started, once ``count`` of them run (a forked child shows
    its parent's command line until it has exec'd)."""
    with trio.move_on_after(5):
        while len(found := watchdogs_of(parent)) < count:
            await trio.sleep(0.02)
        return found
    return []


async def survivors_after(pids: list[int], seconds: float) -> list[int]:
    deadline = trio.current_time() + seconds
    while trio.current_time() < deadline:
        alive = [pid for pid in pids if pid_alive(pid)]
        if not alive:
            return []
        await trio.sleep(0.05)
    return [pid for pid in pids if pid_alive(pid)]


# --- the bridge SIGKILLed ----------------------------------------------------------------


async def test_sigkilled_bridge_leaves_no_agent_grandchild_or_watchdog(
    open_bridge: OpenBridge,
) -> None:
    with trio.fail_after(30):
        async with open_bridge("--ignore-eof", "--ignore-term", grandchild=True) as bridge:
            await ready(bridge)
            pids = bridge.pids()
            assert len(pids) == 2
            watchdogs = await watchdogs_running(bridge.process.pid)
            assert watchdogs, "no watchdog runs for the agent's group"
            bridge.process.kill()
            await bridge.wait()
            assert await survivors_after(pids, NO_SURVIVOR_AFTER) == []
            assert await survivors_after(watchdogs, 1.0) == []


async def test_sigkilled_bridge_leaves_no_grandchild_that_started_its_own_session(
    open_bridge: OpenBridge,
) -> None:
    # codex-acp starts its shell snapshot this way: out of the agent's process group.
    args = ("--ignore-eof", "--ignore-term", "--grandchild-own-session")
    with trio.fail_after(30):
        async with open_bridge(*args, grandchild=True) as bridge:
            await ready(bridge)
            pids = bridge.pids()
            assert len(pids) == 2
            await watchdogs_running(bridge.process.pid)
            bridge.process.kill()
            await bridge.wait()
            assert await survivors_after(pids, NO_SURVIVOR_AFTER) == []


async def test_shutdown_leaves_no_grandchild_that_started_its_own_session(
    open_bridge: OpenBridge,
) -> None:
    with trio.fail_after(30):
        async with open_bridge("--grandchild-own-session", grandchild=True) as bridge:
            await ready(bridge)
            pids = bridge.pids()
            await bridge.close_stdin()
            await bridge.read_to_eof()
            await bridge.wait()
            assert [pid for pid in pids if pid_alive(pid)] == []


async def test_shutdown_leaves_nothing_an_escaped_grandchild_started_afterwards(
    open_bridge: OpenBridge,
) -> None:
    # codex-acp 2.6's shell snapshot: `bash -lc` in its own session runs the user's profile,
    # which went on starting processes (pyenv-rehash, sleep) after the agent had exited;
    # they outlived the bridge, found only by walking down from the agent while it ran.
    args = ("--grandchild-own-session", "--grandchild-spawns-late")
    with trio.fail_after(30):
        async with open_bridge(*args, grandchild=True) as bridge:
            await ready(bridge)
            pids = bridge.pids()
            await bridge.close_stdin()
            await bridge.read_to_eof()
            await bridge.wait()
            late_file = bridge.file("grandchild.pid.late")
            while not late_file.exists() or not late_file.read_text():
                await trio.sleep(0.02)
            pids.append(int(late_file.read_text()))
            assert await survivors_after(pids, NO_SURVIVOR_AFTER) == []


HOLDER = """
import sys, time, trio
from acp_bridge.supervision.agent_process import AgentProcess

async def main():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    argv = [sys.executable, "-c", code]
    agent = await AgentProcess.start(argv, private_files=[sys.argv[1]])
    print(agent.pid, flush=True)
    await trio.sleep(600)

trio.run(main)
"""


async def killed_holder_leaves_nothing(holder_script: str, prompt_file: Path) -> None:
    """Run ``holder_script`` (a bridge that starts an agent with ``prompt_file`` as its
    private file, and prints the pids that must end with it), SIGKILL it: within
    :data:`NO_SURVIVOR_AFTER` none of those pids runs, and the file is gone."""
    prompt_file.write_text("private")
    prompt_file.chmod(0o600)
    with trio.fail_after(30):
        holder = await trio.lowlevel.open_process(
            [sys.executable, "-c", holder_script, str(prompt_file)], stdout=subprocess.PIPE
        )
        assert holder.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            chunk = await holder.stdout.receive_some(100)
            assert chunk, "the holder ended before it started its agent"
            line += chunk
        holder.kill()
        await holder.wait()
        assert await survivors_after([int(pid) for pid in line.split()], NO_SURVIVOR_AFTER) == []
        deadline = trio.current_time() + 1
        while prompt_file.exists() and trio.current_time() < deadline:
            await trio.sleep(0.02)
    assert not prompt_file.exists()


async def test_watchdog_removes_private_files_when_the_bridge_dies(tmp_path: Path) -> None:
    await killed_holder_leaves_nothing(HOLDER, tmp_path / "prompt.md")


AHEAD_HOLDER = """
import sys, trio
from acp_bridge.supervision.agent_process import AgentProcess, prepare_watchdog
from acp_bridge.supervision.agent_watchdog import _ready

async def main():
    prepare_watchdog()
    ((_, ahead),) = _ready.values()
    await trio.sleep(0.5)  # started and idle, as between two new prompts
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    agent = await AgentProcess.start([sys.executable, "-c", code], private_files=[sys.argv[1]])
    assert agent._watchdog is ahead and not _ready
    print(agent.pid, ahead.process.pid, flush=True)
    await trio.sleep(600)

trio.run(main)
"""


async def test_a_watchdog_started_ahead_ends_the_agent_it_takes_when_the_bridge_dies(
    tmp_path: Path,
) -> None:
    # The agent and the watchdog that was started ahead and took it.
    await killed_holder_leaves_nothing(AHEAD_HOLDER, tmp_path / "prompt.md")


async def test_stop_releases_and_reaps_the_watchdog(tmp_path: Path) -> None:
    with trio.fail_after(30):
        before = set(watchdogs_of(os.getpid()))
        agent = await AgentProcess.start([sys.executable, "-c", "import time; time.sleep(60)"])
        (watchdog,) = set(await watchdogs_running(os.getpid(), len(before) + 1)) - before
        await agent.stop(1.0)
        assert await survivors_after([watchdog], 1.0) == []
        # Reaped by the next start or stop: no zombie is left in a long-running bridge.
        other = await AgentProcess.start([sys.executable, "-c", "pass"])
        await other.stop(1.0)
        assert not Path(f"/proc/{watchdog}").exists()
        # A stopped agent's private files are the adapter's business, not the watchdog's.


# --- between the spawn and the group's name ---------------------------------------------

# An agent that ignores SIGTERM and starts a child, then waits.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
time.sleep(60)
"""


def marked(entry: str, count: int) -> bool:
    """Whether ``count`` processes holding ``entry`` run, within 10 s."""
    deadline = time.monotonic() + 10
    while len(live_processes(entry)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(live_processes(entry)) >= count


def test_an_agent_whose_group_was_never_named_is_found_by_its_mark() -> None:
    """The bridge dies after the agent's exec and before naming its group: the watchdog
    finds the agent, and its child, by the mark, and only them."""
    watchdog = Watchdog.start(grace=0.2)
    env = watchdog.mark(os.environ)
    entry = f"{MARK_VARIABLE}={env[MARK_VARIABLE]}"
    bystander = subprocess.Popen(
        [*FAKE_PYTHON, "-c", "import time; time.sleep(60)"],
        env={**os.environ, MARK_VARIABLE: "another-watchdogs-mark"},
        start_new_session=True,
    )
    agent = None
    try:
        agent = subprocess.Popen([*FAKE_PYTHON, "-c", STUBBORN], env=env, start_new_session=True)
        assert marked(entry, 2)  # the agent and its child run
        watchdog.abandon()
        agent.wait(timeout=NO_SURVIVOR_AFTER)
        deadline = time.monotonic() + 1
        while live_processes(entry) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live_processes(entry) == []
        assert pid_alive(bystander.pid)
    finally:
        for process in (bystander, agent):
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        watchdog.process.wait()


# A bridge that marks an agent and is SIGKILLed before naming its group: "unspawned" before
# its spawn began, "forked" while the spawn's child is between fork and exec (it has
# closed the bridge's descriptors, as ``close_fds`` does, and is slow to reach its exec).
SPAWNING_BRIDGE = """
import os, signal, sys, time
from acp_bridge.supervision.agent_watchdog import Watchdog
watchdog = Watchdog.start(grace=0.2)
env = watchdog.mark(os.environ)
if sys.argv[1] == "forked" and os.fork() == 0:
    os.setsid()
    os.closerange(3, 65536)
    time.sleep(1.0)
    os.execve("/bin/sh", ["sh", "-c", sys.argv[2], sys.argv[3]], env)
os.kill(os.getpid(), signal.SIGKILL)
"""
# An agent that leaves a file behind as soon as it runs (a shell: within a millisecond of
# its exec), ignores SIGTERM and starts a child.
RECORDED = 'trap "" TERM; : > "$0"; sleep 60 & wait'


@pytest.mark.parametrize("moment", ["unspawned", "forked"])
def test_a_bridge_killed_within_an_agents_spawn_leaves_nothing(tmp_path: Path, moment: str) -> None:
    """Nothing is left at once, the watchdog included, and an agent whose bridge died
    before its exec never runs."""
    entry = f"ACP_BRIDGE_TEST_TRIAL={os.urandom(8).hex()}"
    ran = tmp_path / "ran"
    bridge = subprocess.Popen(
        [sys.executable, "-c", SPAWNING_BRIDGE, moment, RECORDED, str(ran)],
        env={**os.environ, "ACP_BRIDGE_TEST_TRIAL": entry.split("=", 1)[1]},
    )
    try:
        assert bridge.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 1
        while live_processes(entry) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert live_processes(entry) == []
        time.sleep(1.5)  # after the forked child would have reached its exec
        assert not ran.exists()
    finally:
        for pid in live_processes(entry):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_forked_child_of_a_live_process_is_not_taken_for_a_dead_bridges_spawn() -> None:
    """A child between fork and exec is the dead bridge's only if its parent no longer
    shares the bridge's memory: this one's parent (this process, the watchdog's bridge
    here) still runs, as a sibling bridge forked from the same process would."""
    watchdog = Watchdog.start(grace=0.2)
    watchdog.mark(os.environ)
    child = os.fork()
    if child == 0:  # as a spawn's child is before its exec: a session of its own, and
        os.setsid()  # none of its parent's descriptors (this watchdog's pipe with them)
        os.closerange(3, 65536)
        time.sleep(5)
        os._exit(0)
    try:
        watchdog.abandon()
        assert watchdog.process.wait(timeout=NO_SURVIVOR_AFTER) == 0
        assert pid_alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


async def test_an_agent_is_spawned_with_no_code_run_between_fork_and_exec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No ``preexec_fn``: with one, CPython forks the whole bridge (page tables and all)
    instead of using vfork, at a cost that grows with the bridge's size."""
    options: list[dict[str, Any]] = []

    class Recorded(subprocess.Popen[bytes]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            options.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    with trio.fail_after(30):
        agent = await AgentProcess.start([sys.executable, "-c", "pass"])
        await agent.stop(1.0)
    agents = [kwargs for kwargs in options if MARK_VARIABLE in (kwargs.get("env") or {})]
    assert len(agents) == 1
    assert all(kwargs.get("preexec_fn") is None for kwargs in options)


# --- quick shutdown ----------------------------------------------------------------------


async def timed_exit(bridge: RunningBridge, how: str) -> float:
    await ready(bridge)
    started = time.monotonic()
    if how == "eof":
        await bridge.close_stdin()
    else:
        bridge.process.send_signal(signal.SIGTERM)
    await bridge.read_to_eof()
    await bridge.wait()
    return time.monotonic() - started


@pytest.mark.parametrize("how", ["eof", "sigterm"])
async def test_agent_ignoring_eof_but_honouring_sigterm_is_gone_within_a_second(
    open_bridge: OpenBridge, how: str
) -> None:
    # Default configuration: the 2 s grace applies only to an agent that ignores SIGTERM.
    with trio.fail_after(30):
        async with open_bridge("--ignore-eof") as bridge:
            took = await timed_exit(bridge, how)
            assert [pid for pid in bridge.pids() if pid_alive(pid)] == []
    assert took < QUICK_EXIT, f"the bridge took {took:.2f} s to exit after {how}"


async def test_agent_exiting_on_eof_is_not_signalled(open_bridge: OpenBridge) -> None:
    with trio.fail_after(30):
        async with open_bridge("--eof-exit-code", "3") as bridge:
            await timed_exit(bridge, "eof")
            assert bridge.process.returncode == 3
    assert "SIGTERM" not in bridge.stderr()


# --- an agent that cannot start ----------------------------------------------------------


def script(tmp_path: Path, body: str, mode: int) -> str:
    path = tmp_path / "agent"
    path.write_text(body)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("missing", "No such file or directory (is it installed and on PATH?)"),
        ("not-executable", "Permission denied"),
        ("directory", "Permission denied"),
        ("no-shebang", "no #! line"),
        ("missing-cwd", "working directory"),
        ("nul-byte", "null byte"),
    ],
)
async def test_a_command_that_cannot_start_is_named_with_its_cause(
    tmp_path: Path, case: str, cause: str
) -> None:
    cwd = None
    if case == "missing":
        argv = [str(tmp_path / "no-such-agent")]
    elif case == "not-executable":
        argv = [script(tmp_path, "#!/bin/sh\n", stat.S_IRUSR | stat.S_IWUSR)]
    elif case == "directory":
        argv = [str(tmp_path)]
    elif case == "no-shebang":
        argv = [script(tmp_path, "\x7fELF\x00garbage", 0o700)]
    elif case == "missing-cwd":
        argv, cwd = [sys.executable], str(tmp_path / "gone")
    else:
        argv = [sys.executable, "-c", "pass\0"]
    with pytest.raises(AgentStartError) as caught:
        await AgentProcess.start(argv, cwd=cwd)
    error = caught.value
    assert error.command == argv[0]
    assert cause in error.cause
    assert argv[0] in str(error) and error.cause in str(error)
    obj = error.error_object()
    assert obj["code"] == -32603
    assert obj["data"] == {"command": argv[0], "cause": error.cause}


def test_start_error_never_shows_arguments_which_may_hold_prompt_text() -> None:
    error = AgentStartError("codex-acp", "no such file or command")
    assert (
        str(error) == "The agent command 'codex-acp' could not be started: no such file or command."
    )


async def test_no_watchdog_is_left_when_the_agent_cannot_start(tmp_path: Path) -> None:
    before = set(children_of(os.getpid()))
    with pytest.raises(AgentStartError):
        await AgentProcess.start([str(tmp_path / "nothing")])
    assert set(children_of(os.getpid())) - before == set()


def children_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                found.append(int(entry.name))
    return found


async def test_a_sigkilled_bridge_leaves_no_private_prompt_folder_of_a_pooled_process(
    open_bridge: OpenBridge, tmp_path: Path
) -> None:
    records = tmp_path / "codex-records"
    records.mkdir()
    fake_codex = Path(__file__).with_name("fake_codex.py")
    argv = [*FAKE_PYTHON, str(fake_codex), "--record-dir", str(records)]
    override = {"mode": "override", "content": [{"type": "text", "text": "persona"}]}
    with trio.fail_after(30):
        async with open_bridge(agent_argv=argv, config={"adapter": "codex"}) as bridge:
            await bridge.request(0, "initialize", {"protocolVersion": 1})
            await bridge.receive()
            params = {"cwd": str(tmp_path), "mcpServers": [], "systemPrompt": override}
            await bridge.request(1, "session/new", params)
            assert "result" in await bridge.receive()
            firsts = [json.loads(p.read_bytes().split(b"\n", 1)[0]) for p in records.iterdir()]
            (setting,) = [
                first["overrides"]["model_instructions_file"]
                for first in firsts
                if "model_instructions_file" in first["overrides"]
            ]
            instructions = Path(json.loads(setting))  # a TOML string, here as JSON writes it
            assert instructions.read_text() == "persona"
            bridge.process.kill()
            await bridge.wait()
            deadline = trio.current_time() + NO_SURVIVOR_AFTER
            while instructions.parent.exists() and trio.current_time() < deadline:
                await trio.sleep(0.05)
            assert not instructions.parent.exists()
