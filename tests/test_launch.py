"""Which command lines start the agent before the bridge has loaded (acp_bridge.commands.launch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_processes import live_processes
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


def test_the_watchdog_imports_no_typing_signal_or_contextlib() -> None:
    """``typing`` (with ``re``) costs milliseconds every agent start waits for: the
    watchdog, which starts up beside the agent, does not import it. It runs its module from
    the cached bytecode and imports no ``signal`` (``enum``) or ``contextlib`` either."""
    from acp_bridge.supervision import agent_watchdog

    watchdog = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", "-c", agent_watchdog.RUN, "0.5"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True,
    )  # fmt: skip
    imported = [line.rsplit("|", 1)[-1].strip() for line in watchdog.stderr.decode().splitlines()]
    left_out = {"typing", "enum", "signal", "contextlib", "functools"}
    assert left_out & set(imported) == set()
    # The list is read: the watchdog's module is in it, from the bridge's folder.
    assert "acp_bridge.supervision.agent_watchdog" in imported


def test_nothing_before_the_agents_spawn_imports_typing_or_subprocess() -> None:
    """Neither ``typing`` nor ``subprocess``, which brings ``signal``, ``enum``, ``locale``,
    ``re``, ``selectors`` and ``threading``: some 9 ms before every agent's spawn. The
    watchdog and the agent started early are spawned without it (``supervision/spawn.py``)."""
    root = str(Path(__file__).parent.parent)
    heavy = ["enum", "locale", "re", "selectors", "signal", "subprocess", "threading", "typing"]
    # -S: no site, whose import hooks (an editable install's) are not the bridge's.
    probe = f"import sys, acp_bridge.__main__; print([m for m in {heavy!r} if m in sys.modules])"
    early = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        capture_output=True, timeout=30, check=True, env={"PYTHONPATH": root},
    )  # fmt: skip
    assert early.stdout.decode().strip() == "[]"


# A command's end, as acp_bridge.__main__ ends it: buffered output, a function registered
# with atexit, then exit_now(CODE), and a line that must not run.
ENDS_WITH = """
import atexit, sys
from acp_bridge.__main__ import exit_now
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
sys.stdout.write("buffered")
exit_now({code!r})
print("not reached")
"""


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [
        (None, 0, ""),
        (0, 0, ""),
        (3, 3, ""),
        ("The database is locked.", 1, "The database is locked.\n"),
    ],
)
def test_a_command_ends_as_its_system_exit_says_without_the_teardown(
    code: object, status: int, said: str
) -> None:
    # The process ends without the interpreter's teardown; what that exit would still do
    # is done: the status and message SystemExit(code) gives, atexit's functions (the early
    # start's clean-up among them), and what stdout and stderr hold, written.
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", ENDS_WITH.format(code=code)],
        capture_output=True, timeout=30, check=False, env=buffered,
    )  # fmt: skip
    assert (done.returncode, done.stdout.decode(), done.stderr.decode()) == (
        status,
        "buffered",
        said + "atexit ran\n",
    )


# A command's watchdogs at its end: one released (its agent stopped), one still held (an
# agent the command did not stop: its group is a `sleep` in a session of its own).
WATCHDOGS_AT_THE_END = """
import os, subprocess
from acp_bridge.__main__ import exit_now
from acp_bridge.supervision.agent_watchdog import Watchdog
released, held = Watchdog.start(), Watchdog.start()
Watchdog.prepare()  # one started ahead, that no start took
agent = subprocess.Popen(
    ["sleep", "30"], env=held.mark(os.environ), start_new_session=True
)
held.watch(agent.pid)
released.release()
exit_now(0)
"""


def test_no_watchdog_or_agent_of_a_command_outlives_its_process(tmp_path: Path) -> None:
    # The watchdogs run in sessions of their own, and act when told or when their pipe
    # closes: the command's end waits for them (and for what they end), so that right
    # after the command's process has ended none of them, and no agent, is left. (Its
    # output goes to a file: a pipe would be read until they too had closed it.)
    name, value = "ACP_BRIDGE_TEST_END", os.urandom(8).hex()
    with (tmp_path / "stderr").open("wb") as stderr:
        status = subprocess.run(
            [sys.executable, "-c", WATCHDOGS_AT_THE_END], stdout=subprocess.DEVNULL,
            stderr=stderr, timeout=30, check=False, env={**os.environ, name: value},
        ).returncode  # fmt: skip
    left = live_processes(f"{name}={value}")
    for pid in left:  # not to leave them to the rest of the suite
        os.kill(pid, 9)
    assert (status, (tmp_path / "stderr").read_text(), left) == (0, "", [])
