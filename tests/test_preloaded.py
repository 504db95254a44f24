"""A bridge forked from the preloaded server (``tests/preloaded.py``) behaves as
``python -m acp_bridge`` started anew: the same output, exit status and environment, and
a signal ends it as it ends that one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from preloaded import SOCKET, Preloader, start_bridge

# Command lines that end on their own, each through another path of the entry point.
COMMAND_LINES = [
    ["--version"],
    ["--bogus"],
    ["--log-level", "bogus", "--", "true"],
    ["--state", ":memory:", "--", "/nonexistent/agent"],
    ["check", "--help"],
]


async def read_all(stream: trio.abc.ReceiveStream) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some():
        data += chunk
    return bytes(data)


async def run_forked(args: list[str], env: dict[str, str], stderr_path: Path) -> tuple[int, bytes]:
    with stderr_path.open("wb") as stderr:
        process = await start_bridge(args, env=env, stderr=stderr)
    assert process.stdin is not None and process.stdout is not None
    await process.stdin.aclose()
    output = await read_all(process.stdout)
    return await process.wait(), output


@pytest.mark.parametrize("args", COMMAND_LINES, ids=" ".join)
async def test_a_forked_bridge_says_and_ends_as_a_started_one(
    tmp_path: Path, bridge_env: dict[str, str], args: list[str]
) -> None:
    with trio.fail_after(30):
        status, output = await run_forked(args, bridge_env, tmp_path / "forked")
    started = subprocess.run(
        [sys.executable, "-m", "acp_bridge", *args],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=bridge_env,
        timeout=30,
    )
    assert (status, output) == (started.returncode, started.stdout)
    assert (tmp_path / "forked").read_bytes() == started.stderr


async def test_a_forked_bridge_runs_in_the_folder_and_environment_asked_for(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    # The agent, started by the bridge with the bridge's environment, writes both down.
    agent = [sys.executable, "-S", "-c", "import os; print(os.getcwd(), os.environ['MARK'])"]
    env = {**bridge_env, "MARK": "forked-bridge"}
    folder = tmp_path / "here"
    folder.mkdir()
    with trio.fail_after(30), (tmp_path / "stderr").open("wb") as stderr:
        process = await start_bridge(
            ["--state", ":memory:", "--log-level", "debug", "--", *agent],
            env=env,
            stderr=stderr,
            cwd=str(folder),
        )
        assert process.stdin is not None
        await process.stdin.aclose()
        await process.wait()
    # The agent's stdout is the bridge's pipe from it: not JSON-RPC, so logged and dropped.
    assert f"{folder} forked-bridge" in (tmp_path / "stderr").read_text()


async def test_a_signal_ends_a_forked_bridge_and_its_status_says_so(
    tmp_path: Path, bridge_env: dict[str, str]
) -> None:
    agent = [sys.executable, "-S", "-c", "import time; time.sleep(60)"]
    with trio.fail_after(30), (tmp_path / "stderr").open("wb") as stderr:
        process = await start_bridge(
            ["--state", ":memory:", "--", *agent], env=bridge_env, stderr=stderr
        )
        process.kill()
        assert await process.wait() == -signal.SIGKILL
        process.kill()  # already reaped: nothing is signalled
    assert process.pid != os.getpid()


def test_a_server_whose_test_session_was_killed_leaves_no_folder_behind() -> None:
    # A killed test session never calls close(): the server's stdin reaching its end is
    # all that is left of it.
    server = Preloader.launch()
    assert (server.folder / SOCKET).is_socket()
    stdin = server.process.stdin
    assert stdin is not None
    stdin.close()
    assert server.process.wait(timeout=30) == 0
    assert not server.folder.exists()
