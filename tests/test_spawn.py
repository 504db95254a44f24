"""``supervision/spawn.py``: a child started with ``posix_spawn`` gets what
``subprocess.Popen`` gave the watchdog and the agent started early (pipes, its own
session, default SIGPIPE, no inherited descriptor), and its status reads as Popen's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from acp_bridge.supervision import spawn


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def run_shell(script: str, stdin: int = spawn.PIPE) -> tuple[bytes, int]:
    """What ``sh -c script`` wrote, and its status."""
    child = spawn.spawn(["sh", "-c", script], stdin=stdin)  # sh: found in PATH
    assert child.stdout is not None
    if child.stdin is not None:
        os.close(child.stdin)
    return read_all(child.stdout), child.wait()


def test_the_pipes_carry_the_childs_stdin_and_stdout() -> None:
    child = spawn.spawn([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"])
    assert child.stdin is not None and child.stdout is not None
    os.write(child.stdin, b"hello")
    os.close(child.stdin)
    assert read_all(child.stdout) == b"HELLO\n"
    assert child.wait() == 0
    assert child.returncode == 0


def test_exit_statuses_read_as_popen_has_them() -> None:
    assert run_shell("exit 3") == (b"", 3)
    child = spawn.spawn(["sleep", "30"], stdin=spawn.DEVNULL, stdout=spawn.DEVNULL)
    assert child.poll() is None
    with pytest.raises(TimeoutError):
        child.wait(0.05)
    child.kill()
    assert child.wait() == -signal.SIGKILL
    child.kill()  # reaped: its pid is not signalled again
    assert child.poll() == -signal.SIGKILL


def test_the_child_leads_a_session_of_its_own() -> None:
    child = spawn.spawn(["sleep", "30"], stdin=spawn.DEVNULL, stdout=spawn.DEVNULL)
    try:
        assert os.getsid(child.pid) == child.pid
        assert os.getpgid(child.pid) == child.pid
        assert os.getsid(child.pid) != os.getsid(0)
    finally:
        child.kill()
        child.wait()


def test_sigpipe_and_sigxfsz_are_back_to_their_defaults() -> None:
    # Python ignores both in the bridge; a child must not inherit that.
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    out, status = run_shell("grep SigIgn /proc/self/status")
    ignored = int(out.split()[1], 16)
    assert status == 0
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


def test_no_descriptor_but_the_standard_ones_reaches_the_child(tmp_path: Path) -> None:
    # As one the bridge's own parent left open without close-on-exec.
    inherited = os.open(tmp_path / "inherited", os.O_CREAT | os.O_WRONLY)
    os.set_inheritable(inherited, True)
    try:
        out, _ = run_shell("ls /proc/$$/fd")
        assert sorted(int(fd) for fd in out.split()) == [0, 1, 2]
        assert not os.get_inheritable(inherited)
    finally:
        os.close(inherited)


def test_devnull_and_a_given_descriptor(tmp_path: Path) -> None:
    out, _ = run_shell("readlink /proc/$$/fd/0", stdin=spawn.DEVNULL)
    assert out == b"/dev/null\n"
    target = tmp_path / "out"
    fd = os.open(target, os.O_CREAT | os.O_WRONLY)
    try:
        child = spawn.spawn(["sh", "-c", "echo given"], stdin=spawn.DEVNULL, stdout=fd)
        assert child.stdin is None and child.stdout is None
        assert child.wait() == 0
    finally:
        os.close(fd)
    assert target.read_bytes() == b"given\n"


def test_the_environment_given_is_the_childs() -> None:
    child = spawn.spawn(
        ["/bin/sh", "-c", "echo $SPAWN_TEST"], env={**os.environ, "SPAWN_TEST": "marked"}
    )
    assert child.stdin is not None and child.stdout is not None
    os.close(child.stdin)
    assert read_all(child.stdout) == b"marked\n"
    assert child.wait() == 0


def test_a_command_that_cannot_start_raises_and_leaves_no_descriptor(tmp_path: Path) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        spawn.spawn([str(tmp_path / "missing")])
    with pytest.raises(FileNotFoundError):
        spawn.spawn(["acp-bridge-no-such-command"])
    not_a_program = tmp_path / "text"
    not_a_program.write_text("not a program\n")
    not_a_program.chmod(0o755)
    with pytest.raises(OSError):
        spawn.spawn([str(not_a_program)])
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_pipes_work_where_the_bridge_was_started_without_stdin_and_stdout() -> None:
    """The pipes' ends land on descriptors 0 and 1 then; they are moved above stderr before
    the spawn, as Popen moves them."""
    root = str(Path(__file__).parent.parent)
    script = (
        "import os, sys\n"
        "from acp_bridge.supervision import spawn\n"
        "child = spawn.spawn(['sh', '-c', 'tr a-z A-Z'])\n"
        "assert min(child.stdin, child.stdout) <= 1, (child.stdin, child.stdout)\n"
        "os.write(child.stdin, b'piped'); os.close(child.stdin)\n"
        "out = os.read(child.stdout, 100)\n"
        "sys.stderr.write(repr((out, child.wait())))\n"
    )
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -c "$1" <&- >&-', sys.executable, script],
        check=False, capture_output=True, timeout=30, env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert done.stderr.decode() == "(b'PIPED', 0)"
