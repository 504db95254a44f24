"""The editor's end of a sidecar for the tests: ``acp-bridge connect`` as a subprocess.

Used by ``test_connect.py`` (a ``serve`` in this process) and by the container tests (a
``serve`` in a podman container). The token reaches ``connect`` the way an editor would
give it: through the environment, never argv. :func:`open_memory_connect` runs the same
relay (``run_connect``) in this process, for tests whose subject is what it relays.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from conftest import BridgeLines, RunningBridge, _reap
from preloaded import start_bridge

from acp_bridge.commands import connect
from acp_bridge.commands.serve import ListenAddress

INITIALIZE: dict[str, Any] = {
    "protocolVersion": 1,
    "clientCapabilities": {},
    "clientInfo": {"name": "sidecar-test", "version": "0"},
}


def system_prompt(text: str) -> dict[str, Any]:
    return {"mode": "append", "content": [{"type": "text", "text": text}]}


@asynccontextmanager
async def open_connect(
    address: str,
    directory: Path,
    *,
    token: str | None = None,
    args: Sequence[str] = (),
) -> AsyncIterator[RunningBridge]:
    """``acp-bridge connect ADDRESS`` with ``token`` in ``ACP_BRIDGE_TOKEN`` (or none)."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "ACP_BRIDGE_TOKEN"}
    if token is not None:
        env["ACP_BRIDGE_TOKEN"] = token
    stderr_path = directory / "connect-stderr"
    with stderr_path.open("wb") as stderr:
        # Forked from a process that has imported the bridge: what comes after the
        # interpreter's start is the same.
        process = await start_bridge(["connect", *args, address], env=env, stderr=stderr)
    editor = RunningBridge(directory, process=process, stderr_path=stderr_path)
    try:
        yield editor
    finally:
        with trio.CancelScope(shield=True):
            await _reap(editor)


async def wait_listening(path: Path) -> None:
    """Wait until a ``serve`` started as a process accepts connections on the unix socket
    ``path``. The file exists once the socket is bound, a moment before it listens: a
    connection refused in between is tried again (and one accepted is closed at once, as a
    probe that starts no agent)."""
    while True:
        try:
            stream = await trio.open_unix_socket(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            await trio.sleep(0.05)
            continue
        await stream.aclose()
        return


@dataclass
class MemoryConnect(BridgeLines):
    """``connect``'s relay in a task of this process, spoken to over in-memory streams;
    what it logs goes to ``connect-stderr`` in its folder, in the command's format."""

    to_connect: trio.abc.SendStream = field(kw_only=True)
    from_connect: trio.abc.ReceiveStream = field(kw_only=True)
    status: int | None = None
    finished: trio.Event = field(default_factory=trio.Event)

    @property
    def stdin(self) -> trio.abc.SendStream:
        return self.to_connect

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self.from_connect

    async def wait(self) -> int:
        await self.finished.wait()
        assert self.status is not None
        return self.status


@asynccontextmanager
async def open_memory_connect(
    address: str, directory: Path, *, token: str | None = None
) -> AsyncIterator[MemoryConnect]:
    """:func:`open_connect` without a process: ``token`` is what the command reads from
    ``ACP_BRIDGE_TOKEN``."""
    directory.mkdir(parents=True, exist_ok=True)
    to_connect, editor_in = trio.testing.memory_stream_one_way_pair()
    editor_out, from_connect = trio.testing.memory_stream_one_way_pair()
    editor = MemoryConnect(directory, to_connect=to_connect, from_connect=from_connect)
    handler = logging.FileHandler(directory / "connect-stderr")
    handler.setFormatter(logging.Formatter("acp-bridge connect: %(levelname)s %(message)s"))
    connect.log.addHandler(handler)

    async def run() -> None:
        try:
            editor.status = await connect.run_connect(
                ListenAddress.parse(address), token, editor_in, editor_out
            )
        finally:
            # As the process's streams close when it exits.
            await editor_out.aclose()
            await editor_in.aclose()
            editor.finished.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            yield editor
            nursery.cancel_scope.cancel()  # as _reap kills a process left running
    finally:
        connect.log.removeHandler(handler)
        handler.close()
