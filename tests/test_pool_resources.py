"""What a long-running pooled bridge holds: file descriptors and bookkeeping stay flat
however many pooled processes die or are stopped.

The bridge runs in this process in front of ``tests/fake_codex.py`` (real subprocesses,
the codex adapter's pool), so ``/proc/self/fd`` counts what the bridge itself holds.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from memory_agent import FAKE_PYTHON

from acp_bridge.adapter import AgentLink
from acp_bridge.pool import PoolAdapter
from acp_bridge.runtime.agents import WATCHDOG_AHEAD_AFTER
from acp_bridge.runtime.client import AcpClient
from acp_bridge.runtime.embedded import open_embedded_bridge
from acp_bridge.runtime.relay import AgentConnection, Bridge, BridgeOptions
from acp_bridge.state.store import SessionStore
from acp_bridge.supervision import agent_watchdog
from acp_bridge.supervision.agent_process import AgentProcess
from acp_bridge.supervision.agent_watchdog import Watchdog

FAKE_CODEX = Path(__file__).with_name("fake_codex.py")
CYCLES = 12
TIMEOUT = 60.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def append(text: str) -> dict[str, Any]:
    return {"mode": "append", "content": [{"type": "text", "text": text}]}


@asynccontextmanager
async def pooled_bridge(
    tmp_path: Path, **pool_options: Any
) -> AsyncIterator[tuple[AcpClient, Bridge]]:
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    options = BridgeOptions(
        agent_argv=[*FAKE_PYTHON, str(FAKE_CODEX), "--record-dir", str(records)],
        shutdown_grace=0.3,
        adapter_options={"codex": pool_options},
    )
    async with open_embedded_bridge(options, SessionStore(":memory:")) as embedded:
        await embedded.client.request("initialize", {"protocolVersion": 1})
        yield embedded.client, embedded.bridge


async def new_session(client: AcpClient, cwd: Path, text: str) -> str:
    params = {"cwd": str(cwd), "mcpServers": [], "systemPrompt": append(text)}
    result = await client.request("session/new", params)
    session_id: str = result["sessionId"]
    return session_id


def holder(bridge: Bridge, session_id: str) -> AgentConnection:
    assert isinstance(bridge.adapter, PoolAdapter)
    link: AgentLink = bridge.adapter.home[session_id].link
    assert isinstance(link, AgentConnection)
    return link


async def a_process_dies(client: AcpClient, bridge: Bridge, cwd: Path, n: int) -> None:
    link = holder(bridge, await new_session(client, cwd, f"prompt {n}"))
    os.kill(link.process.pid, signal.SIGKILL)
    await link.done.wait()


async def a_process_is_stopped(client: AcpClient, bridge: Bridge, cwd: Path, n: int) -> None:
    session_id = await new_session(client, cwd, f"prompt {n}")
    link = holder(bridge, session_id)
    await client.request("session/close", {"sessionId": session_id})
    await link.done.wait()  # idle_timeout 0: the pool stops it at once


Cycle = Callable[[AcpClient, Bridge, Path, int], Awaitable[None]]


@pytest.mark.parametrize(
    ("pool_options", "cycle"),
    [({}, a_process_dies), ({"idle_timeout": 0}, a_process_is_stopped)],
    ids=["that-die", "that-are-stopped"],
)
async def test_pooled_processes_leave_no_descriptor_behind(
    tmp_path: Path, pool_options: dict[str, Any], cycle: Cycle
) -> None:
    with trio.fail_after(TIMEOUT):
        async with pooled_bridge(tmp_path, **pool_options) as (client, bridge):
            await cycle(client, bridge, tmp_path, 0)  # whatever the first one opens
            before = open_fds()
            for n in range(1, CYCLES + 1):
                await cycle(client, bridge, tmp_path, n)
            after = open_fds()
            processes = len(bridge.processes)
    assert after - before < CYCLES // 4, (before, after)
    assert processes == 1


@contextmanager
def descriptor_limit(headroom: int) -> Iterator[None]:
    """Lower this process's soft limit on open files to what it holds plus ``headroom``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds() + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_new_prompts_keep_working_at_a_low_descriptor_limit(tmp_path: Path) -> None:
    # Issue 19.9 met a limit after 36 deaths ("The bridge failed to handle session/new."):
    # each death leaked 3 pipes. 40 deaths under a limit 48 above what the bridge holds
    # once running: room for the live processes, none for a leak.
    with trio.fail_after(TIMEOUT * 2):
        async with pooled_bridge(tmp_path) as (client, bridge):
            await a_process_dies(client, bridge, tmp_path, 0)
            with descriptor_limit(48):
                for n in range(1, 41):
                    await a_process_dies(client, bridge, tmp_path, n)
                session_id = await new_session(client, tmp_path, "after 40 deaths")
                assert holder(bridge, session_id).process.returncode is None


def watchdog_of(link: AgentConnection) -> Watchdog | None:
    assert isinstance(link.process, AgentProcess)
    return link.process._watchdog


async def ready_watchdog(seconds: float) -> Watchdog | None:
    """The watchdog started ahead for the next process, once there is one (or None)."""
    with trio.move_on_after(seconds):
        while not agent_watchdog._ready:
            await trio.sleep(0.02)
        ((owner, watchdog),) = agent_watchdog._ready.values()
        assert owner == os.getpid()
        return watchdog
    return None


async def test_the_next_pooled_process_takes_a_watchdog_started_ahead(tmp_path: Path) -> None:
    # Each pooled process has a watchdog of its own, a process whose start-up runs beside
    # the agent's: the next one's is started after the call that started a process.
    Watchdog.cancel_prepared()  # none left by another test
    with trio.fail_after(TIMEOUT):
        async with pooled_bridge(tmp_path) as (client, bridge):
            # The primary alone (a bridge in front of one process) starts none ahead.
            assert await ready_watchdog(WATCHDOG_AHEAD_AFTER + 0.5) is None
            first = holder(bridge, await new_session(client, tmp_path, "prompt 1"))
            ahead = await ready_watchdog(WATCHDOG_AHEAD_AFTER + 5)
            assert ahead is not None and ahead is not watchdog_of(first)
            second = holder(bridge, await new_session(client, tmp_path, "prompt 2"))
            assert watchdog_of(second) is ahead
            assert await ready_watchdog(WATCHDOG_AHEAD_AFTER + 5) is not None
    # The connection's end ends the one started ahead, which no process took.
    assert not agent_watchdog._ready
