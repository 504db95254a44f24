"""Every way a bridge run ends leaves no process behind, and the exit status is right."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import OpenBridge, RunningBridge, pid_alive

FAST = {"shutdown_grace": 0.3}


async def ready(bridge: RunningBridge) -> None:
    """One round trip: the agent (and its grandchild) are up and pids are written."""
    await bridge.request("ready", "_test/echo", {})
    await bridge.response_to("ready")


def assert_none_survive(bridge: RunningBridge, expected: int) -> None:
    pids = bridge.pids()
    assert len(pids) == expected
    assert [pid for pid in pids if pid_alive(pid)] == []


async def agent_exits_with_a_request_pending(bridge: RunningBridge, status: int) -> list[Any]:
    """Request 1 hangs, request 2 makes the agent exit with ``status``; the bridge exits with
    it. Every message the client got before EOF."""
    await ready(bridge)
    await bridge.request(1, "_test/hang")
    await bridge.request(2, "_test/exit", {"code": status})
    lines = [json.loads(line) for line in await bridge.read_to_eof()]
    assert await bridge.wait() == status
    return lines


async def test_client_eof_exit_status_follows_the_agent(open_bridge: OpenBridge) -> None:
    with trio.fail_after(30):
        async with open_bridge("--eof-exit-code", "7") as bridge:
            await ready(bridge)
            await bridge.close_stdin()
            assert await bridge.read_to_eof() == []
            assert await bridge.wait() == 7
    assert_none_survive(bridge, 1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_signal_to_bridge_stops_agent_and_grandchild(
    open_bridge: OpenBridge, signum: int
) -> None:
    with trio.fail_after(30):
        async with open_bridge("--ignore-eof", config=FAST, grandchild=True) as bridge:
            await ready(bridge)
            await bridge.request("pending", "_test/hang")
            bridge.process.send_signal(signum)
            await bridge.read_to_eof()
            assert await bridge.wait() == 128 + signum
    assert_none_survive(bridge, 2)


async def test_agent_crash_mid_request_fails_it_and_bridge_exits_with_agent_status(
    open_bridge: OpenBridge,
) -> None:
    with trio.fail_after(30):
        async with open_bridge() as bridge:
            lines = await agent_exits_with_a_request_pending(bridge, 9)
    assert sorted(m["id"] for m in lines) == [1, 2]
    assert {m["error"]["code"] for m in lines} == {-32603}
    assert_none_survive(bridge, 1)


async def test_agent_crash_is_noticed_while_a_grandchild_holds_its_stdout(
    open_bridge: OpenBridge,
) -> None:
    with trio.fail_after(30):
        async with open_bridge(config=FAST, grandchild=True) as bridge:
            lines = await agent_exits_with_a_request_pending(bridge, 4)
    assert sorted(m["id"] for m in lines) == [1, 2]
    assert all("exited with status 4" in m["error"]["message"] for m in lines)
    assert_none_survive(bridge, 2)


async def test_agent_ignoring_eof_is_killed_after_grace(open_bridge: OpenBridge) -> None:
    with trio.fail_after(30):
        async with open_bridge("--ignore-eof", "--ignore-term", config=FAST) as bridge:
            await ready(bridge)
            await bridge.close_stdin()
            await bridge.read_to_eof()
            await bridge.wait()
    assert "ignored SIGTERM; sending SIGKILL" in bridge.stderr()
    assert_none_survive(bridge, 1)


async def test_grandchild_ignoring_eof_and_sigterm_is_killed(open_bridge: OpenBridge) -> None:
    with trio.fail_after(30):
        async with open_bridge(config=FAST, grandchild=True) as bridge:
            await ready(bridge)
            await bridge.close_stdin()
            await bridge.read_to_eof()
            assert await bridge.wait() == 0
    assert_none_survive(bridge, 2)


async def test_agent_stderr_reaches_bridge_stderr(open_bridge: OpenBridge) -> None:
    agent = ["python3", "-c", "import sys; sys.stderr.write('agent says hello\\n')"]
    with trio.fail_after(30):
        async with open_bridge(agent_argv=agent) as bridge:
            assert await bridge.read_to_eof() == []
            assert await bridge.wait() == 0
    assert "agent says hello" in bridge.stderr()


PRINTING_ADAPTER = """
import os
import sys

from acp_bridge.adapter import Adapter, Delivery

print("stray print while importing the adapter")
os.write(1, b"stray write to fd 1 while importing\\n")


class PrintingAdapter(Adapter):
    name = "printing"

    def delivery(self, initialize_result):
        print("stray print during initialize")
        sys.stdout.write("stray stdout write\\n")
        os.write(1, b"stray fd 1 write\\n")
        return None
"""


async def test_stray_output_inside_the_bridge_never_reaches_the_acp_stream(
    open_bridge: OpenBridge, tmp_path: Path
) -> None:
    folder = tmp_path / "adapters"
    folder.mkdir()
    (folder / "printing.py").write_text(PRINTING_ADAPTER)
    config = {"adapter_paths": [str(folder)], "adapter": "printing"}
    with trio.fail_after(30):
        async with open_bridge(config=config) as bridge:
            await bridge.request(0, "initialize", {"protocolVersion": 1})
            await bridge.response_to(0)
            await ready(bridge)
            await bridge.close_stdin()
            await bridge.read_to_eof()
            assert await bridge.wait() == 0
    for line in bytes(bridge.received).splitlines():
        json.loads(line)
    assert b"stray" not in bridge.received
    assert bridge.stderr().count("stray") == 5
    assert os.path.exists(bridge.file("agent.pid"))


# Lines of 64 KiB to the agent: notifications, passed on as they come.
FLOOD_LINE = json.dumps({"jsonrpc": "2.0", "method": "_x/flood", "params": {"pad": "x" * 65500}})
FLOOD_BYTES = 2_100_000


@pytest.mark.parametrize("config_file", [True, False], ids=["runtime", "early-start"])
async def test_a_stopped_agent_with_a_full_pipe_does_not_keep_the_bridge_after_the_client_left(
    open_bridge: OpenBridge, config_file: bool
) -> None:
    # The agent is stopped (a hung agent looks the same): the bridge's writes to it block
    # once its pipe is full. The client writes about 2.1 MB, then closes its end.
    with trio.fail_after(30):
        async with open_bridge(config_file=config_file, grandchild=True) as bridge:
            await ready(bridge)
            agent = bridge.pids()[0]
            os.kill(agent, signal.SIGSTOP)
            try:
                written = 0
                with trio.move_on_after(3):  # as much as the pipes take
                    while written < FLOOD_BYTES:
                        await bridge.send_line(FLOOD_LINE.encode())
                        written += len(FLOOD_LINE) + 1
                await bridge.close_stdin()
                assert written > 1 << 20  # more than the agent's pipe holds
                await bridge.read_to_eof()
                await bridge.wait()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent, signal.SIGCONT)
            assert_none_survive(bridge, 2)
